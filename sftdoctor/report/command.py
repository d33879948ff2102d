"""`sftdoctor report RUN [RUN...]`: read the runs, run the curve readers, draw the panels, write the page.

Also what `sftdoctor train` calls at the end of every run. What it writes appears whole or not at all: the
panels go to a folder beside, renamed into place, then the page. The curve readers' findings replace the
run's earlier post-run records in its findings.jsonl, so a report made twice records them once.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sftdoctor.checks import Skipped, load_checks, run_checks
from sftdoctor.errors import InputError, interruptible, read_text
from sftdoctor.facts.catalogue import fact_names
from sftdoctor.facts.run_records import json_safe, non_finite, read_run, said
from sftdoctor.files import write_atomic
from sftdoctor.findings import Finding, Severity
from sftdoctor.render import exit_code, render_table, silenced_line
from sftdoctor.report import page
from sftdoctor.report.panels import COLOURS, Axis, PlottedRun, render, shown
from sftdoctor.run import layout

AXES = ("step", "tokens")


class PostrunFacts:
    """The one fact the post-run checks read."""

    def __init__(self, curves: dict[str, Any]):
        self.curves = curves

    def known(self, name: str) -> bool:
        return name in fact_names("postrun")

    def get(self, name: str) -> Any:
        return self.curves if name == "curves" else None

    def why_missing(self, name: str) -> str:
        return f"a post-run check has only the run's curves, not {name}"


@dataclass
class Judged:
    run: PlottedRun  # with every finding of the run, as findings.jsonl has them, the curve readers' included
    verdicts: list[Finding]  # the curve readers'
    skipped: list[Skipped]


def judge(curves: dict[str, Any], plugins: bool = True) -> tuple[list[Finding], list[Skipped]]:
    """The post-run checks (built-in and third-party) on one run's curves."""
    return run_checks(load_checks(plugins).phase("postrun"), PostrunFacts(curves))


def postrun_records(findings: list[Finding]) -> list[dict[str, Any]]:
    return [{"phase": "postrun", "step": f.evidence.get("step"), "time": time.time(), **f.to_json()} for f in findings]


def _records(path: Path, live: bool = False) -> list[tuple[int, str, dict[str, Any] | None]]:
    """findings.jsonl's lines (number, text), each with its finding record, or None for a line that is not one
    (a writer killed mid-line, a hand edit). A file that cannot be read is refused: the report rewrites it.
    `live`: the run is still writing (`report --follow`), so a last line without its newline is one being
    written, left for the next reading."""
    if not os.path.lexists(path):
        return []
    text, out = read_text(path, "findings record"), []
    if live and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        usable = isinstance(record, dict) and isinstance(record.get("title"), str)
        out.append((number, line, record if usable else None))
    return out


def _findings(path: Path, problems: list[str], live: bool = False) -> list[dict[str, Any]]:
    """The finding records of findings.jsonl; the lines that are not one are said (in `problems`), never
    left out silently: the page would say "no warnings were recorded" over them."""
    lines = _records(path, live)
    bad = [number for number, _, record in lines if record is None]
    if bad:
        more = f" and {len(bad) - 1} more line{'s' if len(bad) > 2 else ''}" if len(bad) > 1 else ""
        problems.append(
            f'{path}: line {bad[0]}{more}: not a finding record (a JSON object with a "title"), left out of the report'
        )
    return [record for _, _, record in lines if record is not None]


def record_postrun(folder: Path, records: list[dict[str, Any]]) -> None:
    """findings.jsonl with this report's post-run records in place of earlier ones (atomically); every other
    line is kept as it was, one that is not a finding record included."""
    path = folder / layout.FINDINGS
    kept = [line for _, line, r in _records(path) if r is None or r.get("phase") != "postrun"]
    write_atomic(
        path, "".join(line + "\n" for line in kept) + "".join(json.dumps(r, default=str) + "\n" for r in records)
    )


def findings_of(folder: Path, problems: list[str] | None = None, live: bool = False) -> list[dict[str, Any]]:
    """The run's recorded findings but the post-run ones (this report makes those): the preflight gate's and
    the watchers', and the rehearsal's (its own findings.jsonl, in the rehearsal's run directory)."""
    problems = [] if problems is None else problems
    own = [r for r in _findings(folder / layout.FINDINGS, problems, live) if r.get("phase") != "postrun"]
    rehearsal = [
        {**r, "phase": "rehearsal", "step": 0} for r in _findings(folder / layout.REHEARSAL / layout.FINDINGS, problems)
    ]
    return own + rehearsal


def marked_step(record: dict[str, Any]) -> int | None:
    """Where a finding is marked: its step (a watcher's, a curve reader's); before the first step (0) for the
    gate's and the rehearsal's; warnings and errors only."""
    if record.get("severity") not in (Severity.WARNING.value, Severity.ERROR.value):
        return None
    step = record.get("step")
    if record.get("phase") in ("preflight", "rehearsal"):
        return 0
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def labels(curves: list[dict[str, Any]]) -> list[str]:
    """Each run's name; with its folder's parent where two names are the same."""
    names = [c["name"] for c in curves]
    return [f"{Path(c['path']).resolve().parent.name}/{n}" if names.count(n) > 1 else n for c, n in zip(curves, names)]


