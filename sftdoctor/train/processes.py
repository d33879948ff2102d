"""The workers' processes: started in a session of their own, stopped together.

A Ctrl-C reaches the launcher alone (the workers are not in the terminal's process group); the launcher
then stops every process it started: torchrun and each rank, which torchrun starts in sessions of their
own, found through /proc. Linux.
"""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from sftdoctor.train.console import Console

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's 128 + signal number
GRACE_S = 10.0  # after SIGTERM, what the ranks get to finish before SIGKILL


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies, even by SIGKILL (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc (torchrun starts each rank in a session of its own, so no
    process group holds them all)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            out.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            out.append(pid)
    return out


def stop_workers(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """Stop the launcher's child and every process under it; returns once none is left. torchrun goes first, by
    SIGKILL (on SIGTERM it prints a traceback, and it could restart ranks); then SIGTERM to the ranks, SIGKILL
    to those still there after the grace period."""
    ranks = descendants(proc.pid)
    proc.kill()
    proc.wait()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in _alive(ranks):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while _alive(ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _alive(ranks):
            return


def _terminal_like(fd: int) -> tuple[int, int]:
    """A pseudo-terminal for the workers' output, the user's terminal's size: rank 0 then draws its progress bar
    as it would on the terminal itself. Returns the side the launcher reads; `fd` becomes the workers' side."""
    master, worker = pty.openpty()
    attrs = termios.tcgetattr(worker)
    attrs[1] &= ~termios.ONLCR  # "\n" stays "\n" in train.log
    termios.tcsetattr(worker, termios.TCSANOW, attrs)
    try:
        fcntl.ioctl(worker, termios.TIOCSWINSZ, fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        pass
    return master, worker


def _pump(fd: int, console: Console) -> None:
    """Everything the workers write, until the last of them has closed its side (EIO on a pseudo-terminal)."""
    try:
        while data := os.read(fd, 1 << 16):
            console.feed(data)
    except OSError:
        pass
    finally:
        os.close(fd)


def run_workers(argv: list[str], env: dict[str, str], log: Path, echo: bool = False) -> tuple[int, int | None]:
    """(exit code, the signal that stopped the run or None). Every byte the workers write goes to `log`, and
    with `echo` to the terminal too (console.Console). The workers start in a session of their own, so a
    Ctrl-C reaches the launcher alone, which then stops every process it started instead of orphaning them."""
    received: list[int] = []
    terminal = sys.stdout.buffer if echo else None
    read, write = _terminal_like(sys.stdout.fileno()) if echo and sys.stdout.isatty() else os.pipe()
    with open(log, "ab") as sink:
        console = Console(sink, terminal)
        try:
            proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=_die_with_parent,
                                    stdin=subprocess.DEVNULL, stdout=write, stderr=subprocess.STDOUT)
        finally:
            os.close(write)
        reader = threading.Thread(target=_pump, args=(read, console), daemon=True)
        reader.start()
        previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in SIGNAL_EXIT}
        try:
            while proc.poll() is None and not received:
                time.sleep(0.2)
            if received:
                stop_workers(proc)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            reader.join(timeout=10)  # a process that escaped stop_workers may hold the pipe: do not wait on it
            console.close()
    return proc.wait(), received[0] if received else None
