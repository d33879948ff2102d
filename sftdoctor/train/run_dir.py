"""The run directory as the launchers keep it: who owns it on a cluster, where each node writes, what is
finished, and the records a resume rewinds."""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path
from typing import Any

from sftdoctor.files import write_atomic
from sftdoctor.run import Plan
from sftdoctor.run.checkpoints import newest_complete
from sftdoctor.run.layout import METRICS, RESOLVED
from sftdoctor.train.summary import read_records


def finished(run_dir: Path) -> str | None:
    """ "step N of N" when the newest complete checkpoint is the run's last step and final/ was written."""
    checkpoint = newest_complete(run_dir)
    if checkpoint is None or not (run_dir / "final").is_dir():
        return None
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    step, last = state.get("global_step"), state.get("max_steps")
    return f"step {step} of {last}" if isinstance(step, int) and isinstance(last, int) and step >= last else None


def forget_metrics_after(run_dir: Path, step: int) -> None:
    """A resumed run logs the steps after its checkpoint again: drop their earlier records, so that
    metrics.jsonl holds each step once."""
    path = run_dir / METRICS
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line).get("step", 0) <= step]
    write_atomic(path, "".join(kept))


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def owner(plan: Plan) -> bool:
    """Node 0's launcher keeps the run directory, which the nodes of a cluster share: it cleans and resumes it,
    writes the plan, the log, the evaluation and the report. Another node's launcher only reads it, logs
    beside it under its hostname, and keeps the plan its workers follow on its own disk."""
    return plan.node_rank == 0


def node_file(run_dir: Path, name: str, plan: Plan) -> Path:
    """This node's launcher file: RUN_DIR/train.log on node 0, RUN_DIR/train-HOSTNAME.log on another node."""
    if owner(plan):
        return run_dir / name
    stem, dot, suffix = name.partition(".")
    return run_dir / f"{stem}-{socket.gethostname()}{dot}{suffix}"


def plan_file(plan: Plan, run_dir: Path) -> Path:
    """Where the workers read the plan: the run directory's resolved.json (the record of the run) on node 0;
    a file of this node's own elsewhere (node 0 may be cleaning the shared directory as this node starts)."""
    name = "resolved-smoke.json" if plan.rehearsal else RESOLVED
    if owner(plan):
        return run_dir / name
    return Path(tempfile.mkdtemp(prefix="sftdoctor-")) / name


def last_step(run_dir: Path) -> int | None:
    records = read_records(run_dir / METRICS)
    return records[-1].get("step") if records else None
