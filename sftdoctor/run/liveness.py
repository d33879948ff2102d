"""Whether a run is still going: node 0's launcher marks its run directory while `sftdoctor train` runs (live.json:
its host, pid and the pid's start time) and removes the mark when the command ends, however it ends (a watcher's
stop, a failure, Ctrl-C or SIGTERM, which the launcher forwards and waits out). `report --follow` reads it.

Why a mark and not the run directory alone: a run that crashed or was stopped by a signal leaves nothing there
that says it ended (stopped.json is a watcher's stop only, final/ a complete run's), and "no write for a while"
cannot tell a crash from a slow step or a long evaluation. A launcher killed with SIGKILL leaves its mark: on
its own host the pid and its start time tell that it is gone (a pid is reused, the pair is not, as
sweep/study.py's workers); on another host the mark is trusted, so follow a run from node 0's host.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sftdoctor.files import write_atomic
from sftdoctor.run.layout import LIVE


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None when there is no such
    process, or only its exit status is left for its parent to read (a zombie, state Z), or no /proc (not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def me() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_start": process_start(pid)}


@contextlib.contextmanager
def marked(run_dir: Path, owner: bool = True) -> Iterator[None]:
    """The run directory marked live for the block (node 0's launcher only: `owner`). The mark is removed on the
    way out only while it is still this process's own (a later `train` on the same folder may have marked it)."""
    if not owner:
        yield
        return
    path, mine = Path(run_dir) / LIVE, me()
    write_atomic(path, json.dumps(mine) + "\n")
    try:
        yield
    finally:
        if _read(path) == mine:
            path.unlink(missing_ok=True)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def over(run_dir: Path) -> str | None:
    """None while the run's launcher is there (or cannot be told gone); otherwise why the run is over."""
    path = Path(run_dir) / LIVE
    if not os.path.lexists(path):
        return "its launcher is done"
    mark = _read(path)
    if not isinstance(mark, dict) or not isinstance(mark.get("pid"), int):
        return None  # not written by a launcher (written whole by one): not taken as an end it does not say
    if mark.get("host") != socket.gethostname() or not os.path.isdir("/proc"):
        return None  # another host's process cannot be looked at from here
    if process_start(mark["pid"]) != mark.get("pid_start"):
        return f"its launcher (pid {mark['pid']}) is gone without removing {LIVE} (killed?)"
    return None
