"""A point's stable, readable id, from its RunConfig's fields' `id` metadata: the name of its folder in a sweep."""

from __future__ import annotations

import dataclasses
import hashlib
import re

from mtplab.base.names import canonical
from mtplab.experiment.config import RunConfig, fields


def point_id(run: RunConfig, repeat: int = 0) -> str:
    """A point's stable readable id, from the fields' `id` metadata: head parts, body parts, r<repeat>, tail parts."""
    values = run.to_dict()
    placed: dict[str, list] = {"head": [], "body": [], "tail": []}
    for order, f in enumerate(fields()):
        place, rank, form = f.metadata["id"]
        value = values[f.name]
        if place == "none" or not f.metadata["sweep"] or (place != "body" and value == f.default):
            continue
        if callable(form):
            text = form(value, values)
        elif form is not None:
            text = form.format(canonical(value))
        else:
            text = id_part(f, value)
        placed[place].append((rank, order, text))
    parts = [text for _, _, text in sorted(placed["head"])] + [text for _, _, text in sorted(placed["body"])]
    return folder_safe("-".join(parts + [f"r{repeat}"] + [text for _, _, text in sorted(placed["tail"])]))


def folder_safe(name: str, limit: int = 200) -> str:
    """`name` as a point folder's name: characters outside letters, digits and ``._+=-`` become '_', it starts with a
    letter or digit (a leading '.' would make it a hidden scratch folder), and a name over `limit` characters keeps
    its start and a hash of the whole (file systems refuse names over 255 bytes)."""
    safe = re.sub(r"[^A-Za-z0-9._+=-]", "_", name)
    if not safe[:1].isalnum():
        safe = "m" + safe
    if len(safe) > limit:
        safe = f"{safe[: limit - 17]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return safe


def id_part(f: dataclasses.Field, value) -> str:
    """A tail field's part of a point id: its tag (+ the value unless a boolean)."""
    tag = f.metadata.get("tag")
    if isinstance(value, bool):
        return tag or (f"no{f.name}" if f.default is True else f.name)
    return f"{tag or f.name}{canonical(value)}"
