"""The one way a probe runs in a child process: its imports (torch, transformers, DeepSpeed, lm-eval) stay
out of the command's own process, which `check` keeps light, and a child that hangs or crashes is a fact
about the probe, never a crash of the command.

The parent sends the request as JSON on the child's stdin; the child (`serve`) answers one JSON object on
its last line of stdout. The child runs in a session of its own and dies with its parent; on a timeout, an
error or Ctrl-C its whole process group is killed. Every failure has one shape: {"error": "..."}.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from sftdoctor.children import die_with_parent, kill_group


def in_child(module: str, request: Any, what: str, timeout_s: float) -> dict[str, Any]:
    """`python -m MODULE`'s answer to `request`, or {"error": WHAT took over N s | WHAT failed: its last words}."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    try:
        out, err = proc.communicate(json.dumps(request), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return {"error": f"{what} took over {timeout_s:.0f} s"}
    except BaseException:  # Ctrl-C, SIGTERM turned KeyboardInterrupt: nothing is left behind
        kill_group(proc)
        raise
    try:
        answer = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        answer = None
    if not isinstance(answer, dict):
        return {"error": f"{what} failed: {(err.strip().splitlines() or ['no output'])[-1]}"}
    return answer


def serve(answer: Callable[[Any], dict[str, Any]]) -> None:
    """The child's side: the request from stdin, the answer (or {"error": TYPE: its first line}) on stdout."""
    try:
        result = answer(json.loads(sys.stdin.read()))
    except Exception as exc:  # reported as a fact, never a crash of the caller
        result = {"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"}
    print(json.dumps(result))
