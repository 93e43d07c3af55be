"""The dtype and shape of many numpy arrays compared with a snapshot, and feeds staged, in one compiled call.

The replay check (mtplab.runtime.signature.ReplayCheck) reads every slot buffer's dtype and shape before each
replay: an array reshaped in place is the same object at the same address, so only reading it catches it. It then
copies each feed into its slot buffer. On tiny that is 26 arrays read and 5 copies a run; in Python each read
makes a tuple and each copy is a call, 4 to 5 us a run, and inside a step, after a forward has evicted the
interpreter's working set, more: a third of greedy's host time per token. Here one compiled call reads each
ndarray's own fields (NumPy's PyArrayObject: data, nd, dimensions, descr, flags) for every row of a table, compares
them with the snapshot the table holds, and makes the copies, in well under a microsecond.

The fields' layout is NumPy's ABI, which extensions compiled against NumPy 1.x still read on 2.x. It is checked
once per process: first each field's word read plainly (no pointer followed) against test arrays' attributes, then
the compiled reads on them, a reshape and a dtype change made in place, a strided view and a read-only array. Where
that fails (another interpreter, a debug build of Python) `snapshot` returns None, and so does it for anything not
a plain ndarray (a CuPy array): the caller keeps its Python reads. The table holds addresses, not references:
whoever holds a table holds its arrays.

A hot loop's step (mtplab.runtime.hot_loop: a run's token, copies and next feeds, then these reads and copies) is
compiled here too, beside the reads it inlines, greedy-match's verdict on a verify (accept_argmax), which
shares its argmax, and in_place: whether arrays whose data addresses a compiled caller holds still have them, and
their dtype and shape (select's update of every layer at once, mtplab.runtime.host_replay.SelectLayers).
"""

from __future__ import annotations

import ctypes
import functools
import sys
import warnings

import numpy as np

# PyArrayObject after PyObject_HEAD (refcount, type), in 8-byte words: data, nd, dimensions, strides, base, descr,
# flags. nd and flags are C ints: read as the int32 at twice their word's index.
_DATA, _ND, _DIMS, _DESCR, _FLAGS = 2, 3, 4, 7, 8
_C_CONTIGUOUS, _WRITEABLE = 0x0001, 0x0400  # NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE
COLUMNS = 3  # a table's row: address, nd, descr address; then the dimensions
CHECKED, STAGED, DIFFERENT = 0, 1, -1  # what stage() did
# A hot loop's program row (mtplab.runtime.hot_loop), (op, a, b, c). After a run: COPY (source row, target row,
# bytes), ARGMAX (logits row, count, -). Before the next: TOKEN (ids row, count, -), POSITIONS (row, count, -),
# MASK (row, width, -), SEQLENS (row, count, -). Its compiled step lives here, beside the reads it inlines: numba's
# cache of a function is checked against its own file only, and a step cached apart would keep stale reads.
COPY, ARGMAX, TOKEN, POSITIONS, MASK, SEQLENS = range(6)
AFTER, BEFORE = 1, 2  # advance's flags: the run's after-work, the next run's feeds

try:
    from numba import types
    from numba.extending import intrinsic

    from mtplab.runtime.jit import compiled as _compiled
    from mtplab.runtime.jit import compiled_exactly
except ImportError as err:  # numba missing, or refusing this numpy: the replay check reads in Python
    MISSING: ImportError | None = err
