"""held_meta: one compiled call reads many arrays' dtype and shape against a snapshot, and stages feeds."""

from __future__ import annotations

import numpy as np
import pytest

from mtplab.runtime import held_meta
from mtplab.runtime.held_meta import CHECKED, DIFFERENT, STAGED


def test_the_compiled_reads_agree_with_numpy_on_this_interpreter():
    assert held_meta._works()
    assert held_meta.snapshot([np.zeros(3)]) is not None


def test_a_snapshot_is_unchanged_until_an_array_is_reshaped_or_retyped_in_place():
    a, b = np.zeros((2, 3, 4), np.float32), np.zeros((), np.int64)
    table = held_meta.snapshot([a, b])
    assert held_meta.stage(table, held_meta.NONE) == CHECKED
    a.shape = (3, 2, 4)  # the same object, the same memory, another shape
    assert held_meta.stage(table, held_meta.NONE) == DIFFERENT
    a.shape = (2, 3, 4)
    a.dtype = np.int32  # the same object, another dtype of the same size
    assert held_meta.stage(table, held_meta.NONE) == DIFFERENT
    a.dtype = np.float32
    b.shape = (1,)
    assert held_meta.stage(table, held_meta.NONE) == DIFFERENT
    b.shape = ()
    assert held_meta.stage(table, held_meta.NONE) == CHECKED


def test_an_equal_dtype_of_another_object_is_a_difference_the_caller_decides():
    """The table compares dtype objects: an equal dtype made apart is reported, and Python's == then decides."""
    structured = np.dtype([("a", np.int32)])
    a = np.zeros(2, dtype=structured)
    table = held_meta.snapshot([a])
    a.dtype = np.dtype([("a", np.int32)])  # equal, not the same object
    assert a.dtype == structured and a.dtype is not structured
    assert held_meta.stage(table, held_meta.NONE) == DIFFERENT


def test_staging_copies_each_feed_into_its_buffer_and_declines_what_is_not_a_plain_copy():
    feed, buffer = np.arange(6, dtype=np.int64), np.zeros(6, dtype=np.int64)
    strided = np.arange(12, dtype=np.int64)[::2]
    readonly = np.zeros(6, dtype=np.int64)
    readonly.flags.writeable = False
    table = held_meta.snapshot([feed, buffer, strided, readonly])
    assert held_meta.stage(table, held_meta.copies([(0, 1, 48)])) == STAGED
    assert (buffer == feed).all()
    buffer[:] = 0
    assert held_meta.stage(table, held_meta.copies([(2, 1, 48)])) == CHECKED  # a strided source
    assert held_meta.stage(table, held_meta.copies([(0, 3, 48)])) == CHECKED  # a read-only target
    assert (buffer == 0).all() and (readonly == 0).all()
    feed.shape = (2, 3)
    assert held_meta.stage(table, held_meta.copies([(0, 1, 48)])) == DIFFERENT
    assert (buffer == 0).all()  # nothing is copied once anything differs


def test_readdressed_rows_read_the_new_objects_against_the_old_dtype_and_shape():
    old, new, other = np.zeros(4, np.int64), np.ones(4, np.int64), np.ones(5, np.int64)
    table = held_meta.snapshot([old])
    held_meta.readdress(table, [new])
    assert held_meta.stage(table, held_meta.NONE) == CHECKED
    held_meta.readdress(table, [other])
    assert held_meta.stage(table, held_meta.NONE) == DIFFERENT


@pytest.mark.parametrize("array", [np.zeros(3).view(np.recarray), [1, 2, 3], np.float32(1.0)])
def test_anything_not_a_plain_ndarray_keeps_the_python_reads(array):
    assert held_meta.snapshot([np.zeros(3), array]) is None


def test_where_the_layout_check_fails_no_table_is_made(monkeypatch):
    monkeypatch.setattr(held_meta, "WORKS", None)
    monkeypatch.setattr(held_meta, "_works", lambda: False)
    assert held_meta.snapshot([np.zeros(3)]) is None


@pytest.mark.parametrize("field, word", [("_DATA", 1), ("_ND", 4), ("_DIMS", 6), ("_DESCR", 6), ("_FLAGS", 7)])
def test_a_field_found_elsewhere_than_expected_stops_the_check_before_any_pointer_is_followed(monkeypatch, field,
                                                                                             word):
    """A layout with one field moved (as another interpreter's might) is found by plain word reads: the compiled
    reads, which would follow its pointers, never run."""
    calls = []
    monkeypatch.setattr(held_meta, field, word)
    monkeypatch.setattr(held_meta, "_stage", lambda *args: calls.append(args) or held_meta.CHECKED)
    assert not held_meta._works()
    assert calls == []


