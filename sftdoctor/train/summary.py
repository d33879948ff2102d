"""The block `sftdoctor train` prints when a run ends well: what it did, where it left everything, what next."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sftdoctor.render import silenced_line


def read_records(path: Path, skip: int = 0) -> list[dict[str, Any]]:
    """metrics.jsonl's records after the first `skip` lines (those of earlier launches)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()[skip:]
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def line_count(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except OSError:
        return 0


def _last(records: list[dict], key: str) -> dict | None:
    return next((r for r in reversed(records) if isinstance(r.get(key), (int, float))), None)


def _seconds(value: float) -> str:
    value = round(value)
    return (
        f"{value // 3600}h{value % 3600 // 60:02d}m"
        if value >= 3600
        else f"{value // 60}m{value % 60:02d}s"
        if value >= 60
        else f"{value} s"
    )


def summary(
    run_dir: Path,
    records: list[dict[str, Any]],
    wall_s: float,
    first_step: int,
    checkpoint: Path | None,
    next_steps: list[str],
    report: str | None = None,
    silenced: tuple[str, ...] = (),
) -> str:
    """`records`: this launch's metrics.jsonl records; `first_step`: the step it started after (0, or the
    checkpoint it resumed from); `report`: what to say of the run's report.html; `silenced`: the ids the gate
    silenced (the plan's)."""
    path = os.path.normpath
    train, evaluation, end = _last(records, "loss"), _last(records, "eval_loss"), _last(records, "train_runtime")
    last_step = max((r.get("step", 0) for r in records), default=first_step)
    steps = last_step - first_step
    lines = [
        f"sftdoctor: run complete: {steps} step{'s' if steps != 1 else ''}"
        + (f" (steps {first_step + 1}-{last_step}, resumed)" if first_step else "")
        + f" in {_seconds(wall_s)}"
        + (f", {_seconds(end['train_runtime'])} of it training" if end else "")
    ]
    if train and "tokens_seen" in train:
        rate = (
            f", {train['tokens_seen'] / end['train_runtime']:,.0f} tokens/s" if end and end["train_runtime"] > 0 else ""
        )
        lines.append(f"  tokens       {train['tokens_seen']:,} trained{rate} (padding excluded)")
    losses = []
    if train:
        losses.append(f"train {train['loss']:.4f} (step {train['step']})")
    if evaluation:
        losses.append(f"eval {evaluation['eval_loss']:.4f} (step {evaluation['step']})")
    if losses:
        lines.append("  loss         " + "; ".join(losses))
    if (run_dir / "final").is_dir():
        lines.append(f"  final model  {path(run_dir / 'final')}")
    if checkpoint is not None:
        lines.append(f"  checkpoint   {path(checkpoint)} (newest complete)")
    lines.append(
        f"  findings     {path(run_dir / 'findings.jsonl')}; metrics {path(run_dir / 'metrics.jsonl')}; "
        f"log {path(run_dir / 'train.log')}"
    )
    if silenced:
        lines.append(f"  silenced     {silenced_line(silenced)}")
    if report:
        lines.append(f"  report       {report}")
    lines += [f"  next         {step}" for step in next_steps]
    return "\n".join(lines)
