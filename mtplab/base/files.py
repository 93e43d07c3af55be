"""Files mtplab writes and reads back: atomic writes, the checks that an output path can take what a command will
write (made before any work starts), and content digests of large files (a model's weights) remembered by path,
size, times and inode, so that a folder's weights are hashed once, not at every open."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from mtplab.base.paths import cache_root

DIGESTS = "digests.json"  # in the cache: {"path|size|mtime_ns|ctime_ns|inode": sha256 prefix}
KEPT = 4096  # digests remembered (the oldest go first)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write via a temp file in the same folder and rename: readers never see half a file. A symbolic link's target is
    the file written (the link stays); anything else that is not a regular file (a device, a pipe) is refused."""
    path = Path(path)
    if path.is_symlink():
        try:
            path = path.resolve(strict=False)
        except RuntimeError as err:  # a loop of links (Python 3.11 raises RuntimeError)
            raise ValueError(f"{path}: a loop of symbolic links: mtplab writes results to files only") from err
    if path.exists() and not path.is_file():
        raise ValueError(f"{path}: {_kind(path)}, not a regular file: mtplab writes results to files only")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a write that fails (the path is a folder, the disk is full) leaves no temp file behind
        Path(tmp).unlink(missing_ok=True)
        raise


def file_digest(path: str | Path) -> str:
    """The SHA-256 (16 hex digits) of a file's content, computed once per path, size, modification and change time and
    inode."""
    path = Path(path).resolve()
    st = path.stat()
    # ctime and inode change with any write or replacement, even one that keeps the size and sets the mtime back
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
    store = cache_root() / DIGESTS
    try:
        known = json.loads(store.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), str):
        return known[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    known = {k: v for k, v in known.items() if not k.startswith(f"{path}|")}  # this file's older versions
    known[key] = h.hexdigest()[:16]
    try:
        write_atomic(store, json.dumps(dict(list(known.items())[-KEPT:])))
    except OSError:  # a read-only cache: the digest is still right, only not remembered
        pass
    return known[key]


def output_folder_problem(option: str, path) -> str | None:
    """Why a command cannot make or write into the folder `path`, or None: checked before any work starts."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{option} {path}: is a file, not a folder"
    return _writable_problem(option, path, path)


def output_file_problem(option: str, path) -> str | None:
    """Why `path` cannot take a file that a command writes at its end, or None: checked before any work starts."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        return f"{option} {path}: is a folder; give a file path"
    if path.exists() and not path.is_file():  # written by renaming a new file over it: a device would be replaced
        return f"{option} {path}: {_kind(path)}, not a regular file; give a file path"
    try:
        folder = path.resolve().parent
    except (RuntimeError, OSError) as err:  # a loop of symbolic links
        return f"{option} {path}: cannot be followed ({err}); give a file path"
    if not folder.is_dir():  # a mistyped path would leave folders behind: the folder is the user's to make
        return f"{option} {path}: its folder {folder} does not exist; make it first, or give a path in a folder that does"
    return _writable_problem(option, path, folder)


def _kind(path: Path) -> str:
    """What a path that is neither a folder nor a regular file is, in words."""
    if path.is_char_device() or path.is_block_device():
        return "is a device"
    if path.is_fifo():
        return "is a named pipe"
    if path.is_socket():
        return "is a socket"
    return "is not a regular file" if path.exists() else "does not exist"


def _writable_problem(option: str, path: Path, folder: Path) -> str | None:
    """Why `folder` (made where missing) cannot be written into, told as a problem with `option` `path`, or None.
    The nearest existing folder is asked to take a new file, as the write at the end will (file permissions alone do
    not say it: root passes them on a read-only or virtual file system)."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        return f"{option} {path}: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{option} {path}: {existing} is not writable"
    try:
        fd, probe = tempfile.mkstemp(prefix=".mtplab-probe.", dir=existing)
    except OSError as err:
        return f"{option} {path}: {existing} does not take a new file ({err.strerror or err})"
    os.close(fd)
    try:
        Path(probe).unlink(missing_ok=True)
    except OSError as err:  # an append-only folder: the result could not replace an older one either
        return f"{option} {path}: {existing} takes new files but lets none be removed or replaced ({err.strerror or err})"
    return None
