"""Exclusive folder locks: one sweep per results folder, one build per model cache key.

The lock is an `flock` on a file holding the holder's pid and start time. The kernel releases it
when the holder dies, however it dies, so a lock file whose lock is free was left by a process
that is gone: it is taken over, with a message naming the previous holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path


class LockedError(ValueError):
    """Another live process holds the lock."""


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _describe(holder: dict) -> str:
    return f"pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"


@contextmanager
def folder_lock(path: str | Path, what: str, wait: float = 0.0, quiet: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on the file `path` for the block.

    wait=0 refuses at once (LockedError naming the holder's pid and start time); wait>0 waits up
    to that many seconds for the holder to finish. A stale lock is taken over with a message on
    stderr unless quiet.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise LockedError(
                    f"{what} is locked by another process ({_describe(_holder(path))}); "
                    f"wait for it to finish, or stop it (lock file {path})"
                ) from None
            time.sleep(0.1)
            continue
        try:  # the holder before us may have removed the file on release: lock the file the path names now
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        stale = _holder(path)
        if stale.get("pid") and not quiet:
            print(f"taking over the stale lock on {what} left by {_describe(stale)}, which is gone", file=sys.stderr)
        me = {"pid": os.getpid(), "started": datetime.now(UTC).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):  # released cleanly: no file left behind
                os.unlink(path)  # (a waiter re-checks that the path still names the file it locked)
    finally:
        os.close(fd)
