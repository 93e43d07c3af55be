"""This machine's memory, as /proc/meminfo tells it, and what a process's memory lies on: the kernel's transparent
huge pages mode, glibc's malloc tunable the process inherited (GLIBC_TUNABLES=glibc.malloc.hugetlb=1 puts malloc's
memory on huge pages where the kernel gives them on request), and how much of its memory is on huge pages. mtplab
records it with every result and sets nothing: a process runs on the pages its environment gives it.
"""

from __future__ import annotations

import os
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def proc_kib(path: str, key: str) -> int | None:
    """A "key: N kB" line's N from a /proc file; None where the file or the line is missing."""
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


def meminfo_gib(key: str) -> float | None:
    """A /proc/meminfo entry ("MemTotal", "MemAvailable") in GiB; None where there is none."""
    kib = proc_kib("/proc/meminfo", key)
    return None if kib is None else kib / 2**20


def thp_mode(path: Path = THP_MODE) -> str | None:
    """The kernel's transparent huge pages mode (always, madvise, never); None where it has none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def hugetlb_of(tunables: str) -> str | None:
    """glibc.malloc.hugetlb's value in a GLIBC_TUNABLES string (None: not set there)."""
    values = [t.partition("=")[2] for t in tunables.split(":") if t.partition("=")[0] == TUNABLE]
    return values[-1] if values else None


def anon_huge_mib() -> float | None:
    """This process's anonymous memory on transparent huge pages now, in MiB; None where the kernel does not say."""
    kib = proc_kib("/proc/self/smaps_rollup", "AnonHugePages")
    return None if kib is None else kib / 1024


def malloc_hugetlb() -> str | None:
    """glibc.malloc.hugetlb as GLIBC_TUNABLES gives it to this process and its children (None: unset)."""
    return hugetlb_of(os.environ.get("GLIBC_TUNABLES", ""))


def huge_pages() -> dict:
    """What a process's memory lies on, as a result records it: the kernel's mode, glibc.malloc.hugetlb
    (malloc_hugetlb), and how much of this process's memory is on huge pages now (a point records it after its
    engine is made: its weights, and numpy's own arrays, which numpy asks huge pages for by itself)."""
    return {"transparent": thp_mode(), "malloc_hugetlb": malloc_hugetlb(), "anon_huge_mib": anon_huge_mib()}


def huge_pages_summary() -> str:
    """One line on this process's pages, for `mtplab doctor`."""
    mode, malloc = thp_mode(), malloc_hugetlb()
    if malloc == "2":
        return "malloc's memory on the kernel's reserved huge pages (GLIBC_TUNABLES sets glibc.malloc.hugetlb=2)"
    if mode in (None, "never", "always"):
        return {None: "none: the kernel has no transparent huge pages", "never": "none: the kernel's THP mode is never",
                "always": "every process's memory (the kernel's THP mode is always)"}[mode]
    if malloc == "1":
        return "malloc's memory (glibc.malloc.hugetlb=1; the kernel's THP mode is madvise)"
    return (f"off: the kernel gives them on request (madvise); GLIBC_TUNABLES={TUNABLE}=1 asks for them"
            + (f" (it sets {TUNABLE}={malloc} now)" if malloc is not None else ""))


def calibration_pages() -> str | None:
    """What a calibration's cache key holds of the pages its sweep's processes get: the tunable where it puts malloc's
    memory on huge pages ("1", "2"), else None (4 KiB pages, whichever way)."""
    value = malloc_hugetlb()
    return value if value in ("1", "2") else None
