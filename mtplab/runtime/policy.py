"""Arena policies: which memory each executor slot binds, as a frozen dataclass with named presets."""

from __future__ import annotations

from dataclasses import dataclass

from mtplab.runtime.arena import layout_bytes


@dataclass(frozen=True)
class ArenaPolicy:
    """How the Primary (M=1) and Verify (M=k+1) slots get their buffers.

    sibling_session: Verify runs on its own ORT session (weights shared), with a private arena; else both
        slots share one session and draw their named buffers from one arena.
    presize (one shared arena): named buffers are reserved at the largest M up front, else sized on first use.
        Sibling arenas are always presized.
    pin_workspace (a sibling session): Verify's step-scoped workspace (logits, hidden) is held for the session;
        unpinned, it goes back to the shared pool after every step. A shared arena's workspace is always held.
    """

    name: str
    sibling_session: bool
    presize: bool = True
    pin_workspace: bool = True

    def __post_init__(self) -> None:
        if self.sibling_session and not self.presize:
            raise ValueError(f"arena policy {self.name!r}: a sibling session's arenas are always presized")
        if not self.sibling_session and not self.pin_workspace:
            raise ValueError(f"arena policy {self.name!r}: one shared arena has no pool to give its workspace back to")


POLICIES: dict[str, ArenaPolicy] = {
    p.name: p
    for p in (
        ArenaPolicy("shared-jit", sibling_session=False, presize=False),
        ArenaPolicy("shared-max", sibling_session=False, presize=True),
        ArenaPolicy("sibling", sibling_session=True, pin_workspace=False),
        ArenaPolicy("sibling-pinned", sibling_session=True, pin_workspace=True),
    )
}


def policy(name: str | ArenaPolicy) -> ArenaPolicy:
    """Look up a policy by name; ValueError lists the valid names."""
    if isinstance(name, ArenaPolicy):
        return name
    if name not in POLICIES:
        raise ValueError(f"unknown arena policy {name!r}: valid policies are {list(POLICIES)}")
    return POLICIES[name]


def slot_memory(pol: ArenaPolicy, device, main, specs, host_inputs=frozenset(), scoped=frozenset(), primary_specs=None):
    """({slot: SlotMemory}, {arena name: Arena}) for the target's two slots under this policy.

    specs: (feeds, outputs, bound) of the largest forwards any slot binds (presized where the policy
    presizes); primary_specs: the Primary slot's own, where a sibling policy runs it on another graph.
    scoped: the Verify slot's step-scoped outputs (its logits and hidden state).
    """
    from mtplab.runtime.executor import Slot
    from mtplab.runtime.slot_memory import SlotMemory

    if not pol.sibling_session:
        arena = device.arena("shared")
        if pol.presize:
            for feeds, outputs, _ in specs:
                presize(arena, feeds, outputs, skip=host_inputs)
        memory = {slot: SlotMemory(arena, host_inputs=host_inputs) for slot in (Slot.PRIMARY, Slot.VERIFY)}
        return memory, {"shared": arena}
    primary, private = device.arena("primary"), device.arena("verify", private=True)
    for feeds, outputs, _ in primary_specs or specs:
        presize(primary, feeds, outputs, skip=host_inputs)
    for feeds, outputs, _ in specs:
        presize(private, feeds, outputs, skip=scoped | host_inputs)
    memory = {
        Slot.PRIMARY: SlotMemory(primary, host_inputs=host_inputs),
        Slot.VERIFY: SlotMemory(
            private, pool=main, step_scoped=scoped, pinned=pol.pin_workspace, owner="verify", host_inputs=host_inputs,
            # the largest verify's outputs: a pinned block then holds every M's (one Verify plan per M)
            reserve_bytes=max((layout_bytes({n: o for n, o in outputs.items() if n in scoped})
                               for _, outputs, _ in specs), default=0),
        ),
    }
    return memory, {"primary": primary, "verify": private}


def presize(arena, feeds, outputs, skip=frozenset()) -> None:
    """Reserve every named feed and output buffer at its size now (a presizing policy's up-front layout)."""
    for name, value in feeds.items():
        if name not in skip:
            arena.reserve(f"feed.{name}", value.shape, value.dtype)
    for name, (shape, dtype) in outputs.items():
        if name not in skip:
            arena.reserve(name, shape, dtype)