else:
    MISSING = None

    def _pointer_intrinsic(kind):
        @intrinsic
        def pointer(typingctx, address):
            sig = types.CPointer(kind)(address)

            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], context.get_value_type(types.CPointer(kind)))

            return sig, codegen

        return pointer

    _words = _pointer_intrinsic(types.int64)
    _ints = _pointer_intrinsic(types.int32)
    _bytes = _pointer_intrinsic(types.uint8)
    _floats = _pointer_intrinsic(types.float32)

    @_compiled
    def copy_bytes(target, source, count):  # pragma: no cover - compiled
        """count bytes from address source to address target (not overlapping): in 8-byte words where both are
        8-aligned (bytes one by one copy a 30 KB state at a tenth of memcpy's speed; words at memcpy's)."""
        start = 0
        if target % 8 == 0 and source % 8 == 0:  # element loops: a slice assignment checks overlap, twice as slow
            words = count // 8
            into, out = _words(target), _words(source)
            for w in range(words):
                into[w] = out[w]
            start = 8 * words
        into, out = _bytes(target), _bytes(source)
        for b in range(start, count):
            into[b] = out[b]

    @_compiled
    def same(table):  # pragma: no cover - compiled
        """Whether every row's array has the nd, dtype object and dimensions the row holds."""
        for r in range(table.shape[0]):
            address = table[r, 0]
            nd = _ints(address)[2 * _ND]
            if nd != table[r, 1]:
                return False
            fields = _words(address)
            if fields[_DESCR] != table[r, 2]:
                return False
            dims = _words(fields[_DIMS])
            for d in range(nd):
                if dims[d] != table[r, COLUMNS + d]:
                    return False
        return True

    @_compiled
    def _flags(table, row):  # pragma: no cover - compiled
        return _ints(table[row, 0])[2 * _FLAGS]

    @_compiled
    def _writable(table, row):  # pragma: no cover - compiled
        """Whether the row's array may be written as plain memory: C-contiguous and writeable."""
        flags = _flags(table, row)
        return flags & _C_CONTIGUOUS != 0 and flags & _WRITEABLE != 0

    @_compiled
    def copyable(table, copies):  # pragma: no cover - compiled
        """Whether there are copies, each (source row, destination row, bytes) from a contiguous source into a
        contiguous, writeable target."""
        if copies.shape[0] == 0:
            return False
        for c in range(copies.shape[0]):
            if _flags(table, copies[c, 0]) & _C_CONTIGUOUS == 0 or not _writable(table, copies[c, 1]):
                return False
        return True

    @_compiled
    def copy_rows(table, copies):  # pragma: no cover - compiled
        for c in range(copies.shape[0]):
            source, target = _words(table[copies[c, 0], 0])[_DATA], _words(table[copies[c, 1], 0])[_DATA]
            if source != target:
                copy_bytes(target, source, copies[c, 2])

    @_compiled
    def _stage(table, copies):  # pragma: no cover - compiled
        if not same(table):
            return DIFFERENT
        if not copyable(table, copies):
            return CHECKED
        copy_rows(table, copies)
        return STAGED

    @_compiled
    def _in_place(table, data):  # pragma: no cover - compiled
        if not same(table):
            return False
        for r in range(table.shape[0]):
            if not _writable(table, r) or _words(table[r, 0])[_DATA] != data[r]:
                return False
        return True

    @_compiled
    def _argmax(row, count):  # pragma: no cover - compiled
        """numpy's argmax of a float32 row of count > 0 values (an array or a pointer): the first NaN, else the first
        largest."""
        best, at = row[0], 0
        if best == best:
            for j in range(1, count):
                value = row[j]
                if value != value:
                    return j
                if value > best:
                    best, at = value, j
        return at

    def _accept_argmax(logits, ids, packed):  # pragma: no cover - compiled (accept_argmax's compiled_exactly)
        M = logits.shape[0]
        if M == 0 or logits.shape[1] == 0 or ids.shape[0] != M or packed.shape[0] != 2 * M + 1:
            return -1
        k = M - 1
        n = k
        for i in range(k + 1):
            target = _argmax(logits[i], logits.shape[1])
            packed[k + 2 + i] = target
            if i < n and ids[i + 1] != target:
                n = i
            packed[1 + i] = ids[i]
        packed[0] = n
        return n

    @_compiled
    def _advance(table, copies, program, out, i, length, flags):  # pragma: no cover - compiled
        if i < 0 or i >= out.shape[0] or not same(table) or not copyable(table, copies):
            return DIFFERENT
        for p in range(program.shape[0]):  # every array it reads contiguous, every one it writes writeable too
            op, a, b = program[p, 0], program[p, 1], program[p, 2]
            reads_only = op == ARGMAX or op == COPY  # a COPY writes its row b
            if not (_flags(table, a) & _C_CONTIGUOUS != 0 if reads_only else _writable(table, a)):
                return DIFFERENT
            if op == COPY and not _writable(table, b):
                return DIFFERENT
        for p in range(program.shape[0]):
            op, a, b, c = program[p, 0], program[p, 1], program[p, 2], program[p, 3]
            if op <= ARGMAX and flags & AFTER:
                if op == COPY:
                    copy_bytes(_words(table[b, 0])[_DATA], _words(table[a, 0])[_DATA], c)
                else:
                    out[i] = _argmax(_floats(_words(table[a, 0])[_DATA]), b)
            elif op > ARGMAX and flags & BEFORE:
                data = _words(table[a, 0])[_DATA]
                if op == SEQLENS:
                    seqlens = _ints(data)
                    for j in range(b):
                        seqlens[j] = length
                else:
                    values = _words(data)
                    for j in range(b):
                        values[j] = out[i] if op == TOKEN else length if op == POSITIONS else (1 if j <= length else 0)
        if flags & BEFORE:
            copy_rows(table, copies)
        return STAGED


