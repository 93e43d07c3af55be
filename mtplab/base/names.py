"""How values show in names (point ids, labels), and which known name a mistyped one most likely meant."""

from __future__ import annotations


def canonical(value) -> str:
    """The id form of a value: every float exactly (repr, no trailing '.0'), so distinct values never share an id."""
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)


def likeliest(word: str, names) -> str | None:
    """The known name a mistyped `word` most likely meant (difflib's closest, at least 60% alike), or None."""
    import difflib

    close = difflib.get_close_matches(word, [str(n) for n in names], n=1, cutoff=0.6)
    return close[0] if close else None
