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
