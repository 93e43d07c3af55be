"""This machine's memory, as /proc/meminfo tells it, and the pages a process's memory lies on.

Huge pages. A decode streams every weight once a token; on 4 KiB pages that is a TLB miss every few cache lines
and a physical placement that each process draws anew. With glibc's malloc asking for transparent huge pages
(2 MiB: `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, glibc 2.35 on, where the kernel gives them on request,
/sys/kernel/mm/transparent_hugepage/enabled = madvise), onnxruntime's weights and buffers lie on huge pages. On
`small` at 2 threads, processes taking turns: greedy 1.022x [0.955, 1.108] and 1.05x [0.99, 1.09] in two runs of
benchmarks/process_spread.py --pages both (a few percent, every CI reaching 1.0), the speculative side 1.00x, and in
one pair of demos the efficiency stopped following each point's greedy draw (README, Benchmarks). glibc reads the setting when a process starts, so the `mtplab` command and the benchmarks start
themselves again with it (`reexec`), and a sweep's points, calibrations and notebooks inherit it.
MTPLAB_HUGE_PAGES=0 (no, false, off) keeps 4 KiB pages; a GLIBC_TUNABLES that already sets glibc.malloc.hugetlb
is left as it is.
What a process ran on is in its results' env (`huge_pages`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "MTPLAB_HUGE_PAGES"  # "0": leave the pages as they are
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


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


def thp_mode(path: Path = THP_MODE) -> str | None:
    """The kernel's transparent huge pages mode (always, madvise, never); None where it has none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, int] | None:
    """This process's glibc (major, minor); None under another C library."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def tunable_known(glibc: tuple[int, int] | None) -> bool:
    """Whether this C library reads glibc.malloc.hugetlb (glibc 2.35 on)."""
    return glibc is not None and glibc >= (2, 35)


def hugetlb_of(tunables: str) -> str | None:
    """glibc.malloc.hugetlb's value in a GLIBC_TUNABLES string (None: not set there)."""
    values = [t.partition("=")[2] for t in tunables.split(":") if t.partition("=")[0] == TUNABLE]
    return values[-1] if values else None


def opted_out(environ: Mapping[str, str]) -> bool:
    """Whether MTPLAB_HUGE_PAGES says to leave the pages as they are (0, no, false, off)."""
    return environ.get(OPT_OUT, "").strip().lower() in ("0", "no", "false", "off")


def huge_pages_environ(environ: Mapping[str, str], mode: str | None, glibc: tuple[int, int] | None) -> dict | None:
    """The environment a process started with would have malloc's memory on huge pages; None where nothing is to
    change: opted out, glibc.malloc.hugetlb already set, a C library without the tunable (before glibc 2.35), or
    a kernel that gives them on request only (mode madvise: under always every process has them, under never
    none can)."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if opted_out(environ) or hugetlb_of(tunables) is not None or not tunable_known(glibc) or mode != "madvise":
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(t for t in (tunables, f"{TUNABLE}=1") if t)}


def reexec() -> None:
    """Start this process again with malloc's memory on huge pages, where they are not on yet and can be (see the
    module's docstring); else return. Call it first thing in a program's entry point: it replaces the process."""
    env = huge_pages_environ(os.environ, thp_mode(), glibc_version())
    if env is not None and sys.executable:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
        except OSError:  # an interpreter that cannot be started again by its path: this one goes on, on 4 KiB pages
            pass


@contextmanager
def huge_pages_for_children():
    """While it lasts, the processes this one starts (a sweep's calibrations and points) have malloc's memory on huge
    pages where they can; this process keeps the pages it has, and its environment is put back after."""
    env = huge_pages_environ(os.environ, thp_mode(), glibc_version())
    if env is None:
        yield
        return
    before = os.environ.get("GLIBC_TUNABLES")
    os.environ["GLIBC_TUNABLES"] = env["GLIBC_TUNABLES"]
    try:
        yield
    finally:
        if before is None:
            del os.environ["GLIBC_TUNABLES"]
        else:
            os.environ["GLIBC_TUNABLES"] = before


def huge_pages_env() -> dict | None:
    """The environment (this one's, the opt-out left out) a child process started with has malloc's memory on huge
    pages; None where malloc gives none on request. A benchmark's side by side with small_pages_env."""
    env, mode = {k: v for k, v in os.environ.items() if k != OPT_OUT}, thp_mode()
    if hugetlb_of(env.get("GLIBC_TUNABLES", "")) == "1" and mode == "madvise":
        return env
    return huge_pages_environ(env, mode, glibc_version())


def small_pages_env() -> dict:
    """This environment less glibc.malloc.hugetlb, opted out: a child process started with it keeps 4 KiB pages."""
    tunables = ":".join(t for t in os.environ.get("GLIBC_TUNABLES", "").split(":")
                        if t and t.partition("=")[0] != TUNABLE)
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | {OPT_OUT: "0"}
    return env | ({"GLIBC_TUNABLES": tunables} if tunables else {})


def anon_huge_mib() -> float | None:
    """This process's anonymous memory on transparent huge pages now, in MiB; None where the kernel does not say."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def malloc_hugetlb() -> str | None:
    """glibc.malloc.hugetlb as GLIBC_TUNABLES gives it to this process's children (None: unset); the process itself
    started with it too unless it set it later (huge_pages_for_children, in a sweep's process, which runs no
    session)."""
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
    if malloc is not None:
        return f"off: GLIBC_TUNABLES sets glibc.malloc.hugetlb={malloc}"
    if opted_out(os.environ):
        return f"off: {OPT_OUT}={os.environ[OPT_OUT]}"
    if not tunable_known(glibc_version()):
        return "off: this C library has no glibc.malloc.hugetlb (glibc 2.35 on)"
    return "off in this process (the mtplab command and the benchmarks start themselves with them)"


def calibration_pages() -> str | None:
    """What a calibration's cache key holds of the pages its sweep's processes get: the tunable where it puts malloc's
    memory on huge pages ("1", "2"), else None (4 KiB pages, whichever way)."""
    value = malloc_hugetlb()
    return value if value in ("1", "2") else None