def load(paths: list[Path], by: str, plugins: bool, live: bool = False) -> list[Judged]:
    curves = [read_run(p) for p in paths]
    if by == "tokens":
        for path, fact in zip(paths, curves):
            if not fact["series"].get("tokens_seen"):
                raise InputError(
                    path,
                    "logged no tokens seen (tokens_seen, num_tokens or num_input_tokens_seen): "
                    "compare it with --x step",
                )
            if gone := non_finite(fact["series"]["tokens_seen"]):  # no place on a tokens axis
                raise InputError(path, f"its count of tokens seen is {said(gone)}: compare it with --x step")
    judged, number = [], 0
    for index, (fact, label) in enumerate(zip(curves, labels(curves))):
        verdicts, skipped = judge(fact, plugins)
        records = findings_of(Path(fact["path"]), fact["problems"], live) + postrun_records(verdicts)
        steps = [(marked_step(r), r) for r in records]
        marks = [
            (number + i, step, r)
            for i, (step, r) in enumerate(
                sorted(((s, r) for s, r in steps if s is not None), key=lambda pair: pair[0]), 1
            )
        ]
        number += len(marks)
        judged.append(Judged(PlottedRun(fact, records, label, COLOURS[index % len(COLOURS)], marks), verdicts, skipped))
    return judged


def ours(folder: Path) -> bool:
    """A sftdoctor run directory (its findings.jsonl is ours to update); a Trainer's is only read."""
    return (folder / layout.RESOLVED).is_file() or (folder / layout.FINDINGS).is_file()


@dataclass
class Written:
    html: Path
    panels: list[Path]
    judged: list[Judged]


def write(judged: list[Judged], output: Path, by: str) -> Written:
    runs = [j.run for j in judged]
    axis = Axis(by)
    output.mkdir(parents=True, exist_ok=True)
    target, old = output / layout.PANELS, output / f".{layout.PANELS}.old"
    html, html_tmp = output / layout.REPORT, output / f".{layout.REPORT}.tmp"
    drawn, staging = [], None
    try:  # the staging folder made inside: a SIGTERM right after mkdtemp still removes it
        staging = Path(tempfile.mkdtemp(prefix=".report-", dir=output))
        for panel in shown(runs):
            drawn.append((panel, render(panel, runs, axis)))
            (staging / f"{panel.name}.png").write_bytes(drawn[-1][1])
        html_tmp.write_text(page.page(judged, drawn, axis), encoding="utf-8")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            os.replace(target, old)
        os.replace(staging, target)
        os.replace(html_tmp, html)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        html_tmp.unlink(missing_ok=True)
        if old.exists() and not target.exists():  # the earlier panels stay, with the earlier page
            os.replace(old, target)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
    return Written(html, [target / f"{panel.name}.png" for panel, _ in drawn], judged)


def build(
    paths: list[Path], output: Path | None = None, by: str = "step", plugins: bool = True, record: bool = True
) -> Written:
    """The report written in `output`; `record`: the curve readers' findings into each sftdoctor run's
    findings.jsonl too (`sftdoctor mcp` writes nothing in a run directory)."""
    with interruptible():
        return _build(paths, output, by, plugins, record)


def _build(paths: list[Path], output: Path | None, by: str, plugins: bool, record: bool) -> Written:
    if by not in AXES:
        raise InputError("--x", f"expected one of {', '.join(AXES)}, got {by!r}")
    if not paths:
        raise InputError("report", "expected at least one run directory")
    judged = load(paths, by, plugins)
    if output is None:
        output = Path(judged[0].run.curves["path"]) if len(paths) == 1 else Path("sftdoctor-report")
    if output.exists() and not output.is_dir():
        raise InputError(output, "exists and is not a folder (expected the folder to write report.html in)")
    written = write(judged, output, by)
    for j in judged:
        folder = Path(j.run.curves["path"])
        if record and ours(folder):
            record_postrun(folder, [r for r in j.run.findings if r.get("phase") == "postrun"])
    return written


def show(written: Written, as_json: bool) -> int:
    """What the curve readers said of each run, and where the report is; the exit code."""
    for problem in (p for j in written.judged for p in j.run.curves["problems"]):
        print(f"sftdoctor: warning: {problem}", file=sys.stderr)
    if as_json:
        print(json_text(written), end="")
        return verdict(written)
    for j in written.judged:
        if len(written.judged) > 1:
            print(f"{j.run.label} ({os.path.normpath(j.run.curves['path'])}):")
        render_table(j.verdicts, j.skipped)
        silenced = sorted(
            {r["id"] for r in j.run.findings if r.get("silenced") is True and isinstance(r.get("id"), str)}
        )
        if silenced:
            print(f"sftdoctor: silenced in this run: {silenced_line(silenced)}")
    print(
        f"sftdoctor: report written: {os.path.normpath(written.html)} ({len(written.panels)} panels in "
        f"{os.path.normpath(written.html.parent / layout.PANELS)})"
    )
    return verdict(written)


def verdict(written: Written) -> int:
    """The exit code: 1 if a curve reader found an error in a run."""
    return exit_code([f for j in written.judged for f in j.verdicts])


def json_text(written: Written) -> str:
    """What `report --json` prints: the report's files and each run's curve readers' findings."""
    doc = {
        "report": str(written.html),
        "panels": [str(p) for p in written.panels],
        "runs": [
            {
                "name": j.run.label,
                "path": j.run.curves["path"],
                "findings": [f.to_json() for f in j.verdicts],
                "not_read": j.run.curves["problems"],
                "skipped": [{"id": s.id, "reason": s.reason} for s in j.skipped],
            }
            for j in written.judged
        ],
    }
    return json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"


def main(
    runs: list[Path], output: Path | None = None, by: str = "step", as_json: bool = False, plugins: bool = True
) -> int:
    """Exit 0: written (1 if a curve reader found an error). Bad input raises InputError; Ctrl-C or SIGTERM
    while drawing raises Interrupted, with nothing written."""
    return show(build(list(runs), output, by, plugins), as_json)