def accept_argmax(logits: np.ndarray, ids: np.ndarray, packed: np.ndarray) -> int | None:
    """greedy-match's verdict on a verify, as mtplab.engine.acceptance.GreedyMatch.accept and the packing after it
    make it, in one compiled call: for logits [k+1, V] (float32) and ids [first, d1..dk], packed [2k+3] becomes
    [n, first, d1..dk, t0..tk] (t_i the first largest of row i, numpy's argmax) and n returns, the drafts kept. None,
    with nothing written, for arrays it does not take (another dtype, layout or size): the caller's Python path.
    ids and packed must not overlap (the verify's own two buffers)."""
    # plain ndarrays only (a subclass's own meaning, a masked array's mask, is not numba's); their dtype, dimensions,
    # layout and writeability checked by numba's dispatch of the one compiled form (compiled_exactly); the sizes in
    # the call, which answers -1 for sizes it does not take
    if not type(logits) is type(ids) is type(packed) is np.ndarray:
        return None
    try:
        n = _accept_exactly(logits, ids, packed)
    except TypeError:  # arrays of other types, or no compiled form yet (made at the first call)
        return _accept_first(logits, ids, packed) if _accept_exactly is None else None
    return n if n >= 0 else None


def _accept_first(logits: np.ndarray, ids: np.ndarray, packed: np.ndarray) -> int | None:
    """accept_argmax's first call: its compiled form made (float32 logits [M, V] and int64 ids [M], C-contiguous,
    read only; int64 packed [2M+1], C-contiguous and writeable), then the call made; None without numba."""
    global _accept_exactly
    if MISSING is not None:
        return None
    readable = functools.partial(types.Array, layout="C", readonly=True)
    _accept_exactly = compiled_exactly(_accept_argmax, types.int64(readable(types.float32, 2),
                                                                   readable(types.int64, 1), types.int64[::1]))
    return accept_argmax(logits, ids, packed)


_accept_exactly = None  # _accept_argmax compiled for its one signature (compiled_exactly), made at the first call


def _rows(arrays: list) -> np.ndarray:
    width = COLUMNS + max((a.ndim for a in arrays), default=0)
    table = np.zeros((len(arrays), width), dtype=np.int64)
    for r, a in enumerate(arrays):
        table[r, :COLUMNS] = (id(a), a.ndim, id(a.dtype))
        table[r, COLUMNS : COLUMNS + a.ndim] = a.shape
    return table


NONE = np.zeros((0, 3), dtype=np.int64)  # no copies: stage() checks only, and answers CHECKED


def _fields_where_expected(arrays: list) -> bool:
    """Whether each array's PyArrayObject holds its data address, nd, dtype and flags in the words the compiled reads
    take, and its dimensions pointer beside a strides pointer nd words on (NumPy allocates the two as one block).
    Plain word reads inside each object (its type's size checked first), nothing followed: on a layout that differs,
    this answers False where the compiled reads would follow a wrong pointer."""
    words = _FLAGS + 1
    if np.ndarray.__basicsize__ < 8 * words:
        return False
    for a in arrays:
        word, half = (ctypes.c_int64 * words).from_address(id(a)), (ctypes.c_int32 * (2 * words)).from_address(id(a))
        if (word[_DATA], half[2 * _ND], word[_DESCR], half[2 * _FLAGS]) != (
                a.__array_interface__["data"][0], a.ndim, id(a.dtype), a.flags.num):
            return False
        if a.ndim and word[_DIMS + 1] - word[_DIMS] != 8 * a.ndim:
            return False
    return True


