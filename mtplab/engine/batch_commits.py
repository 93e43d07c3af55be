"""Commit strategies at batch B: each row commits its own count c_b = n_b + 1 of the verify's tokens.

- select: row b replays its own c_b transitions and rebuilds its conv carry from its own c_b inputs (or replays its
  LinearAttention inputs through the op). No forward; the same cost whatever the counts.
- per-position: row b takes the verify's state after its own c_b tokens, and rebuilds its conv carry.
- readvance-m1: restore every row, then max_b c_b forwards at [B, 1]; a row whose c_b tokens are in rides
  along (its last token repeated, its length held) and its state rows are put back after each further
  forward. Cost: the longest row's count, not the mean.
- readvance-batched: restore, then one [B, c] forward per distinct count c among the rows; the rows with
  another count are put back after it. Cost: one forward per distinct count (1 at B = 1).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mtplab.engine.commits import position_update, select_commit
from mtplab.runtime.executor import Slot


class RowKeeper:
    """Puts rows' recurrent state back: the rows a forward should not have advanced (rows riding along)."""

    def __init__(self, engine, name: str):
        self.live = engine.state.recurrent_arrays()
        self.kept = [engine.main.reserve(f"{name}.{i}", a.shape, a.dtype) for i, a in enumerate(self.live)]

    def keep(self, rows) -> None:
        for kept, live in zip(self.kept, self.live):
            kept[rows] = live[rows]

    def put_back(self, rows) -> None:
        for kept, live in zip(self.kept, self.live):
            live[rows] = kept[rows]


def select_rows(engine) -> Callable:
    """select at batch B: commit(ver, counts, rows) replays each listed row's own count (its transitions, or its
    LinearAttention inputs through the op)."""
    return _each_row(engine, select_commit(engine.desc, engine.device))


def per_position_rows(engine) -> Callable:
    """per-position at batch B: each listed row takes its own state after its own count."""
    return _each_row(engine, position_update(engine.desc))


def _each_row(engine, apply: Callable) -> Callable:
    st = engine.state

    def commit(ver: dict, counts: np.ndarray, rows) -> None:
        for b in rows:
            apply(st, ver, int(counts[b]), int(b))

    return commit


def _restored(engine, counts: np.ndarray, rows) -> np.ndarray:
    """A re-advance's start: the state from before the verify put back; each row's count, 0 for rows not listed."""
    engine.restore_state()
    return np.where(np.isin(np.arange(engine.batch), rows), counts, 0)


def readvance_m1_rows(engine) -> Callable:
    """readvance-m1 at batch B: restore, then max count forwards at [B, 1]; rows with fewer ride along."""
    st, keeper, B = engine.state, RowKeeper(engine, "batch-keep"), engine.batch

    def commit(ver: dict, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        counts = _restored(engine, counts, rows)
        for j in range(int(counts.max(initial=0))):
            done = counts <= j
            keeper.keep(np.flatnonzero(counts == j))  # rows whose tokens are all in: their state from now on
            st.lengths[...] = start + np.minimum(j, counts)
            tokens = ids[np.arange(B), np.minimum(j, np.maximum(counts - 1, 0))]
            engine.forward(Slot.PRIMARY, tokens[:, None])
            keeper.put_back(np.flatnonzero(done))

    return commit


def readvance_batched_rows(engine) -> Callable:
    """readvance-batched at batch B: restore, then one [B, c] forward per distinct count c; other rows put back."""
    st, keeper, B = engine.state, RowKeeper(engine, "batch-keep"), engine.batch

    def commit(ver: dict, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        counts = _restored(engine, counts, rows)
        held = np.zeros(B, dtype=np.int64)  # tokens each row holds so far
        for c in sorted(set(counts[counts > 0].tolist())):
            others = np.flatnonzero(counts != c)
            keeper.keep(others)
            st.lengths[...] = start + held
            engine.forward(Slot.PRIMARY, ids[:, :c])
            keeper.put_back(others)
            held[counts == c] = c

    return commit


BATCH_COMMITS = {"select": select_rows, "per-position": per_position_rows, "readvance-m1": readvance_m1_rows,
                 "readvance-batched": readvance_batched_rows}


def batch_commit(engine) -> Callable:
    """The run's commit strategy at batch B, prepared once per engine (ValueError for one with no batched form)."""
    name = engine.commit_strategy.name
    return engine.prepared(("batch", name, BATCH_COMMITS[name]), BATCH_COMMITS[name])
