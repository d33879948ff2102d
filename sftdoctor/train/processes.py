"""The workers' processes: started in a session of their own, stopped together.

A Ctrl-C reaches the launcher alone (the workers are not in the terminal's process group); the launcher
then stops every process it started: torchrun and each rank, which torchrun starts in sessions of their
own, found through /proc. Linux.
"""

from __future__ import annotations

import contextlib
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

from sftdoctor.children import die_with_parent
from sftdoctor.train.console import Console

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's 128 + signal number
GRACE_S = 10.0  # after SIGTERM, what the ranks get to finish before SIGKILL


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc (torchrun starts each rank in a session of its own, so no
    process group holds them all)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdecimal():
            ppid = _parent(int(entry.name))
            if ppid is not None:
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


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop_workers(
    proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = GRACE_S, launcher: bool = True
) -> None:
    """Stop the launcher's child and every process under it; returns once none is left. A `launcher` child
    (torchrun) goes first, by SIGKILL: on a signal it would kill the ranks after its own timeout, and it could
    restart them. The ranks alone then get `sig` (on SIGTERM they save a checkpoint if it fits,
    sftdoctor.train.stopping; on SIGINT they stop now; a rank's own helpers are its business), and every
    process still there after `grace_s` gets SIGKILL."""
    everything = descendants(proc.pid)
    if launcher:
        ranks = [pid for pid in everything if _parent(pid) == proc.pid]
        proc.kill()
        proc.wait()
    else:
        ranks = [proc.pid]
        everything.insert(0, proc.pid)
    _signal(_alive(ranks), sig)
    for pids, wait in ((ranks, grace_s), (everything, 5.0)):
        deadline = time.monotonic() + wait
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
            if not launcher:
                proc.poll()  # reap the rank itself, or it stays on as a zombie
        if not _alive(everything):
            return
        _signal(_alive(everything), signal.SIGKILL)


def _terminal_like(fd: int) -> tuple[int, int]:
    """A pseudo-terminal for the workers' output, the user's terminal's size: rank 0 then draws its progress bar
    as it would on the terminal itself. Returns the side the launcher reads; `fd` becomes the workers' side."""
    master, worker = pty.openpty()
    attrs = termios.tcgetattr(worker)
    attrs[1] &= ~termios.ONLCR  # "\n" stays "\n" in train.log
    termios.tcsetattr(worker, termios.TCSANOW, attrs)
    with contextlib.suppress(OSError):
        fcntl.ioctl(worker, termios.TIOCSWINSZ, fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
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


def run_workers(
    argv: list[str], env: dict[str, str], log: Path, echo: bool = False, grace_s: float = GRACE_S, launcher: bool = True
) -> tuple[int, int | None]:
    """(exit code, the signal that stopped the run or None). Every byte the workers write goes to `log`, and
    with `echo` to the terminal too (console.Console). The workers start in a session of their own, so a
    Ctrl-C reaches the launcher alone, which then stops every process it started instead of orphaning them.
    After SIGTERM the ranks get `grace_s` to save and stop; after Ctrl-C, GRACE_S. `launcher`: the child is
    torchrun, not the only rank."""
    received: list[int] = []
    terminal = sys.stdout.buffer if echo else None
    read, write = _terminal_like(sys.stdout.fileno()) if echo and sys.stdout.isatty() else os.pipe()
    with open(log, "ab") as sink:
        console = Console(sink, terminal)
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
                stdin=subprocess.DEVNULL,
                stdout=write,
                stderr=subprocess.STDOUT,
            )
        finally:
            os.close(write)
        reader = threading.Thread(target=_pump, args=(read, console), daemon=True)
        reader.start()

        def stop(signum, frame):
            console.stopping = True  # from now on the ranks' dying words go to the log alone
            received.append(signum)

        previous = {sig: signal.signal(sig, stop) for sig in SIGNAL_EXIT}
        try:
            while proc.poll() is None and not received:
                time.sleep(0.2)
            if received:
                sig = received[0]
                stop_workers(proc, sig, grace_s if sig == signal.SIGTERM else GRACE_S, launcher)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            reader.join(timeout=10)  # a process that escaped stop_workers may hold the pipe: do not wait on it
            console.close()
    return proc.wait(), received[0] if received else None
