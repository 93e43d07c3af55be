"""How values show in names (point ids, labels)."""

from __future__ import annotations


def canonical(value) -> str:
    """The id form of a value: every float exactly (repr, no trailing '.0'), so distinct values never share an id."""
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)
