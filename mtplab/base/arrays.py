"""Host and device arrays alike: the array module of an array (numpy or CuPy), and a host copy."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np


def array_module(a: Any) -> ModuleType:
    """numpy for host arrays and scalars, cupy for device arrays."""
    if isinstance(a, (np.ndarray, np.generic)):
        return np
    name = type(a).__module__  # cupy's ndarray lives in a submodule: walk up to the one with the API
    while name:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "asarray"):
            return module
        name = name.rpartition(".")[0]
    raise TypeError(f"no array module for {type(a).__name__}")


def to_numpy(a: Any) -> np.ndarray:
    """A host copy of a device array (waits for the device); host arrays pass through."""
    return a if array_module(a) is np else a.get()


def dtype_of(name: str) -> np.dtype:
    """The numpy dtype of a tensor element type name ("float32", "float16", "bfloat16", ...); numpy has no
    bfloat16 of its own, so it comes from ml_dtypes (which onnx already depends on)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
