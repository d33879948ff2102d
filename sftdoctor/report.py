"""How findings look: a table for people, one JSON document for machines."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from sftdoctor import __version__
from sftdoctor.findings import Finding, Severity

MARKS = {Severity.OK: ("✓", "green"), Severity.INFO: ("i", "cyan"),
         Severity.WARNING: ("!", "yellow"), Severity.ERROR: ("✗", "bold red")}


def summary(findings: list[Finding], skipped: list) -> dict[str, int]:
    counts = Counter(f.severity.value for f in findings)
    return {**{s.value: counts.get(s.value, 0) for s in Severity}, "skipped": len(skipped)}


def summary_line(findings: list[Finding], skipped: list) -> str:
    counts = summary(findings, skipped)
    checks = len({f.id for f in findings}) + len(skipped)
    parts = [f"{counts[s]} {s if counts[s] == 1 or s in ('ok', 'info', 'skipped') else s + 's'}"
             for s in ("error", "warning", "info", "ok", "skipped")]
    return f"{checks} checks: " + ", ".join(parts)


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.severity is Severity.ERROR for f in findings) else 0


def render_table(findings: list[Finding], skipped: list, verbose: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Piped output keeps long lines (grep-able); a terminal wraps to its width.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True, style="bold")
    table.add_column()
    for f in findings:
        mark, style = MARKS[f.severity]
        body = Text(f.title)
        if f.severity.rank >= Severity.WARNING.rank or verbose:
            if f.detail:
                body.append("\n" + f.detail, style="dim")
            if f.fix:
                body.append("\nfix: ", style="bold").append(f.fix)
            if f.severity.rank >= Severity.WARNING.rank:
                body.append(f"\n→ sftdoctor explain {f.explain}", style="cyan")
        table.add_row(Text(mark, style=style), f.id, body)
    for s in skipped:
        table.add_row(Text("-", style="dim"), Text(s.id, style="dim"), Text(f"skipped: {s.reason}", style="dim"))
    console.print(table)
    console.print(summary_line(findings, skipped))


def render_json(findings: list[Finding], skipped: list, facts: dict[str, Any]) -> None:
    doc = {
        "sftdoctor": __version__,
        "summary": summary(findings, skipped),
        "exit_code": exit_code(findings),
        "findings": [f.to_json() for f in findings],
        "skipped": [{"id": s.id, "reason": s.reason} for s in skipped],
        "facts": facts,
    }
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
