"""report.html: one self-contained page (panels inlined as PNG data, no script, no external resource), so it
opens offline, from an e-mail or a copied run directory. The live page of `report --follow` adds a banner and
a reload script (report/follow.py); the final page has neither script nor reload."""

from __future__ import annotations

import base64
import html
import math
import time
from typing import Any

from sftdoctor import __version__
from sftdoctor.facts.run_records import non_finite, said, shown
from sftdoctor.findings import Severity
from sftdoctor.render import MARKS, SKIP_MARK
from sftdoctor.run.schedule import floor

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1000px;color:#222;\
padding:0 12px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.muted{color:#666}table{border-collapse:collapse;width:100%;margin:6px 0 12px;font-size:13px}
td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}th{background:#f6f6f6}
figure{margin:14px 0}figure img{width:100%;max-width:900px;border:1px solid #eee}figcaption{font-size:12px;color:#666}
.error{color:#c00000;font-weight:600}.warning{color:#b36200;font-weight:600}.ok{color:#2a7d2a}.info{color:#1f6f8b}
.skipped{color:#888}.swatch{display:inline-block;width:10px;height:10px;margin-right:5px;border-radius:2px}
details{margin:6px 0}code{background:#f3f3f3;padding:0 3px;border-radius:3px}
.banner{margin:10px 0;padding:8px 12px;border-radius:4px;font-weight:600}.banner.live{background:#e8f1fb;\
border:1px solid #8db6e0}.banner.ended{background:#f3f3f3;border:1px solid #bbb}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _finite(curves: dict[str, Any], name: str) -> list[tuple[int, float]]:
    series = curves["series"].get(name)
    return [(s, v) for s, v in zip(series["steps"], series["values"]) if math.isfinite(v)] if series else []


def _unlike(curves: dict[str, Any], name: str) -> str:
    """Where a series stopped being a number, as a cell's second line: a last or best value read over the
    finite points alone would hide it."""
    gone = non_finite(curves["series"].get(name))
    return f"<div class='error'>{esc(said(gone))}</div>" if gone else ""


def last_cell(curves: dict[str, Any], name: str, form: str = "{:.4f}") -> str:
    """The series' last logged value (a NaN said as NaN), and its last finite one where they differ."""
    series = curves["series"].get(name)
    if not series:
        return "-"
    step, value = series["steps"][-1], series["values"][-1]
    finite = _finite(curves, name)
    if math.isfinite(value):
        return f"{form.format(value)} (step {step}){_unlike(curves, name)}"
    before = f"; last finite {form.format(finite[-1][1])} (step {finite[-1][0]})" if finite else ""
    return f"{shown(value)} (step {step}){before}{_unlike(curves, name)}"


def best_cell(curves: dict[str, Any], name: str) -> str:
    finite = _finite(curves, name)
    best = min(finite, key=lambda p: p[1]) if finite else None
    return (f"{best[1]:.4f} (step {best[0]})" if best else "-") + _unlike(curves, name)


def ending(curves: dict[str, Any], live: bool = False) -> str:
    """How the run ended, as far as its directory says; `live`: a run still going (`report --follow`)."""
    stopped, last, planned = curves.get("stopped"), curves["last_step"], curves.get("planned_steps")
    if live and not stopped:
        return f"running: at step {last}" + (f" of {planned}" if planned else "")
    if stopped:
        return f"stopped by {stopped.get('id')} at step {last}: {stopped.get('title')}"
    if curves.get("finished"):
        return f"complete: {last} steps"
    return f"ended at step {last}" + (f" of {planned}" if planned else "")


def run_rows(judged: list, live: bool = False) -> str:
    rows = []
    for j in judged:
        c = j.run.curves
        schedule = c.get("schedule")
        rows.append(
            f"<tr><td><span class='swatch' style='background:{j.run.colour}'></span>{esc(j.run.label)}"
            f"<div class='muted'>{esc(c['path'])} ({esc(c['source'])})</div></td>"
            f"<td>{esc(ending(c, live))}</td>"
            f"<td>{last_cell(c, 'loss')}</td><td>{best_cell(c, 'eval_loss')}</td>"
            f"<td>{last_cell(c, 'tokens_seen', '{:,.0f}')}</td>"
            f"<td>{esc(describe(schedule)) if schedule else '<span class=muted>not known</span>'}</td></tr>"
        )
    return (
        f"<table><tr><th>run</th><th>{'now' if live else 'ended'}</th><th>last train loss</th>"
        "<th>best eval loss</th><th>tokens seen</th><th>schedule</th></tr>" + "".join(rows) + "</table>"
    )


def describe(schedule: dict[str, Any]) -> str:
    return (
        f"{schedule['name']}, peak {schedule['learning_rate']:.3g}, warmup {schedule['warmup_steps']} steps, "
        f"{schedule['total_steps']} steps, ends at {floor(schedule):.3g}"
    )


def verdict_rows(judged: list) -> str:
    parts = []
    for j in judged:
        rows = []
        for f in j.verdicts:
            mark = MARKS[f.severity][0]
            more = "".join(f"<div class='muted'>{esc(t)}</div>" for t in (f.detail,) if t)
            fix = f"<div>fix: {esc(f.fix)}</div>" if f.fix and f.severity.rank >= Severity.WARNING.rank else ""
            explain = (
                f"<div class='muted'>{esc(f.explain_command)}</div>" if f.severity.rank >= Severity.WARNING.rank else ""
            )
            rows.append(
                f"<tr><td class='{f.severity.value}'>{mark} {esc(f.id)}</td><td>{esc(f.title)}{more}{fix}"
                f"{explain}</td></tr>"
            )
        rows += [
            f"<tr><td class='skipped'>{SKIP_MARK} {esc(s.id)}</td>"
            f"<td class='skipped'>skipped: {esc(s.reason)}</td></tr>"
            for s in j.skipped
        ]
        head = f"<h3>{esc(j.run.label)}</h3>" if len(judged) > 1 else ""
        parts.append(head + "<table>" + "".join(rows) + "</table>")
    return "".join(parts)


def finding_rows(judged: list) -> str:
    marked, others = [], 0
    for j in judged:
        for number, step, record in j.run.marks:
            severity = record.get("severity", "")
            marked.append(
                f"<tr><td>{number}</td><td>{esc(j.run.label)}</td><td>{esc(record.get('phase', ''))}</td>"
                f"<td>{step}</td>"
                f"<td class='{esc(severity)}'>{esc(record.get('id', ''))}</td><td>{esc(record.get('title', ''))}"
                + (f"<div>fix: {esc(record['fix'])}</div>" if record.get("fix") else "")
                + "</td></tr>"
            )
        others += len(j.run.findings) - len(j.run.marks)
    table = (
        (
            "<table><tr><th>#</th><th>run</th><th>phase</th><th>step</th><th>check</th><th>finding</th></tr>"
            + "".join(marked)
            + "</table>"
        )
        if marked
        else "<p class='ok'>No warnings or errors were recorded.</p>"
    )
    return table + (
        f"<p class='muted'>{others} more finding{'s' if others != 1 else ''} (ok or info) are in each "
        "run's findings.jsonl.</p>"
        if others
        else ""
    )


def problem_rows(judged: list) -> str:
    """What could not be read and was left out (a stop record, lines of findings.jsonl), one line each."""
    rows = [f"<li class='warning'>{esc(problem)}</li>" for j in judged for problem in j.run.curves.get("problems", [])]
    return f"<h2>Not read</h2><ul>{''.join(rows)}</ul>" if rows else ""


def head(title: str, extra: str = "") -> str:
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
        f"content='width=device-width, initial-scale=1'><title>{title}</title><style>{STYLE}</style>{extra}</head>"
    )


def waiting(title: str, extra: str, banner: str) -> str:
    """The page of a run that has logged no step yet (`report --follow`): its banner alone."""
    return f"{head(esc(title), extra)}<body><h1>{esc(title)}</h1>{banner}</body></html>\n"


def page(judged: list, drawn: list, axis, extra: str = "", banner: str = "", live: bool = False) -> str:
    """`extra`: more of the page's head (the live page's reload script); `banner`: HTML under the title; `live`:
    the run is still going (its row says how far it is, not how it ended)."""
    runs = ", ".join(esc(j.run.label) for j in judged)
    figures = "".join(
        f"<figure id='{panel.name}'><img alt='{esc(panel.title)}' src='data:image/png;base64,"
        f"{base64.b64encode(png).decode('ascii')}'><figcaption>{esc(panel.title)}, by {esc(axis.label)} "
        f"({panel.name}.png)</figcaption></figure>"
        for panel, png in drawn
    )
    return (
        f"{head(f'sftdoctor report: {runs}', extra)}<body><h1>sftdoctor report: {runs}</h1><div class='muted'>"
        f"sftdoctor {esc(__version__)}, {time.strftime('%Y-%m-%d %H:%M:%S')}; x axis: {esc(axis.label)}</div>{banner}"
        f"<h2>Runs</h2>{run_rows(judged, live)}{problem_rows(judged)}<h2>What the curves say</h2>{verdict_rows(judged)}"
        f"<h2>Findings marked on the panels</h2>{finding_rows(judged)}<h2>Panels</h2>{figures}</body></html>\n"
    )
