"""One plan replayed many times in a row, the host's work between two runs in one compiled call.

Greedy's decodes and the MTP head's chained drafts replay one captured plan, each run fed the argmax of the run
before. Between two runs the host reads that token from the logits, copies what must follow the run (greedy's
present states into the committed ones, the head's hidden state into its next feed), writes the token and the next
length into the feeds, and passes the replay check (every held array's dtype and shape read, the feeds staged into
the plan's buffers). In Python that is a dozen calls, 8 to 12 us a run: on the builder fixture's 130 us forward,
greedy ran at 0.88-0.92x onnxruntime-genai's C++ loop so, and runs at its bare plan's rate compiled.
mtplab.runtime.held_meta.advance does all of it in one compiled call (it lives there, beside the reads it inlines)
over the replay check's table and a program of rows built once per loop (`program`); `chain` runs the loop.

The program names every array by its row in the table, so each address is read from the live object at each
call, after the table's dtype and shape reads passed. It is built only where it writes what Python would: the
token as an int64 id, the lengths as length_feeds writes them for one token (checked on copies when built), a
float32 logits row's argmax as numpy's (the first largest value, the first NaN). Anything else (another dtype, a
feed it does not know), or the table finding a difference at a call (a dtype or shape, an array it reads no longer
contiguous, one it writes read-only), and the caller's Python loop runs, deciding as before.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import is_

import numpy as np

from mtplab.model.description import GraphIO, length_feeds
from mtplab.runtime import held_meta
from mtplab.runtime.held_meta import AFTER, ARGMAX, BEFORE, COPY, MASK, POSITIONS, SEQLENS, TOKEN

STAGED = held_meta.STAGED
_LENGTH_OPS = {"position_ids": POSITIONS, "attention_mask": MASK, "seqlens_k": SEQLENS}
_CONSTANTS = ("total_sequence_length", "query_seqlens", "capture_count")  # length_feeds's feeds that never change


def program(check, feeds: dict, io: GraphIO, total: int, logits, copies: list[tuple]) -> np.ndarray | None:
    """A loop's program over a replay check's table whose first rows hold these very feeds (held_program asks
    first), or None where it cannot write what Python would: after a run, each (source, target) of `copies` (arrays
    the check holds, of one dtype and shape: a feed may be a target) and the token, the argmax of `logits` (float32,
    [1, 1, V]); before the next, the token into io's ids and the lengths as length_feeds(io, length, 1, total)
    writes them. One token a run, batch 1."""
    if held_meta.MISSING is not None or check.table is None or not held_meta.ready():
        return None
    rows = {id(a): r for r, a in enumerate(list(check.seen) + list(check.arrays))}
    if id(logits) not in rows or logits.dtype != np.float32 or logits.shape[:2] != (1, 1):
        return None
    ops = []
    for source, target in copies:
        if id(source) not in rows or id(target) not in rows or source.dtype != target.dtype or (
                source.shape != target.shape) or not (
                source.flags.c_contiguous and target.flags.c_contiguous):
            return None
        ops.append((COPY, rows[id(source)], rows[id(target)], source.nbytes))
    ops.append((ARGMAX, rows[id(logits)], logits.size, 0))
    written = {id(target) for _, target in copies}
    for name, value in feeds.items():
        op = TOKEN if name == io.input_ids else _LENGTH_OPS.get(name)
        if op is None and (id(value) in written or name in _CONSTANTS and not value.flags.writeable):
            continue
        wanted = np.int32 if op == SEQLENS else np.int64
        if op is None or id(value) not in rows or value.dtype != wanted or not value.flags.c_contiguous or (
                op == TOKEN and value.size != 1):
            return None
        ops.append((op, rows[id(value)], value.size, 0))
    ops = np.array(ops, dtype=np.int64)
    return ops if _writes_lengths(ops, feeds, io, total) else None


def held_program(cache: dict, name: str, check, feeds: dict, build: Callable[[], np.ndarray | None]):
    """build()'s program for the loop `name` on these feeds, made once while its replay check and the feeds' objects
    stay (kept in `cache`, None included: a loop that cannot be compiled is not tried again); None for now where the
    check's table holds other feed objects (a run on other feeds since: the Python path's next run readdresses it to
    these). The arrays a program names are the check's rows, so nothing else can move under it."""
    seen = check.seen
    if len(seen) != len(feeds) or not all(map(is_, seen, feeds.values())):
        return None
    hit = cache.get(name)
    if hit is None or hit[0] is not check or hit[1] is not seen:  # the check readdresses into a new `seen` list
        hit = cache[name] = (check, seen, build())
    return hit[2]


def _writes_lengths(ops: np.ndarray, feeds: dict, io: GraphIO, total: int) -> bool:
    """Whether the program's writes before a run equal length_feeds's and the token's, on copies of the feeds."""
    copies = {name: np.array(value) for name, value in feeds.items()}
    arrays = list(copies.values())
    table = held_meta.snapshot(arrays)
    writes = ops[ops[:, 0] > ARGMAX]
    token = np.array([7], dtype=np.int64)
    for length in (0, total // 2, total - 1):
        expected = length_feeds(io, length, 1, total, {n: np.array(v) for n, v in copies.items()})
        if held_meta.advance(table, held_meta.copies([(0, 0, 0)]), writes, token, 0, length, BEFORE) != STAGED:
            return False
        for name, value in copies.items():
            want = token.reshape(value.shape) if name == io.input_ids else expected.get(name, feeds[name])
            if not np.array_equal(value, want):
                return False
    return True


def chain(table: np.ndarray, copies: np.ndarray, program: np.ndarray, out: np.ndarray, i: int, stop: int, length: int,
          replay: Callable[[], None]) -> tuple[int, int, int, bool]:
    """Runs while the table allows, from a state where out[i - 1] is the token to feed at `length` (the run before
    it finished, after-work done), until out[stop - 1] holds a token: (next i, length, runs made, pending). pending:
    the last run made still needs its after-work (its token into out[i]) from the caller's Python path."""
    step, first, last = held_meta.advance, i, stop - 1
    if i >= stop or step(table, copies, program, out, i - 1, length, BEFORE) != STAGED:
        return i, length, 0, False
    while i < last:  # a run's after-work and the next run's feeds, in one call
        replay()
        length += 1
        if step(table, copies, program, out, i, length, AFTER | BEFORE) != STAGED:
            return i, length, i - first + 1, True
        i += 1
    replay()  # the last run: its after-work only
    length += 1
    if step(table, copies, program, out, i, length, AFTER) != STAGED:
        return i, length, i - first + 1, True
    return stop, length, stop - first, False
