"""mtplab.base.memory: a process started again with malloc's memory on huge pages, where it can be and only once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mtplab.base import memory
from mtplab.base.memory import huge_pages_environ

GLIBC = (2, 36)


def test_the_tunable_is_added_beside_the_users_own():
    env = huge_pages_environ({"PATH": "/bin"}, "madvise", GLIBC)
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    env = huge_pages_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("environ, mode, glibc", [
    ({"MTPLAB_HUGE_PAGES": "0"}, "madvise", GLIBC),  # opted out
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC),  # the user's own choice
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "madvise", GLIBC),  # started so already: no second start
    ({}, "madvise", (2, 34)),  # a glibc without the tunable
    ({}, "madvise", None),  # another C library
    ({}, "always", GLIBC),  # every process has them already
    ({}, "never", GLIBC),  # none can
    ({}, None, GLIBC),  # a kernel without them
])
def test_nothing_changes_where_it_is_not_wanted_or_cannot_work(environ, mode, glibc):
    assert huge_pages_environ(environ, mode, glibc) is None


def test_the_kernels_mode_is_the_bracketed_word(tmp_path):
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    assert memory.thp_mode(tmp_path / "enabled") == "madvise"
    assert memory.thp_mode(tmp_path / "missing") is None


def test_a_sweep_passes_the_setting_to_the_processes_it_starts_and_puts_its_own_back(monkeypatch):
    monkeypatch.delenv("MTPLAB_HUGE_PAGES")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    monkeypatch.setattr(memory, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(memory, "glibc_version", lambda: GLIBC)
    with memory.huge_pages_for_children():
        assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
        assert memory.malloc_hugetlb() == memory.calibration_pages() == "1"
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2" and memory.calibration_pages() is None


@pytest.mark.parametrize("value", ["0", "no", "False", "off"])
def test_each_way_of_saying_no_opts_out(value):
    assert memory.opted_out({"MTPLAB_HUGE_PAGES": value})
    assert huge_pages_environ({"MTPLAB_HUGE_PAGES": value}, "madvise", GLIBC) is None


def test_the_tunable_is_read_as_glibc_reads_it_and_4k_pages_share_one_calibration(monkeypatch):
    assert memory.hugetlb_of("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2") == "2"
    assert memory.hugetlb_of("glibc.malloc.hugetlbx=1") is None and memory.hugetlb_of("") is None
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    assert memory.calibration_pages() is None  # 4 KiB pages either way: one calibration
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=2")
    assert memory.calibration_pages() == "2" and "reserved huge pages" in memory.huge_pages_summary()


# 64 MiB from malloc, touched, as onnxruntime allocates its weights (numpy asks for huge pages for its own arrays)
CHILD = """
import ctypes, json
from mtplab.base.memory import huge_pages, reexec
reexec()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.memset.argtypes = ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
libc.memset(libc.malloc(64 << 20), 1, 64 << 20)
print(json.dumps(huge_pages()))
"""


def _child(**env) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("MTPLAB_HUGE_PAGES", "GLIBC_TUNABLES")} | env
    out = subprocess.run([sys.executable, "-c", CHILD], env=environ, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(huge_pages_environ({}, memory.thp_mode(), memory.glibc_version()) is None,
                    reason="this machine gives no huge pages on request (glibc >= 2.35, THP madvise)")
def test_a_program_started_again_has_its_arrays_on_huge_pages_and_an_opted_out_one_not():
    on = _child()
    assert on["malloc_hugetlb"] == "1" and on["anon_huge_mib"] >= 32, on
    off = _child(MTPLAB_HUGE_PAGES="0")
    assert off["malloc_hugetlb"] is None and off["anon_huge_mib"] < 32, off


def test_doctor_says_why_a_process_has_no_huge_pages(monkeypatch):
    monkeypatch.setattr(memory, "malloc_hugetlb", lambda: None)
    monkeypatch.setattr(memory, "thp_mode", lambda: "never")
    assert "never" in memory.huge_pages_summary()
    monkeypatch.setattr(memory, "thp_mode", lambda: "madvise")
    assert memory.huge_pages_summary() == "off: MTPLAB_HUGE_PAGES=0"  # the suite's own setting (conftest)
    monkeypatch.setattr(memory, "malloc_hugetlb", lambda: "1")
    assert memory.huge_pages_summary().startswith("malloc's memory (glibc.malloc.hugetlb=1")


def test_a_benchmark_starts_children_on_either_kind_of_page(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    huge, small = memory.huge_pages_env(), memory.small_pages_env()
    assert huge["GLIBC_TUNABLES"].endswith("glibc.malloc.hugetlb=1") and "MTPLAB_HUGE_PAGES" not in huge
    assert small["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2" and small["MTPLAB_HUGE_PAGES"] == "0"
    monkeypatch.setattr(memory, "thp_mode", lambda: "never")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert memory.huge_pages_env() is None  # a kernel that gives none: no side to set beside 4 KiB
