"""[eval] at the end of a run that ended well: `sftdoctor eval` on the final model (and every n-th complete
checkpoint), beside the base the run started from, in a child process of its own (lm-eval, the model and
its base load there, not in the launcher), its output on the terminal and in train.log like the workers'."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sftdoctor.run import Plan
from sftdoctor.run.checkpoints import checkpoints, is_complete
from sftdoctor.run.resolve import base_path
from sftdoctor.train.processes import SIGNAL_EXIT, run_workers

RESULT = "eval.json"


def command(plan: Plan, target: Path, out: Path) -> list[str]:
    e = plan.evaluation
    argv = [sys.executable, "-m", "sftdoctor", "eval", str(target), "--tasks", ",".join(e["tasks"]), "--out", str(out)]
    for option, value in (("--include", e["include"]), ("--limit", e["limit"]), ("--num-fewshot", e["num_fewshot"])):
        if value is not None:
            argv += [option, str(value)]
    return argv + (["--base", base_path(plan)] if e["base"] else [])


def targets(plan: Plan, run_dir: Path) -> list[tuple[Path, Path]]:
    """(what to evaluate, where its result goes): every n-th complete checkpoint, then the final model."""
    every = plan.evaluation["every_n_checkpoints"]
    chosen = []
    if every:
        complete = [path for _, path in checkpoints(run_dir) if is_complete(path)]
        chosen = [(path, run_dir / f"eval-{path.name}.json") for i, path in enumerate(complete, 1) if i % every == 0]
    return chosen + [(run_dir, run_dir / RESULT)]


def evaluate_run(plan: Plan, run_dir: Path, env: dict[str, str], log: Path) -> int:
    """Exit code of the first evaluation that failed (130 or 143 when one was stopped by a signal), else 0."""
    for target, out in targets(plan, run_dir):
        code, sig = run_workers(command(plan, target, out), env, log, echo=True)
        if sig is not None:
            return SIGNAL_EXIT[sig]
        if code:
            return code
    return 0


def result_line(run_dir: Path) -> str | None:
    """The summary's line: each task's metric beside the base's (the table itself was printed above it)."""
    from sftdoctor.eval.command import headline

    path = run_dir / RESULT
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return f"{headline(doc).removeprefix('eval: ')}; {os.path.normpath(path)}"
    except (OSError, ValueError, KeyError, TypeError):
        return None
