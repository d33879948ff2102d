"""Child processes that never outlive the command that started them (layer 0: every layer starts some)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies, even by SIGKILL (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a child started in a session of its own, with everything it started, and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
