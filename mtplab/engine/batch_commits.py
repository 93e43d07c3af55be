"""Commit strategies row by row: each row of the batch (a batch of one included) commits its own count c_b = n_b + 1
of the verify's tokens: commit(verify outputs, counts [B], the rows to commit, the verify's ids [B, M], each row's
start [B]).

- select: row b replays its own c_b transitions and rebuilds its conv carry from its own c_b inputs (or replays its
  LinearAttention inputs through the op). No forward; the same cost whatever the counts.
- per-position: row b takes the verify's state after its own c_b tokens, and rebuilds its conv carry.
- readvance-m1: restore every row, then max_b c_b forwards at [B, 1]; a row whose c_b tokens are in rides
  along (its last token repeated, its length held) and its state rows are put back after each further
  forward. Cost: the longest row's count, not the mean.
- readvance-batched: restore, then one [B, c] forward per distinct count c among the rows; the rows with
  another count are put back after it. Cost: one forward per distinct count (1 at B = 1).

A strategy of the user's own commits one sequence (CommitStrategy.prepare): at batch 1 its commit takes the row's
kept tokens; batch > 1 refuses it (mtplab.engine.fit.batch_commit_problem).
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
    if not engine.desc.target.position_states:
        raise ValueError("commit='per-position' needs the verify graph that writes each position's state: this "
                         f"engine was built for commit={engine.spec.commit!r} (build one with commit='per-position')")
    return _each_row(engine, position_update(engine.desc))


def _each_row(engine, apply: Callable) -> Callable:
    st = engine.state

    def commit(ver: dict, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        for b in rows:
            apply(st, ver, int(counts[b]), int(b))

    return commit


def _restored(engine, counts: np.ndarray, rows) -> np.ndarray:
    """A re-advance's start: the state from before the verify put back; each row's count, 0 for rows not listed."""
    engine.restore_state()
    if len(rows) == engine.batch:
        return counts
    listed = np.zeros(engine.batch, dtype=np.int64)
    listed[rows] = counts[rows]
    return listed


def readvance_m1_rows(engine) -> Callable:
    """readvance-m1 at batch B: restore, then max count forwards at [B, 1]; rows with fewer ride along."""
    st, keeper, every = engine.state, RowKeeper(engine, "batch-keep"), np.arange(engine.batch)

    def commit(ver: dict, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        counts = _restored(engine, counts, rows)
        for j in range(int(counts.max(initial=0))):
            done = np.flatnonzero(counts <= j)
            if done.size:  # rows whose tokens are all in: their state from now on, put back after the forward
                keeper.keep(np.flatnonzero(counts == j))
            st.lengths[...] = start + np.minimum(j, counts)
            engine.forward(Slot.PRIMARY, ids[every, np.minimum(j, np.maximum(counts - 1, 0))][:, None])
            if done.size:
                keeper.put_back(done)

    return commit


def readvance_batched_rows(engine) -> Callable:
    """readvance-batched at batch B: restore, then one [B, c] forward per distinct count c; other rows put back."""
    st, keeper, B = engine.state, RowKeeper(engine, "batch-keep"), engine.batch

    def commit(ver: dict, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        counts = _restored(engine, counts, rows)
        held = np.zeros(B, dtype=np.int64)  # tokens each row holds so far
        for c in sorted(set(counts[counts > 0].tolist())):
            others = np.flatnonzero(counts != c)
            if others.size:
                keeper.keep(others)
            st.lengths[...] = start + held
            engine.forward(Slot.PRIMARY, ids[:, :c])
            if others.size:
                keeper.put_back(others)
            held[counts == c] = c

    return commit


def one_sequence_rows(engine) -> Callable:
    """A strategy's own commit (CommitStrategy.prepare: one sequence's consumed tokens from start), at batch 1."""
    one = engine.commit_strategy.prepare(engine)

    def commit(ver: dict, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        if len(rows):
            one(ver, ids[0, : int(counts[0])].tolist(), int(start[0]))

    return commit


BATCH_COMMITS = {"select": select_rows, "per-position": per_position_rows, "readvance-m1": readvance_m1_rows,
                 "readvance-batched": readvance_batched_rows}


def commit_rows(engine) -> Callable:
    """The engine's commit strategy row by row (its form here, else its own commit at batch 1)."""
    return BATCH_COMMITS.get(engine.commit_strategy.name, one_sequence_rows)(engine)