def _works() -> bool:
    """Whether the compiled reads agree with numpy's attributes on this interpreter (checked once)."""
    if sys.implementation.name != "cpython" or sys.byteorder != "little":
        return False
    try:
        a, b, c = np.zeros((2, 1, 3), np.float32), np.zeros(4, np.int64), np.zeros((), np.float16)
        strided, readonly = np.zeros((5, 6), np.int32)[:, 1:], np.zeros(4, np.int64)
        readonly.flags.writeable = False
        source, target = np.arange(4, dtype=np.int64), np.zeros(4, dtype=np.int64)
        arrays = [a, b, c, strided, readonly, source, target]
        if not _fields_where_expected(arrays):
            return False
        table = _rows(arrays)
        if _stage(table, NONE) != CHECKED:
            return False
        a.shape = (1, 2, 3)
        reshaped = _stage(table, NONE) == DIFFERENT
        a.shape = (2, 1, 3)
        b.dtype = np.float64
        retyped = _stage(table, NONE) == DIFFERENT
        b.dtype = np.int64
        copy = np.array([[5, 6, 32]], dtype=np.int64)
        copied = _stage(table, copy) == STAGED and (target == source).all()
        declined = (_stage(table, np.array([[3, 6, 80]], dtype=np.int64)) == CHECKED  # a strided source
                    and _stage(table, np.array([[5, 4, 32]], dtype=np.int64)) == CHECKED)  # a read-only target
        return reshaped and retyped and copied and declined and (readonly == 0).all()
    except Exception as err:  # numba's compile or cache load, or the reads, failing: the Python reads stay
        warnings.warn(f"the replay check's compiled reads are off in this process ({type(err).__name__}: {err}); "
                      "Python reads every binding instead (slower, the same decisions). A damaged numba cache "
                      f"beside {__file__} or in NUMBA_CACHE_DIR is deleted safely.", RuntimeWarning, stacklevel=2)
        return False


WORKS: bool | None = None


def ready() -> bool:
    """Whether the compiled reads work here: checked once per process (the first call loads or compiles them)."""
    global WORKS
    if WORKS is None:
        if MISSING is not None:
            warnings.warn(f"the replay check's compiled reads are off: numba does not load ({MISSING}); Python reads "
                          "every binding instead (slower, the same decisions)", RuntimeWarning, stacklevel=2)
        WORKS = MISSING is None and _works()
    return WORKS


def snapshot(arrays: list) -> np.ndarray | None:
    """A table of these arrays' addresses, dtypes and shapes as they are now, for `stage`; None where the
    compiled reads do not apply (an array not a plain numpy ndarray, or this interpreter)."""
    if not all(type(a) is np.ndarray for a in arrays):
        return None
    return _rows(arrays) if ready() else None


def copies(pairs: list[tuple[int, int, int]]) -> np.ndarray:
    """The copies `stage` makes: (source row, target row, bytes) each. Plain bytes: never arrays of a dtype that
    holds object references (dtype.hasobject), whose copies must count them."""
    return np.array(pairs, dtype=np.int64).reshape(-1, 3)


advance = _advance if MISSING is None else None
"""advance(table, copies, program, out, i, length, flags): a hot loop's step (mtplab.runtime.hot_loop). With AFTER,
a run's after-work: the program's copies, and its token into out[i]; with BEFORE, the next run's feeds: the token
out[i] and the lengths at `length`, staged into the plan's buffers. STAGED; else nothing was done (the table found a
difference, or i is outside out): the caller's Python path takes over."""
stage = _stage if MISSING is None else None
"""stage(table, copies): DIFFERENT where an array of the table (each still alive: whoever made the table holds
it) has another dtype object or shape than the table holds; else the copies made (STAGED), or none when there are
none to make, or a source is not contiguous, or a target not contiguous and writeable (CHECKED: the caller
copies). The compiled function itself: a wrapper would cost a tenth of it."""


in_place = _in_place if MISSING is None else None
"""in_place(table, data): whether every array of the table (each still alive: whoever made the table holds it) has
the dtype object and shape the table holds, is C-contiguous and writeable, and holds its memory at data[row] (the
address its caller computes on: an array given new memory in place, by resize or __setstate__, fails here)."""


def readdress(table: np.ndarray, arrays: list) -> None:
    """The table's first rows now hold these arrays' addresses; their dtype and shape columns stay what they were."""
    table[: len(arrays), 0] = list(map(id, arrays))
