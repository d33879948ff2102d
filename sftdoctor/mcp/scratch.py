"""The server's one writable place: a temporary folder for everything the tools would otherwise write, removed
when the server stops (on stdin's end, Ctrl-C or SIGTERM; a SIGKILL leaves it in $TMPDIR as sftdoctor-mcp-*)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


def redirected(folder: Path) -> dict[str, str]:
    """The variables that send a tool's writes (and its child processes') into `folder`: the probe cache
    (facts/probe_cache.py; "off" stays off), the datasets library's Arrow cache (a data probe's load_dataset),
    transformers' copies of remote code, matplotlib's font cache (report's panels), and Python's bytecode files."""
    cache = "off" if os.environ.get("SFTDOCTOR_CACHE") == "off" else str(folder / "probes")
    return {
        "SFTDOCTOR_CACHE": cache,
        "HF_DATASETS_CACHE": str(folder / "datasets"),
        "HF_MODULES_CACHE": str(folder / "modules"),
        "MPLCONFIGDIR": str(folder / "matplotlib"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A fresh temporary folder with redirected()'s variables set in this process (its children inherit them);
    on the way out the variables are put back as they were and the folder is removed."""
    folder = Path(tempfile.mkdtemp(prefix="sftdoctor-mcp-"))
    settings = redirected(folder)
    before = {name: os.environ.get(name) for name in settings}
    bytecode = sys.dont_write_bytecode
    os.environ.update(settings)
    sys.dont_write_bytecode = True
    try:
        yield folder
    finally:
        sys.dont_write_bytecode = bytecode
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)
