"""Files written whole or not at all (layer 0: every layer writes some)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """`data` into a temporary file beside `path` (unique to this process), then renamed onto it: a reader never
    sees half a file, and on any error (or Ctrl-C) the temporary file is removed and `path` left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def folder_problem(path: Path) -> str | None:
    """Why a command could not make (or write in) the folder `path`, or None: it exists and is not a folder (a
    file, a FIFO, /dev/null, a dangling or looping link), the nearest part of it that exists is not a folder, or
    that part is not writable. Decided before any work, so that a run or a sweep is refused instead of failing in
    `mkdir` after its checks."""
    path = Path(os.path.abspath(path))
    existing = path
    while True:  # the nearest part of the path that is there
        try:
            os.lstat(existing)
            break
        except (FileNotFoundError, NotADirectoryError):  # not there, or under a file: look further up
            if existing == existing.parent:
                break
            existing = existing.parent
        except OSError as exc:  # a folder on the way that this user may not enter
            return f"{existing} cannot be looked at ({exc.strerror or exc}), so {path} cannot be made"
    if existing == path and not os.path.isdir(path):
        return f"{path} exists and is not a folder"
    if not os.path.isdir(existing):
        return f"{existing} is not a folder, so {path} cannot be made in it"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user (uid {os.geteuid()})" + (
            "" if existing == path else f", so {path} cannot be made in it"
        )
    return None
