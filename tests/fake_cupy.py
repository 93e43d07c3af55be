"""Test double for CuPy: "device" arrays that live in host memory but behave like CuPy's where it matters.

Like CuPy, an array here refuses implicit conversion to numpy (`np.asarray(a)` raises), refuses
mixing with numpy arrays in arithmetic and assignment, returns 0-d arrays from reductions, and
has `get()`/`set()` for explicit transfers. Unlike CuPy, every transfer to the host (get, item,
int, float, bool, index) is counted in `transfers`, so a test can prove where the host waits.
Its memory is host memory, so ONNX Runtime's CPU EP can run on it through IOBinding pointers.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

transfers = 0
inf = np.inf
float16, float32, float64 = np.float16, np.float32, np.float64
int32, int64, uint8 = np.int32, np.int64, np.uint8


def _count() -> None:
    global transfers
    transfers += 1


def _wrap(x):
    if isinstance(x, np.ndarray):
        return ndarray(x)
    if isinstance(x, np.generic):
        return ndarray(np.asarray(x))
    return x


def _unwrap(x):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, (np.ndarray, np.generic)):
        raise TypeError(f"fake CuPy: a numpy {type(x).__name__} cannot mix with device arrays; copy it over first")
    return x  # Python scalars are fine, as in CuPy


class ndarray:  # noqa: N801 - named like the class it stands for
    def __init__(self, a: np.ndarray):
        self._a = a

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)
    flags = property(lambda self: self._a.flags)
    data = property(lambda self: SimpleNamespace(ptr=self._a.ctypes.data))

    def __array__(self, *args, **kwargs):
        raise TypeError("fake CuPy: implicit conversion to a NumPy array is not allowed; use .get()")

    # -- transfers to the host (counted) -----------------------------------------------------
    def _to_host(self, convert):
        _count()
        return convert(self._a)

    def get(self) -> np.ndarray:
        return self._to_host(np.copy)

    def item(self):
        return self._to_host(np.ndarray.item)

    def __int__(self):
        return self._to_host(int)

    def __float__(self):
        return self._to_host(float)

    def __bool__(self):
        return self._to_host(bool)

    def __index__(self):
        return self._to_host(int)

    def set(self, host: np.ndarray) -> None:
        if not isinstance(host, np.ndarray) or host.shape != self.shape:
            raise TypeError("fake CuPy: set() takes a numpy array of the same shape")
        self._a[...] = host

    # -- views and copies -------------------------------------------------------------------
    def __getitem__(self, index):
        return _wrap(self._a[index])

    def __setitem__(self, index, value):
        self._a[index] = _unwrap(value)

    def reshape(self, *shape):
        return ndarray(self._a.reshape(*shape))

    def astype(self, dtype, copy=True):
        return ndarray(self._a.astype(dtype, copy=copy))

    def copy(self):
        return ndarray(self._a.copy())

    def ravel(self):
        return ndarray(self._a.ravel())

    def view(self, dtype):
        return ndarray(self._a.view(dtype))

    def max(self, axis=None):
        return _wrap(self._a.max(axis=axis))

    def sum(self, axis=None):
        return _wrap(self._a.sum(axis=axis))

    # -- arithmetic -------------------------------------------------------------------------
    def _op(self, other, fn):
        return _wrap(fn(self._a, _unwrap(other)))

    def __mul__(self, o):
        return self._op(o, np.multiply)

    __rmul__ = __mul__

    def __add__(self, o):
        return self._op(o, np.add)

    __radd__ = __add__

    def __sub__(self, o):
        return self._op(o, np.subtract)

    def __rsub__(self, o):
        return self._op(o, lambda a, b: b - a)

    def __neg__(self):
        return ndarray(-self._a)

    def __imul__(self, o):
        self._a *= _unwrap(o)
        return self

    def __iadd__(self, o):
        self._a += _unwrap(o)
        return self

    def __eq__(self, o):
        return self._op(o, np.equal)

    def __ne__(self, o):
        return self._op(o, np.not_equal)

    def __gt__(self, o):
        return self._op(o, np.greater)

    def __lt__(self, o):
        return self._op(o, np.less)

    __hash__ = None


def zeros(shape, dtype=float):
    return ndarray(np.zeros(shape, dtype))


def empty(shape, dtype=float):
    return ndarray(np.empty(shape, dtype))


def asarray(x, dtype=None):
    if isinstance(x, ndarray):
        return x if dtype is None else x.astype(dtype, copy=False)
    return ndarray(np.array(x, dtype=dtype))  # host to device, as cupy.asarray does


def ascontiguousarray(x):
    return ndarray(np.ascontiguousarray(_unwrap(x)))


def argmax(a, axis=None):
    return _wrap(np.argmax(_unwrap(a), axis=axis))


def concatenate(arrays, axis=0):
    return ndarray(np.concatenate([_unwrap(a) for a in arrays], axis=axis))


def stack(arrays, axis=0):
    return ndarray(np.stack([_unwrap(a) for a in arrays], axis=axis))


def where(cond, x, y):
    return _wrap(np.where(_unwrap(cond), _unwrap(x), _unwrap(y)))


def minimum(a, b):
    return _wrap(np.minimum(_unwrap(a), _unwrap(b)))


def cumprod(a, axis=None):
    return ndarray(np.cumprod(_unwrap(a), axis=axis))


def ones_like(a):
    return ndarray(np.ones_like(_unwrap(a)))


def einsum(subscripts, *operands):
    return ndarray(np.einsum(subscripts, *[_unwrap(o) for o in operands]))


def repeat(a, repeats, axis=None):
    return ndarray(np.repeat(_unwrap(a), repeats, axis=axis))
