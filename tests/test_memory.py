"""mtplab.base.memory: what a process's memory lies on, read and recorded, never set."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mtplab.base import memory


def test_the_kernels_mode_is_the_bracketed_word(tmp_path):
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    assert memory.thp_mode(tmp_path / "enabled") == "madvise"
    assert memory.thp_mode(tmp_path / "missing") is None


def test_the_tunable_is_read_as_glibc_reads_it_and_4k_pages_share_one_calibration(monkeypatch):
    assert memory.hugetlb_of("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2") == "2"
    assert memory.hugetlb_of("glibc.malloc.hugetlbx=1") is None and memory.hugetlb_of("") is None
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    assert memory.calibration_pages() is None  # 4 KiB pages either way: one calibration
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=2")
    assert memory.calibration_pages() == "2" and "reserved huge pages" in memory.huge_pages_summary()


def test_doctor_says_what_pages_a_process_has_and_how_to_ask_for_huge_ones(monkeypatch):
    monkeypatch.setattr(memory, "malloc_hugetlb", lambda: None)
    monkeypatch.setattr(memory, "thp_mode", lambda: "never")
    assert "never" in memory.huge_pages_summary()
    monkeypatch.setattr(memory, "thp_mode", lambda: "madvise")
    assert "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 asks for them" in memory.huge_pages_summary()
    monkeypatch.setattr(memory, "malloc_hugetlb", lambda: "1")
    assert memory.huge_pages_summary().startswith("malloc's memory (glibc.malloc.hugetlb=1")


def test_the_mtplab_command_runs_in_the_process_it_was_started_in_with_the_environment_it_was_given():
    """No start again on other pages: what GLIBC_TUNABLES the user gives is what the command's process has."""
    code = ("import os, sys, json\nimport mtplab.cli.main as m\n"
            "m.main = lambda own_process: print(json.dumps([os.getpid(), os.environ.get('GLIBC_TUNABLES')])) or 0\n"
            "from mtplab.cli.entry import console\nconsole()")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    done = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = done.communicate(timeout=60)
    pid, tunables = json.loads(out.strip().splitlines()[-1])
    assert pid == done.pid and tunables == "glibc.malloc.arena_max=2"
