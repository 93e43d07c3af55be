"""Folder locks: a live holder is named and refused; a lock left by a process that is gone is taken over."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mtplab.base.lock import LockedError, folder_lock

HOLD = "import sys, time; from mtplab.base.lock import folder_lock\nwith folder_lock(sys.argv[1], 'x'):\n    print('held', flush=True); time.sleep(60)"


def test_a_live_holder_is_refused_naming_its_pid_and_start_time(tmp_path):
    path = tmp_path / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=rf"locked by another process \(pid {holder.pid}, started 20\d\d-"):
            with folder_lock(path, "the folder"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(path, "the folder"):  # its process gone, the lock is free again
        pass


def test_a_stale_lock_is_taken_over_with_a_message(tmp_path, capsys):
    path = tmp_path / ".lock"
    path.write_text(json.dumps({"pid": 999999, "started": "2026-01-01T00:00:00+00:00"}))  # its process is gone
    with folder_lock(path, "the folder"):
        assert json.loads(path.read_text())["pid"] != 999999
    err = capsys.readouterr().err
    assert "taking over the stale lock on the folder left by pid 999999, started 2026-01-01" in err


def test_a_released_lock_leaves_no_file_and_a_second_holder_can_take_it(tmp_path):
    from mtplab.base.lock import folder_lock

    path = tmp_path / ".sweep.lock"
    with folder_lock(path, "the sweep"):
        assert path.exists()
    assert not path.exists()
    with folder_lock(path, "the sweep", quiet=True):
        assert path.exists()
