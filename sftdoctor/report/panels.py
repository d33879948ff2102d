"""The report's panels: one matplotlib figure each, every run overlaid, the run's findings marked at their step.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no global backend): the launcher
draws them in its own process. Series longer than MAX_POINTS are thinned to each bucket's minimum and
maximum, so a 100,000-step run draws in the time of a short one and keeps its spikes.
"""

from __future__ import annotations

import bisect
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sftdoctor.run import schedule as schedules

MAX_POINTS = 4000
NOTES, NOTE_INCH = 12, 0.18  # findings listed under the loss panel, and the height of a line of them
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
MARK_COLOURS = {"error": "#c00000", "warning": "#e08000"}


@dataclass
class PlottedRun:
    """One run as the panels need it: its curves fact, its findings, its label and colour."""

    curves: dict[str, Any]
    findings: list[dict[str, Any]]
    label: str
    colour: str
    marks: list[tuple[int, int, dict[str, Any]]]  # (number, step, finding) of the findings marked on the panels


@dataclass(frozen=True)
class Panel:
    name: str  # the PNG's file name, without .png
    title: str
    ylabel: str
    series: tuple[str, ...]  # any of them logged by a run puts the panel in the report
    draw: Callable[..., None]


def thin(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """At most about MAX_POINTS points: each bucket's first, lowest and highest point, in order."""
    if len(xs) <= MAX_POINTS:
        return xs, ys
    size = math.ceil(len(xs) / (MAX_POINTS // 3))
    out_x, out_y = [], []
    for start in range(0, len(xs), size):
        idx = range(start, min(start + size, len(xs)))
        keep = sorted({start, min(idx, key=ys.__getitem__), max(idx, key=ys.__getitem__)})
        out_x += [xs[i] for i in keep]
        out_y += [ys[i] for i in keep]
    return out_x, out_y


class Axis:
    """Steps, or tokens seen at each step (the last count logged at or before it)."""

    def __init__(self, by: str):
        self.by = by
        self.label = "tokens seen" if by == "tokens" else "step"

    def xs(self, run: PlottedRun, steps: list[int]) -> list[float]:
        if self.by == "step":
            return list(steps)
        seen = run.curves["series"]["tokens_seen"]
        known_steps, known = seen["steps"], seen["values"]
        return [known[max(0, bisect.bisect_right(known_steps, s) - 1)] for s in steps]


PLOTTABLE = 1e300  # matplotlib's tick locator overflows on an axis spanning values near the float's limit


def drawable(value: float) -> bool:
    return math.isfinite(value) and abs(value) < PLOTTABLE


def series(run: PlottedRun, name: str) -> tuple[list[int], list[float]]:
    """A series as drawn: a NaN, an infinity or a value too large to place on an axis is a gap in the line
    (said under the panel, `undrawn`, and judged by the curve readers)."""
    data = run.curves["series"].get(name) or {"steps": [], "values": []}
    return data["steps"], [v if drawable(v) else float("nan") for v in data["values"]]


def undrawn(panel: Panel, runs: list[PlottedRun]) -> str:
    """What the panel leaves out: "not drawn: grad_norm of run-a at 3 steps (NaN, inf or beyond ±1e300)"."""
    parts = [
        f"{name} of {run.label} at {count} step{'s' if count > 1 else ''}"
        for run in runs
        for name in panel.series
        if (count := sum(not drawable(v) for v in (run.curves["series"].get(name) or {}).get("values", [])))
    ]
    return f"not drawn: {', '.join(parts)} (NaN, inf or beyond \u00b11e300)" if parts else ""


def line(ax, axis: Axis, run: PlottedRun, name: str, **style) -> bool:
    steps, values = series(run, name)
    if not steps:
        return False
    xs, ys = thin(axis.xs(run, steps), values)
    ax.plot(xs, ys, color=run.colour, linewidth=1.2, **style)
    return True


# ---------------------------------------------------------------- the panels


def draw_loss(ax, axis: Axis, runs: list[PlottedRun]) -> None:
    for run in runs:
        line(ax, axis, run, "loss", label=f"{run.label} train")
        line(ax, axis, run, "eval_loss", label=f"{run.label} eval", linestyle="--", marker="o", markersize=3)


def draw_lr(ax, axis: Axis, runs: list[PlottedRun]) -> None:
    for run in runs:
        line(ax, axis, run, "learning_rate", label=run.label)
        schedule = run.curves.get("schedule")
        if not schedule:
            continue
        total, warm = schedule["total_steps"], schedule["warmup_steps"]
        grid = sorted({*range(0, total + 1, max(1, total // 400)), total, warm})
        # as transformers 5.x logs it (the rate of the step just taken); the lr-curve check allows 4.x's too
        ax.plot(
            axis.xs(run, grid),
            [schedules.rate(schedule, max(0, s - 1)) for s in grid],
            color=run.colour,
            linewidth=0.8,
            linestyle=":",
            label=f"{run.label} configured ({schedule['name']})",
        )
        if warm:
            ax.axvline(axis.xs(run, [warm])[0], color=run.colour, linestyle="-.", linewidth=0.8, alpha=0.6)
            ax.annotate(
                f"warmup ends (step {warm})",
                (axis.xs(run, [warm])[0], schedule["learning_rate"]),
                fontsize=7,
                color=run.colour,
                xytext=(3, -10),
                textcoords="offset points",
            )
        floor = schedules.floor(schedule)
        if floor > 0:
            level(ax, floor, f"floor {floor:.3g}", run.colour, linewidth=0.8, alpha=0.6)


def level(ax, value: float, label: str, colour, linewidth: float, alpha: float) -> None:
    """A dashed horizontal line at `value` (a run's floor or threshold), labelled at the panel's left edge."""
    ax.axhline(value, color=colour, linestyle="--", linewidth=linewidth, alpha=alpha)
    ax.annotate(
        label,
        (0, value),
        xycoords=("axes fraction", "data"),
        fontsize=7,
        color=colour,
        xytext=(3, 3),
        textcoords="offset points",
    )


def draw_grad_norm(ax, axis: Axis, runs: list[PlottedRun]) -> None:
    highest = lowest = None
    for run in runs:
        if line(ax, axis, run, "grad_norm", label=run.label):
            values = [v for v in series(run, "grad_norm")[1] if drawable(v) and v > 0]
            if values:
                highest, lowest = max(highest or 0, max(values)), min(lowest or math.inf, min(values))
        clip = run.curves.get("max_grad_norm")
        if clip:
            level(ax, clip, f"clipping threshold {clip:g}", run.colour, linewidth=0.9, alpha=0.7)
    if highest and lowest and highest / lowest > 100:
        ax.set_yscale("log")


def draw_loss_scale(ax, axis: Axis, runs: list[PlottedRun]) -> None:
    for run in runs:
        line(ax, axis, run, "loss_scale", label=run.label, drawstyle="steps-post")
    ax.set_yscale("log", base=2)


def draw_throughput(ax, axis: Axis, runs: list[PlottedRun]) -> None:
    for run in runs:
        line(ax, axis, run, "tokens_per_second", label=run.label)
    ax.set_ylim(bottom=0)


def draw_memory(ax, axis: Axis, runs: list[PlottedRun]) -> None:
    for run in runs:
        gpu = line(ax, axis, run, "memory_allocated_gib", label=f"{run.label} GPU allocated (peak, max over ranks)")
        line(ax, axis, run, "memory_reserved_gib", label=f"{run.label} GPU reserved", linestyle="--")
        if not gpu:
            line(ax, axis, run, "host_rss_gib", label=f"{run.label} host RSS (max over ranks)")
    ax.set_ylim(bottom=0)


PANELS = (
    Panel("loss", "Loss", "loss", ("loss", "eval_loss"), draw_loss),
    Panel("learning-rate", "Learning rate", "learning rate", ("learning_rate",), draw_lr),
    Panel("grad-norm", "Gradient norm (before clipping)", "gradient norm", ("grad_norm",), draw_grad_norm),
    Panel("loss-scale", "fp16 loss scale", "loss scale", ("loss_scale",), draw_loss_scale),
    Panel("throughput", "Throughput", "tokens/s (all ranks)", ("tokens_per_second",), draw_throughput),
    Panel("memory", "Memory", "GiB", ("memory_allocated_gib", "host_rss_gib"), draw_memory),
)


def shown(runs: list[PlottedRun]) -> list[Panel]:
    return [p for p in PANELS if any(run.curves["series"].get(name) for run in runs for name in p.series)]


def mark(ax, axis: Axis, runs: list[PlottedRun]) -> None:
    """Each marked finding: a line at its step, its number at the top (the page lists them by number)."""
    for run in runs:
        by_step: dict[int, list[tuple[int, dict]]] = {}
        for number, step, finding in run.marks:
            by_step.setdefault(step, []).append((number, finding))
        for step, items in by_step.items():
            worst = "error" if any(f.get("severity") == "error" for _, f in items) else "warning"
            x = axis.xs(run, [step])[0]
            ax.axvline(x, color=MARK_COLOURS[worst], linewidth=1.0, alpha=0.8, linestyle=(0, (4, 2)))
            numbers = ",".join(str(n) for n, _ in items[:4]) + ("…" if len(items) > 4 else "")
            ax.annotate(
                numbers,
                (x, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color=MARK_COLOURS[worst],
                ha="center",
                va="bottom",
                fontweight="bold",
            )


def render(panel: Panel, runs: list[PlottedRun], axis: Axis) -> bytes:
    """The panel as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    notes = [(n, s, f) for run in runs for n, s, f in run.marks] if panel.name == "loss" else []
    listed = min(len(notes), NOTES)
    height = 3.6 + NOTE_INCH * listed + (NOTE_INCH if len(notes) > NOTES else 0)
    figure = Figure(figsize=(9, height), dpi=100)
    FigureCanvasAgg(figure)
    bottom = (0.55 + NOTE_INCH * listed + (NOTE_INCH if len(notes) > NOTES else 0)) / height
    ax = figure.add_axes((0.09, bottom, 0.88, 1 - bottom - 0.45 / height))
    panel.draw(ax, axis, runs)
    if gaps := undrawn(panel, runs):
        ax.text(
            0.5,
            0.01,
            gaps[:150],
            transform=ax.transAxes,
            ha="center",
            va="bottom",
            fontsize=7,
            color=MARK_COLOURS["error"],
        )
    mark(ax, axis, runs)
    ax.set_title(panel.title, fontsize=11, loc="left", pad=12)
    ax.set_xlabel(axis.label, fontsize=9)
    ax.set_ylabel(panel.ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best", framealpha=0.8)
    lines = [
        (f"{n}. step {s}  {f.get('id', '')}: {f.get('title', '')}", f.get("severity")) for n, s, f in notes[:NOTES]
    ]
    if len(notes) > NOTES:
        lines.append((f"... and {len(notes) - NOTES} more, listed in the report", None))
    for row, (text, severity) in enumerate(lines):
        figure.text(
            0.01,
            (0.08 + NOTE_INCH * (len(lines) - 1 - row)) / height,
            text[:150] + ("…" if len(text) > 150 else ""),
            fontsize=7,
            color=MARK_COLOURS.get(severity, "#555"),
        )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
