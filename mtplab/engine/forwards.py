"""A target forward of host tokens prepared once per slot, M and mode, and replayed with its feeds rewritten in
place: what every decode, verify and readvance of a batch-1 host run takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from mtplab.model.description import GraphIO
from mtplab.runtime.executor import Executor
from mtplab.runtime.state import TargetState


class PreparedForward(NamedTuple):
    """A target forward of M host tokens on one slot and mode, prepared for one state and executor while the state's
    buffers stay (`layout`): the feeds target_io keeps (the token ids and the length feeds rewritten per run), the
    slot's replayer on them (it decides as Executor.run does), the carries an in-place run makes, the counter's name."""

    state: TargetState
    executor: Executor
    layout: int
    io: GraphIO
    feeds: dict
    ids: np.ndarray
    M: int
    run: Callable[[], dict]
    carries: tuple
    key: str


def host_count(tokens, batch: int) -> int:
    """M for host tokens a forward writes straight into its token ids (an int, a list or tuple of ints at batch 1,
    a numpy array [M] at batch 1 or [batch, M]); 0 for anything else (a device array, a wrong count), which
    target_io takes or refuses."""
    kind = type(tokens)
    if kind is np.ndarray:
        if tokens.ndim == 2 and tokens.shape[0] == batch or tokens.ndim == 1 and batch == 1:
            return tokens.shape[-1]
        return 0
    if batch != 1:
        return 0
    if kind is list or kind is tuple:  # flat: a nested list is target_io's to read or refuse
        return len(tokens) if tokens and not any(map(_nested, tokens)) else 0
    return 1 if kind is int or isinstance(tokens, np.integer) else 0


def _nested(token) -> bool:
    return isinstance(token, (list, tuple, np.ndarray))