def test_compiled_reads_that_cannot_load_are_told_and_left_off(monkeypatch):
    def damaged(*args):
        raise EOFError("Ran out of input")  # what numba raises on a truncated cache file

    monkeypatch.setattr(held_meta, "_stage", damaged)
    with pytest.warns(RuntimeWarning, match="compiled reads are off in this process .*EOFError.*numba cache"):
        assert not held_meta._works()


def test_without_numba_the_check_reads_in_python_and_says_so(monkeypatch):
    monkeypatch.setattr(held_meta, "WORKS", None)
    monkeypatch.setattr(held_meta, "MISSING", ImportError("Numba needs NumPy 2.3 or less"))
    with pytest.warns(RuntimeWarning, match="numba does not load .*NumPy 2.3"):
        assert held_meta.snapshot([np.zeros(3)]) is None
    assert held_meta.snapshot([np.zeros(3)]) is None  # told once


def _python_verdict(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """greedy-match's accept and the verify's packing, in Python: [n, first, d1..dk, t0..tk]."""
    from mtplab.engine.acceptance import GREEDY_MATCH

    n, targets = GREEDY_MATCH.accept(np, ids[1:], logits)
    return np.concatenate([[n], ids, targets]).astype(np.int64)


@pytest.mark.parametrize("case", ["random", "tie", "nan", "nan first", "all -inf"])
def test_the_compiled_verdict_is_greedy_matchs_at_every_count_kept(case):
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((5, 97)).astype(np.float32)
    if case == "tie":
        logits[:, [10, 50]] = logits.max() + 1
    elif case == "nan":
        logits[2, [30, 80]] = np.nan
    elif case == "nan first":
        logits[:, 0] = np.nan
    elif case == "all -inf":
        logits[1:3] = -np.inf
    targets = logits.argmax(-1)
    for kept in range(5):  # drafts matching the targets up to `kept`, then every later one wrong too
        ids = np.concatenate([[11], targets[:4]]).astype(np.int64)
        ids[1 + kept :] = (targets[kept:4] + 1) % 97
        packed = np.full(11, -7, dtype=np.int64)
        assert held_meta.accept_argmax(logits, ids, packed) == kept
        assert packed.tolist() == _python_verdict(logits, ids).tolist()
    one = np.full(3, -7, dtype=np.int64)  # k=0: no draft, the bonus alone
    assert held_meta.accept_argmax(logits[:1].copy(), np.array([11]), one) == 0
    assert one.tolist() == _python_verdict(logits[:1], np.array([11])).tolist()


def test_the_compiled_verdict_refuses_what_it_does_not_take_and_writes_nothing():
    logits, ids = np.zeros((3, 8), np.float32), np.arange(3, dtype=np.int64)
    packed = np.full(7, -7, dtype=np.int64)
    readonly = packed.copy()
    readonly.flags.writeable = False
    for args in [(logits.astype(np.float16), ids, packed), (np.zeros((3, 16), np.float32)[:, ::2], ids, packed),
                 (np.zeros((3, 0), np.float32), ids, packed), (logits, ids[:2], packed), (logits, ids, packed[:6]),
                 (logits, ids.astype(np.int32), packed), (logits, ids, readonly), (logits[0], ids, packed),
                 (np.zeros((0, 8), np.float32), ids[:0], packed[:1])]:
        assert held_meta.accept_argmax(*args) is None
    assert (packed == -7).all()


def test_in_place_holds_arrays_to_their_memory_shape_dtype_and_writeability():
    memory = bytearray(32)  # held here, so that memory given to the array later cannot land at its address
    arrays = [np.zeros((2, 3), np.float32), np.frombuffer(memory, dtype=np.int64)]
    table = held_meta.snapshot(arrays)
    data = np.array([a.ctypes.data for a in arrays], dtype=np.int64)
    assert held_meta.in_place(table, data)
    arrays[0].shape = (3, 2)  # the same object and memory, another shape
    assert not held_meta.in_place(table, data)
    arrays[0].shape = (2, 3)
    arrays[1].flags.writeable = False
    assert not held_meta.in_place(table, data)
    arrays[1].flags.writeable = True
    arrays[1].__setstate__((1, (4,), arrays[1].dtype, False, arrays[1].tobytes()))  # the same object, new memory
    assert not held_meta.in_place(table, data)
    data[1] = arrays[1].ctypes.data
    assert held_meta.in_place(table, data)
