"""What every `sftdoctor` command owes its user on any input, checked in-process (CliRunner) by the fuzzers:
a verdict (exit 0 or 1) or a refusal (exit 2) of one line per problem, each "sftdoctor: error: ..." naming
the file or option at fault; no uncaught exception and no traceback; nothing left behind in the inputs'
folder; no child process outliving the command."""

from __future__ import annotations

import inspect
import os
import re
import traceback
from pathlib import Path

from click.testing import CliRunner

from sftdoctor.cli import main

ERROR = "sftdoctor: error: "
ENV = {"SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
# click < 8.2 mixes stderr into stdout unless told; 8.2+ keeps result.stderr apart and has no mix_stderr.
if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:  # pragma: no cover
    RUNNER = CliRunner(env=ENV, mix_stderr=False)
else:
    RUNNER = CliRunner(env=ENV)

TRACEBACK = "Traceback (most recent call last)"


def _tree(root: Path) -> set[tuple[str, object]]:
    return {(p.relative_to(root).as_posix(), "dir" if p.is_dir() else p.lstat().st_size) for p in root.rglob("*")}


def _children() -> set[int]:
    try:
        import psutil
    except ImportError:  # pragma: no cover
        found, me = set(), os.getpid()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    status = Path("/proc", entry, "status").read_text()
                except OSError:
                    continue
                if re.search(rf"^PPid:\s+{me}$", status, re.MULTILINE):
                    found.add(int(entry))
        return found
    return {p.pid for p in psutil.Process().children(recursive=True)}


def sftdoctor(args, root: Path, names, input=None):
    """Run the CLI on inputs in `root`; a refusal's every line must name one of `names` (files or options)."""
    args = [str(a) for a in args]
    before, procs = _tree(root), _children()
    result = RUNNER.invoke(main, args, input=input)
    shown = (
        f"$ sftdoctor {' '.join(args)}\n[exit {result.exit_code}]\n--- stdout\n{result.stdout[-3000:]}\n"
        f"--- stderr\n{result.stderr[-3000:]}"
    )
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        shown += "\n--- uncaught\n" + "".join(traceback.format_exception(*result.exc_info))[-4000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), shown
    assert result.exit_code in (0, 1, 2), shown
    # Python's own header of a traceback: a kb topic may name the word (nccl-error's grep for "Traceback")
    assert TRACEBACK not in result.stdout and TRACEBACK not in result.stderr, shown
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert lines, shown
        for line in lines:
            assert line.startswith(ERROR), f"not an error line: {line!r}\n{shown}"
            assert any(str(n) in line for n in names), f"names none of {[str(n) for n in names]}: {line!r}\n{shown}"
    after = _tree(root)
    assert after == before, f"left behind: {sorted(after - before)}, gone: {sorted(before - after)}\n{shown}"
    survivors = _children() - procs
    assert not survivors, f"child processes survived: {survivors}\n{shown}"
    return result
