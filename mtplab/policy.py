"""Arena policies: which memory each executor slot binds, as a frozen dataclass with named presets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArenaPolicy:
    """How the Primary (M=1) and Verify (M=k+1) slots get their buffers.

    shared_arena: both slots draw their named buffers from one arena.
    presize: named buffers are reserved at the largest M up front (else sized on first use).
    sibling_session: Verify runs on its own ORT session (weights shared), with a private arena.
    pin_workspace: Verify's step-scoped workspace (logits, hidden) is held for the session;
        unpinned, it goes back to the shared pool after every step.
    """

    name: str
    shared_arena: bool
    presize: bool
    sibling_session: bool
    pin_workspace: bool


POLICIES: dict[str, ArenaPolicy] = {
    p.name: p
    for p in (
        ArenaPolicy("shared-jit", shared_arena=True, presize=False, sibling_session=False, pin_workspace=True),
        ArenaPolicy("shared-max", shared_arena=True, presize=True, sibling_session=False, pin_workspace=True),
        ArenaPolicy("sibling", shared_arena=False, presize=True, sibling_session=True, pin_workspace=False),
        ArenaPolicy("sibling-pinned", shared_arena=False, presize=True, sibling_session=True, pin_workspace=True),
    )
}


def policy(name: str | ArenaPolicy) -> ArenaPolicy:
    """Look up a policy by name; ValueError lists the valid names."""
    if isinstance(name, ArenaPolicy):
        return name
    if name not in POLICIES:
        raise ValueError(f"unknown arena policy {name!r}: valid policies are {list(POLICIES)}")
    return POLICIES[name]


def slot_memory(pol: ArenaPolicy, device, main, specs, host_inputs=frozenset(), scoped=frozenset()):
    """({slot: SlotMemory}, {arena name: Arena}) for the target's two slots under this policy.

    specs: (feeds, outputs, bound) of the largest forwards any slot binds (presized where the policy
    presizes). scoped: the Verify slot's step-scoped outputs (its logits and hidden state).
    """
    from .executor import Slot, SlotMemory

    if pol.shared_arena:
        arena = device.arena("shared")
        if pol.presize:
            for feeds, outputs, _ in specs:
                presize(arena, feeds, outputs, skip=host_inputs)
        memory = {slot: SlotMemory(arena, host_inputs=host_inputs) for slot in (Slot.PRIMARY, Slot.VERIFY)}
        return memory, {"shared": arena}
    primary, private = device.arena("primary"), device.arena("verify", private=True)
    for feeds, outputs, _ in specs:
        presize(primary, feeds, outputs, skip=host_inputs)
        presize(private, feeds, outputs, skip=scoped | host_inputs)
    memory = {
        Slot.PRIMARY: SlotMemory(primary, host_inputs=host_inputs),
        Slot.VERIFY: SlotMemory(
            private, pool=main, step_scoped=scoped, pinned=pol.pin_workspace, owner="verify", host_inputs=host_inputs
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
