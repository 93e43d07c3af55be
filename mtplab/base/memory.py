"""This machine's memory, as /proc/meminfo tells it."""

from __future__ import annotations

from pathlib import Path


def meminfo_gib(key: str) -> float | None:
    """A /proc/meminfo entry ("MemTotal", "MemAvailable") in GiB; None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None
