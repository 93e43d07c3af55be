"""The one way mtplab compiles a host loop (numba): machine code cached on disk where numba finds a writable place.

numba checks a cached function against its own source file only: a compiled function that another calls is inlined
into the caller's cache, so each module keeps the compiled functions it calls beside it (mtplab.runtime.held_meta,
mtplab.runtime.host_replay).
"""

from __future__ import annotations

import numba


def compiled(fn):
    """fn compiled, its machine code cached on disk where numba finds a writable place (beside its module, or the
    user's cache folder), else per process (a read-only install with no writable home)."""
    try:
        return numba.njit(cache=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(fn)


def compiled_exactly(fn, signature):
    """fn compiled now for this one signature and no other (cached on disk as `compiled` caches it): a call with
    arguments of other types raises TypeError, numba's dispatch reading each array's dtype, dimensions, layout,
    alignment and writeability in C, the checks a Python caller would otherwise make before each call."""
    try:
        exact = numba.njit([signature], cache=True)(fn)
    except RuntimeError:  # no writable cache place, as in `compiled`
        exact = numba.njit([signature])(fn)
    exact.disable_compile()
    return exact
