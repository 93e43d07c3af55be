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
