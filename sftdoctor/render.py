"""How findings look: aligned rows for people, one JSON document for machines.

Plain text with ANSI colours on a terminal (rich costs the CLI ~40 ms of start-up, a third of it).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from collections import Counter
from typing import Any, TextIO

from sftdoctor import __version__
from sftdoctor.facts.run_records import json_safe
from sftdoctor.findings import Finding, Severity

MARKS = {
    Severity.OK: ("✓", "32"),
    Severity.INFO: ("i", "36"),
    Severity.WARNING: ("!", "33"),
    Severity.ERROR: ("✗", "1;31"),
}
SKIP_MARK = "-"
SILENCED_MARK = "~"


def summary(findings: list[Finding], skipped: list) -> dict[str, int]:
    """Findings by severity, the silenced ones apart (whatever their severity): they count toward nothing."""
    counts = Counter(f.severity.value for f in findings if not f.silenced)
    silenced = sum(f.silenced for f in findings)
    return {**{s.value: counts.get(s.value, 0) for s in Severity}, "skipped": len(skipped), "silenced": silenced}


def summary_line(findings: list[Finding], skipped: list) -> str:
    counts = summary(findings, skipped)
    checks = len({f.id.partition("/")[0] for f in findings}) + len(skipped)  # `id/slug`: one of the check's messages
    plural = {"error": "errors", "warning": "warnings"}
    parts = [
        f"{counts[s]} {plural.get(s, s) if counts[s] != 1 else s}"
        for s in ("error", "warning", "info", "ok", "skipped")
    ]
    if counts["silenced"]:
        parts.append(f"{counts['silenced']} silenced")
    return f"{checks} check{'' if checks == 1 else 's'}: " + ", ".join(parts)


def silenced_line(ids) -> str:
    """The ids a run silenced, as its summary at the end of `train` and `sftdoctor report` say them."""
    return f"{', '.join(ids)} ([checks] disable, --disable): shown marked silenced, never counted"


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.severity is Severity.ERROR and not f.silenced for f in findings) else 0


class _Style:
    def __init__(self, out: TextIO):
        self.on = out.isatty() and "NO_COLOR" not in os.environ

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on and text else text


def render_table(
    findings: list[Finding], skipped: list, verbose: bool = False, out: TextIO | None = None, with_summary: bool = True
) -> None:
    out = out or sys.stdout
    style = _Style(out)
    ids = [f.id for f in findings] + [s.id for s in skipped]
    id_width = max(map(len, ids), default=0)
    indent = " " * (3 + id_width + 2)
    # A terminal wraps to its width; files and pipes keep whole lines (grep-able).
    width = shutil.get_terminal_size().columns if out.isatty() else None

    def block(text: str, code: str | None = None) -> list[str]:
        lines = textwrap.wrap(text, max(width - len(indent), 20), break_on_hyphens=False) if width else [text]
        return [style(line, code) if code else line for line in lines]

    for f in findings:
        mark, colour = (SILENCED_MARK, "2") if f.silenced else MARKS[f.severity]
        body = block(f"silenced {f.severity.value}: {f.title}" if f.silenced else f.title)
        if f.severity.rank >= Severity.WARNING.rank or verbose:
            if f.detail:
                body += block(f.detail, "2")
            if f.fix:
                body += block("fix: " + f.fix)
            if f.severity.rank >= Severity.WARNING.rank:
                body += block(f"→ {f.explain_command}", "36")
        out.write(f"{style(mark, colour)}  {style(f.id.ljust(id_width), '1')}  {body[0]}\n")
        out.writelines(f"{indent}{line}\n" for line in body[1:])
    for s in skipped:
        out.write(style(f"{SKIP_MARK}  {s.id.ljust(id_width)}  skipped: {s.reason}", "2") + "\n")
    if with_summary:
        out.write(summary_line(findings, skipped) + "\n")


def render_json(findings: list[Finding], skipped: list, facts: dict[str, Any]) -> None:
    sys.stdout.write(json_text(findings, skipped, facts))


def json_text(findings: list[Finding], skipped: list, facts: dict[str, Any]) -> str:
    """The JSON document `check --json` prints (and `sftdoctor mcp`'s check tool answers), newline included."""
    doc = {
        "sftdoctor": __version__,
        "summary": summary(findings, skipped),
        "exit_code": exit_code(findings),
        "findings": [f.to_json() for f in findings],
        "skipped": [{"id": s.id, "reason": s.reason} for s in skipped],
        "facts": facts,
    }
    # strict JSON (a NaN in some evidence as the string "NaN"): what is printed here is read back as a snapshot
    return json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"
