"""Child processes of the GPU suite: each with a timeout, its output kept in a log file, and on timeout (or when
the suite itself is interrupted) killed with every process below it.

`sftdoctor train` starts torchrun and the ranks in sessions of their own, so no process group holds them all:
the tree is read from /proc before anything is killed (a killed parent's children are re-parented to init and
could not be found any more).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from sftdoctor.train.processes import descendants  # the launcher's own walk of /proc

TAIL_LINES = 25
HISTORY: list[dict] = []  # every child run: its log name, seconds and exit code (None: killed at its timeout)


class ChildFailed(Exception):
    """A child exited with an unexpected code or ran past its timeout: one line, plus the tail of its output."""

    def __init__(self, line: str, tail: str = ""):
        super().__init__(line)
        self.line, self.tail = line, tail


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child, its session's process group and every process below it, by their ids."""
    tree = descendants(proc.pid)
    for pid in [proc.pid, *tree]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # started with start_new_session: its group id is its pid
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def run(
    cmd: list[str],
    log: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    ok: tuple[int, ...] = (0,),
) -> tuple[int, str, str]:
    """Run `cmd` to its end or `timeout` seconds; (exit code, stdout, stderr). stdout goes to LOG.out and stderr
    to LOG.err (files, so a chatty child can never block on a full pipe). An exit code not in `ok` or a timeout
    raises ChildFailed with the output's tail."""
    name = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd[:4]))
    if timeout <= 1:
        raise ChildFailed(f"{name}: no time left in the budget to start it")
    log.parent.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log.with_suffix(".out"), log.with_suffix(".err")
    began = time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:  # timed out, or the suite's own alarm interrupted the wait
                kill_tree(proc)
    HISTORY.append(
        {"log": log.name, "seconds": round(time.monotonic() - began, 1), "exit": code, "timeout_s": round(timeout, 1)}
    )
    stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    if code is None:
        raise ChildFailed(
            f"{name}: killed after {time.monotonic() - began:.0f} s (its timeout)", tail(stdout + "\n" + stderr)
        )
    if code not in ok:
        raise ChildFailed(f"{name}: exit {code}", tail(stdout + "\n" + stderr))
    return code, stdout, stderr
