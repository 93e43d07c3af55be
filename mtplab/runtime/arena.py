"""Arenas: named buffers with stable addresses, and a pool of step-scoped blocks with ownership epochs.

A captured plan (IOBinding on CPU, CUDA graph on GPU) bakes the addresses it was captured with.
The arena makes the lifetime of those addresses explicit: a named buffer lives as long as the
arena; a pool block can be released and reissued to another owner, which bumps its epoch.
The array module is a parameter (numpy here, CuPy on the GPU backend).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from mtplab.base.arrays import array_module, to_numpy  # noqa: F401 - the arena's users read them here too

ALIGN = 64


class BufferTooSmall(Exception):
    """A named buffer exists but cannot hold the requested shape (its address is already baked)."""


def address(a: Any) -> int:
    """Raw data pointer of a numpy or CuPy array."""
    return int(a.data.ptr) if hasattr(a.data, "ptr") else int(a.ctypes.data)


def put(dst: Any, src: Any) -> None:
    """dst[...] = src across array modules: a host value is copied to the device (no host wait)."""
    xp = array_module(dst)
    if xp is not np and isinstance(src, (np.ndarray, np.generic, int, float)):
        src = np.asarray(src, dtype=dst.dtype, order="C")
        if src.shape == dst.shape and dst.flags.c_contiguous:
            dst.set(src)  # one copy, queued on the current stream
            return
        src = xp.asarray(src)
    dst[...] = src


@dataclass(eq=False)
class Block:
    """One pool allocation. epoch counts reissues; owner is who holds it now (None while free)."""

    memory: Any
    nbytes: int
    epoch: int = 0
    owner: str | None = None

    @property
    def address(self) -> int:
        return address(self.memory)

    def carve(self, layout: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, Any]:
        """Typed views of this block for {name: (shape, dtype)}, each 64-byte aligned, in order."""
        views, offset = {}, 0
        for name, (shape, dtype) in layout.items():
            dt = np.dtype(dtype)
            n = int(np.prod(shape)) * dt.itemsize
            if offset + n > self.nbytes:
                raise BufferTooSmall(f"block of {self.nbytes} bytes cannot hold {name} at offset {offset} ({n} bytes)")
            views[name] = self.memory[offset : offset + n].view(dt).reshape(shape)
            offset += -(-n // ALIGN) * ALIGN
        return views


def layout_bytes(layout: dict[str, tuple[tuple[int, ...], Any]]) -> int:
    return sum(-(-int(np.prod(s)) * np.dtype(d).itemsize // ALIGN) * ALIGN for s, d in layout.values())


@dataclass(eq=False)
class Arena:
    """Named buffers (sized on first use, or reserved up front) plus a LIFO pool of step-scoped blocks."""

    name: str
    xp: ModuleType = np
    pool: Any = None  # CuPy: the memory pool this arena allocates from (shared or private)
    buffers: dict[str, Any] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    free: list[Block] = field(default_factory=list)
    peak_bytes: int = 0

    def _zeros(self, shape, dtype) -> Any:
        if self.pool is None:
            return self.xp.zeros(shape, dtype=dtype)
        with self.xp.cuda.using_allocator(self.pool.malloc):
            return self.xp.zeros(shape, dtype=dtype)

    def _alloc(self, nbytes: int) -> Any:
        mem = self._zeros(nbytes + ALIGN, self.xp.uint8)
        off = (-address(mem)) % ALIGN
        return mem[off : off + nbytes]

    def _track(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.bytes_held)

    def reserve(self, name: str, shape: tuple[int, ...], dtype) -> Any:
        """Allocate a named buffer now, at its largest shape (the pre-sized policies)."""
        if name not in self.buffers:
            self.buffers[name] = self._zeros(shape, dtype)
            self._track()
        return self.buffers[name]

    def view(self, name: str, shape: tuple[int, ...], dtype) -> Any:
        """A contiguous view of the named buffer with this shape; allocated exactly on first use.

        Raises BufferTooSmall if the buffer exists and is smaller: it cannot grow, because plans
        already captured hold its address.
        """
        buf = self.buffers.get(name)
        if buf is None:
            return self.reserve(name, shape, dtype)
        n = int(np.prod(shape))
        if (
            buf.dtype != np.dtype(dtype)
            or n > buf.size
            or len(shape) != buf.ndim
            or any(s > c for s, c in zip(shape, buf.shape))
        ):
            raise BufferTooSmall(
                f"{name}: needs {list(shape)} {np.dtype(dtype).name} but the {self.name} arena buffer "
                f"holds {list(buf.shape)} {buf.dtype.name}"
            )
        # A contiguous view of the buffer's first n elements: a bound pointer is read as a dense array,
        # so a strided slice (M on a later axis, e.g. position_ids [3, 1, M]) would be misread.
        return buf.reshape(-1)[:n].reshape(shape) if shape != buf.shape else buf

    def acquire(self, owner: str, nbytes: int) -> Block:
        """Take a step-scoped block: the most recently freed one that fits, else a new one."""
        for i in range(len(self.free) - 1, -1, -1):
            if self.free[i].nbytes >= nbytes:
                block = self.free.pop(i)
                block.epoch += 1
                block.owner = owner
                return block
        block = Block(self._alloc(nbytes), nbytes, owner=owner)
        self.blocks.append(block)
        self._track()
        return block

    def release(self, block: Block) -> None:
        """Give a block back to the pool; its next owner may be anyone."""
        if block.owner is None:
            raise ValueError(f"{self.name}: block at {block.address:#x} released twice")
        block.owner = None
        self.free.append(block)

    @property
    def bytes_held(self) -> int:
        named = sum(int(b.nbytes) for b in self.buffers.values())
        return named + sum(b.nbytes for b in self.blocks)

    def stats(self) -> dict:
        out = {"bytes_held": self.bytes_held, "peak_bytes": self.peak_bytes, "blocks": len(self.blocks)}
        if self.pool is not None:
            out["pool_bytes"] = int(self.pool.total_bytes())
        return out
