"""Where an executor slot's staged inputs and outputs live (SlotMemory): named buffers from an arena, step-scoped
outputs from a pooled block, host inputs in host memory; one buffer per name, shape and dtype, so that each plan a
slot keeps binds addresses that stay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtplab.runtime.arena import Arena, Block, BufferTooSmall, layout_bytes, put


@dataclass(eq=False)
class SlotMemory:
    """Where a slot's staged inputs and outputs live.

    Named buffers come from `arena`. Outputs listed in `step_scoped` instead come from a block of
    `pool`, acquired per step; unpinned, the block goes back to the pool at end_step(). Feeds in
    `host_inputs` stay in host memory whatever the arena's device (inputs an op reads on the CPU).
    """

    arena: Arena
    pool: Arena | None = None
    step_scoped: frozenset[str] = frozenset()
    pinned: bool = True
    owner: str = ""
    host_inputs: frozenset[str] = frozenset()
    block: Block | None = None
    views: dict[tuple, Any] = field(default_factory=dict)
    host: dict[tuple, np.ndarray] = field(default_factory=dict)
    reserve_bytes: int = 0  # a step-scoped block is taken at least this large (the largest forward's outputs)

    def _view(self, name: str, shape: tuple[int, ...], dtype) -> Any:
        key = (name, shape, dtype)
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = self.arena.view(name, shape, dtype)
        return view

    def stage(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """Copy the feeds into this slot's input buffers (stable addresses) and return those."""
        views = {}
        for name, value in feeds.items():
            if name in self.host_inputs:  # one buffer per shape, as the arena's views: each plan keeps its own
                key = (name, value.shape, value.dtype)
                view = self.host.get(key)
                if view is None:
                    view = self.host[key] = np.empty(value.shape, value.dtype)
            else:
                view = self._view(f"feed.{name}", value.shape, value.dtype)
            put(view, value)
            views[name] = view
        return views

    def temporaries(self, feeds: dict[str, Any], outputs: dict[str, tuple]) -> tuple[dict, dict]:
        """Fresh buffers for an eager run outside the slot's plan: (staged feeds, outputs)."""
        xp = self.arena.xp
        staged = {}
        for name, value in feeds.items():
            host = name in self.host_inputs or xp is np
            staged[name] = np.ascontiguousarray(value) if host else xp.ascontiguousarray(xp.asarray(value))
        outs = {n: (xp.empty(shape, dtype), None) for n, (shape, dtype) in outputs.items()}
        return staged, outs

    def outputs(self, spec: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, tuple[Any, Block | None]]:
        scoped = {n: s for n, s in spec.items() if n in self.step_scoped and self.pool is not None}
        out: dict[str, tuple[Any, Block | None]] = {}
        if scoped:
            need = layout_bytes(scoped)
            if self.block is None:
                self.block = self.pool.acquire(self.owner, max(need, self.reserve_bytes))
            if self.block.nbytes < need:
                raise BufferTooSmall(f"{self.owner} workspace: needs {need} bytes, block holds {self.block.nbytes}")
            for name, view in self.block.carve(scoped).items():
                out[name] = (view, self.block)
        for name, (shape, dtype) in spec.items():
            if name not in out:
                out[name] = (self._view(name, shape, dtype), None)
        return out

    def end_step(self) -> None:
        if self.block is not None and not self.pinned:
            self.pool.release(self.block)
            self.block = None
