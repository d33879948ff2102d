"""One trial: its run config, the gate, the launch, the pruner fed from the run's metrics, the objective.

1. SWEEP_DIR/trial-NNNN/run.toml: the base with the trial's values, the trial folder as its run directory.
2. The gate of `sftdoctor train` (`train.gate.preflight`), in this process, its table in gate.log. A check's
   error prunes the trial with that finding, before anything launches.
3. Otherwise `sftdoctor train trial-NNNN/run.toml` in a session of its own (its output in launch.log): a real
   run, with its own gate, its rehearsal where the plan asks one, its watchers, its report.
4. While it trains, every evaluation in its metrics.jsonl goes to the pruner (`trial.report`); when the
   pruner says stop, the launcher gets SIGINT (its ranks stop at once, no checkpoint a pruned trial would
   never use) and the trial is pruned.
5. The objective: the loss of the run's last evaluation, or the lm-eval metric in RUN_DIR/eval.json.

A failed rehearsal and a watcher's stop (a NaN loss: a learning rate that diverges) prune the trial too,
with their finding: the sampler learns from them. A run that fails for any other reason fails the trial.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sftdoctor.children import die_with_parent
from sftdoctor.errors import InputError, InputErrors
from sftdoctor.files import write_atomic
from sftdoctor.findings import Severity
from sftdoctor.run import load_run_config
from sftdoctor.run.checkpoints import newest_complete
from sftdoctor.run.layout import METRICS, STOPPED
from sftdoctor.sweep.config import Sweep, display, dumps, show
from sftdoctor.sweep.study import HEARTBEAT_S
from sftdoctor.train import gate as train_gate
from sftdoctor.train import launch
from sftdoctor.train.processes import GRACE_S, stop_workers

CONFIG, GATE_LOG, LAUNCH_LOG, REHEARSAL_LOG, EVAL_RESULT = (
    "run.toml",
    "gate.log",
    "launch.log",
    "rehearsal.log",
    "eval.json",
)
POLL_S = 1.0
PRUNE_GRACE_S = GRACE_S + 20  # after SIGINT the launcher gives its ranks GRACE_S, then stops
WAIT_S = 180.0  # at most, for a killed trial's ranks to finish saving before a retry takes over its folder


def trial_dir(sweep: Sweep, number: int) -> Path:
    return sweep.output_dir / f"trial-{number:04d}"


@dataclass
class Outcome:
    state: str  # complete | pruned | failed | interrupted
    value: float | None = None
    why: dict[str, Any] | None = None  # {"id", "title", "fix"}: the finding that pruned it, or why it failed
    launched: bool = False
    seconds: float = 0.0


class Stop:
    """The signal that asked the sweep to stop (SIGINT, SIGTERM), set by its handlers, read at safe points."""

    def __init__(self):
        self.signal: int | None = None

    def __call__(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = signum


class Follower:
    """The eval losses of a run's metrics.jsonl as they are written, each step once. A resumed launch rewrites
    the file (its records after the checkpoint dropped): read again from the start, steps already seen skipped."""

    def __init__(self, path: Path):
        self.path, self.offset, self.inode, self.seen = path, 0, None, set()
        self.last: tuple[int, float] | None = None

    def evals(self) -> list[tuple[int, float]]:
        try:
            stat = os.stat(self.path)
            if stat.st_ino != self.inode or stat.st_size < self.offset:
                self.inode, self.offset = stat.st_ino, 0
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        found = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            step, loss = (record.get("step"), record.get("eval_loss")) if isinstance(record, dict) else (None, None)
            if (
                isinstance(step, int)
                and not isinstance(step, bool)
                and isinstance(loss, (int, float))
                and not isinstance(loss, bool)
            ):
                if self.last is None or step >= self.last[0]:
                    self.last = (step, float(loss))
                if step not in self.seen:
                    self.seen.add(step)
                    found.append((step, float(loss)))
        return found


def params_line(params: dict[str, Any]) -> str:
    return " ".join(f"{name}={show(value)}" for name, value in params.items())


def write_config(sweep: Sweep, number: int, params: dict[str, Any], run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG
    header = f"trial {number} of the sweep {sweep.path} (study {sweep.study!r})\n" + "\n".join(
        f"{name} = {show(value)}" for name, value in params.items()
    )
    write_atomic(path, dumps(sweep.trial_raw(params, run_dir), header))
    return path


def gate(config: Path, run_dir: Path, plugins: bool, facts_file: Path | None) -> tuple[list, bool]:
    """`sftdoctor train`'s gate on the trial's run config, its table written to gate.log."""
    with open(run_dir / GATE_LOG, "w", encoding="utf-8") as out, contextlib.redirect_stdout(out):
        _, findings, blocked = train_gate.preflight(config, plugins, facts_file)
    return findings, blocked


def using(folder: Path) -> list[int]:
    """The processes of this host whose command line names `folder` (a launcher, its ranks)."""
    found, mine = [], str(folder) + os.sep
    for entry in Path("/proc").iterdir():
        if entry.name.isdecimal():
            try:
                words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(w.startswith(mine) for w in words):
                found.append(int(entry.name))
    return found


def wait_for(folder: Path, say: Callable[[str], None], limit_s: float = WAIT_S) -> None:
    """A killed worker's trial: its launcher got SIGTERM when the worker died, and its ranks may still be saving
    their checkpoint. Wait for them before the folder changes hands."""
    deadline = time.monotonic() + limit_s
    if using(folder):
        say(f"sftdoctor: waiting for the processes of {display(folder)} to stop (at most {limit_s:.0f} s)")
    while using(folder) and time.monotonic() < deadline:
        time.sleep(1.0)


def adopt(sweep: Sweep, trial, run_dir: Path, say: Callable[[str], None] = print) -> bool:
    """A retry of an interrupted trial takes over its run directory when it left a complete checkpoint (a
    SIGTERM lets the ranks save one), and resumes from it."""
    retry_of = trial.user_attrs.get("retry_of")
    if not isinstance(retry_of, int) or run_dir.exists():
        return False
    old = trial_dir(sweep, retry_of)
    if not old.is_dir():
        return False
    wait_for(old, say)
    if newest_complete(old) is None:
        return False
    os.replace(old, run_dir)
    trial.set_user_attr("resumed_from", old.name)
    return True


def last_line(path: Path) -> str:
    """The launcher's verdict: its last line that starts with "sftdoctor:", else its last line."""
    try:
        lines = [
            line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()
        ]
    except OSError:
        return "it wrote nothing"
    said = [line for line in lines if line.startswith("sftdoctor: ")]
    return (said or lines or ["it wrote nothing"])[-1].removeprefix("sftdoctor: ")


def trained_steps(run_dir: Path) -> bool:
    try:
        return any('"loss"' in line for line in (run_dir / METRICS).read_text(encoding="utf-8").splitlines())
    except OSError:
        return False


def objective(sweep: Sweep, run_dir: Path, follower: Follower) -> tuple[float | None, str]:
    """(value, where it came from), or (None, why there is none)."""
    if sweep.task_metric is None:
        follower.evals()
        if follower.last is None:
            return None, "the run logged no eval_loss"
        step, loss = follower.last
        return loss, f"eval_loss at step {step}"
    task, metric = sweep.task_metric
    from sftdoctor.eval.command import read_result

    try:  # its types checked: a score that is a string or a list is no objective
        metrics = read_result(run_dir / EVAL_RESULT, "[sweep] objective", settings=False)["metrics"].get(task)
    except InputError as exc:
        return None, f"no result of the task {task}: {exc}"
    if metrics is None:
        return None, f"no result of the task {task} in {run_dir / EVAL_RESULT}"
    if metric not in metrics:
        return None, f"the task {task} has no metric {metric!r}; it has {', '.join(sorted(metrics))}"
    return float(metrics[metric]["value"]), f"{task} {metric}"


def pruned_by_pruner(study, sweep: Sweep, number: int, step: int, value: float, best: float) -> dict[str, Any]:
    from optuna.trial import TrialState

    if sweep.pruner == "median":
        others = [
            t.intermediate_values[step]
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if t.number != number and step in t.intermediate_values and math.isfinite(t.intermediate_values[step])
        ]  # as Optuna's own median (nanmedian)
        there = f"the median {statistics.median(others):.4f} of {len(others)} other trials" if others else "the others"
        title = (
            f"the median pruner stopped it at step {step}: its best eval_loss so far {best:.4f} is worse than "
            f"{there} at that step"
        )
    else:
        title = (
            f"the hyperband pruner stopped it at step {step}: eval_loss {value:.4f} "
            "is not among the best of its bracket"
        )
    return {"id": "pruner", "title": title}


def run_trial(
    sweep: Sweep,
    study,
    trial,
    *,
    plugins: bool,
    facts_file: Path | None,
    stop: Stop,
    say: Callable[[str], None] = print,
    argv: list[str] | None = None,
) -> Outcome:
    """Run one asked trial to its end; the caller tells the study. `argv`: the launch command (tests)."""
    began = time.perf_counter()
    number, params = trial.number, dict(trial.params)
    run_dir = trial_dir(sweep, number)
    resume = adopt(sweep, trial, run_dir, say)
    config = write_config(sweep, number, params, run_dir)
    trial.set_user_attr("run_dir", run_dir.name)
    try:  # each value was checked alone; a combination may still be refused (cosine with a min_lr_rate)
        load_run_config(config)
    except InputErrors as exc:
        first = exc.errors[0]
        return Outcome(
            "pruned",
            why={"id": "run-config", "title": f"{first.key}: {first.message}" if first.key else first.message},
            seconds=time.perf_counter() - began,
        )
    findings, blocked = gate(config, run_dir, plugins, facts_file)
    if stop.signal is not None:
        return Outcome("interrupted", seconds=time.perf_counter() - began)
    if blocked:
        train_gate.record_preflight(run_dir, findings)
        errors = [f for f in findings if f.severity is Severity.ERROR and not f.silenced]
        first = errors[0]
        why = {"id": first.id, "title": first.title, "fix": first.fix, "errors": [f"{f.id}: {f.title}" for f in errors]}
        return Outcome("pruned", why=why, seconds=time.perf_counter() - began)
    say(
        f"sftdoctor: trial {number}: training in {display(run_dir)}"
        + (f" (resumed from the checkpoint of trial {trial.user_attrs['retry_of']})" if resume else "")
        + f"; log {display(run_dir / LAUNCH_LOG)}"
    )
    command = argv or [sys.executable, "-m", "sftdoctor", "train", str(config)] + (["--resume"] if resume else []) + (
        [] if plugins else ["--no-plugins"]
    )
    outcome = launched(sweep, study, trial, run_dir, command, stop)
    outcome.seconds = time.perf_counter() - began
    return outcome


def launched(sweep: Sweep, study, trial, run_dir: Path, command: list[str], stop: Stop) -> Outcome:
    follower = Follower(run_dir / METRICS)
    reports = sweep.task_metric is None  # the pruners compare eval losses; an eval: metric comes only at the end
    beat = time.monotonic()
    pruned: dict[str, Any] | None = None
    best = math.inf
    with open(run_dir / LAUNCH_LOG, "ab") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            for step, loss in follower.evals() if reports else []:
                trial.report(loss, step)
                best = min(best, loss) if math.isfinite(loss) else best
                if pruned is None and trial.should_prune():
                    pruned = pruned_by_pruner(study, sweep, trial.number, step, loss, best)
                    stop_workers(proc, signal.SIGINT, PRUNE_GRACE_S, launcher=False)
                    break
            if pruned is not None:
                break
            if stop.signal is not None:
                grace = PRUNE_GRACE_S if stop.signal == signal.SIGINT else sweep_grace(run_dir)
                stop_workers(proc, stop.signal, grace, launcher=False)
                return Outcome("interrupted", launched=True)
            if time.monotonic() - beat > HEARTBEAT_S:
                trial.set_user_attr("heartbeat", time.time())
                beat = time.monotonic()
    except BaseException:
        if proc.poll() is None:
            stop_workers(proc, signal.SIGINT, PRUNE_GRACE_S, launcher=False)
        raise
    code = proc.wait()
    if pruned is not None:
        return Outcome("pruned", why=pruned, launched=True)
    if reports:
        for step, loss in follower.evals():
            trial.report(loss, step)
    return verdict(sweep, run_dir, code, follower)


def sweep_grace(run_dir: Path) -> float:
    """After SIGTERM the launcher grants its ranks the plan's stop_grace_s to save, then stops them."""
    try:
        return float(json.loads((run_dir / "resolved.json").read_text())["stop_grace_s"]) + 20
    except (OSError, ValueError, KeyError, TypeError):
        return 60.0


def verdict(sweep: Sweep, run_dir: Path, code: int, follower: Follower) -> Outcome:
    if code == 0:
        value, source = objective(sweep, run_dir, follower)
        if value is None:
            return Outcome("failed", why={"id": "objective", "title": source}, launched=True)
        if not math.isfinite(value):
            return Outcome(
                "pruned", why={"id": "objective", "title": f"{source} is {value}: the run diverged"}, launched=True
            )
        return Outcome("complete", value=value, why={"id": "objective", "title": source}, launched=True)
    stopped = run_dir / STOPPED
    if stopped.is_file():
        try:
            record = json.loads(stopped.read_text(encoding="utf-8"))
            return Outcome(
                "pruned",
                why={"id": record["id"], "title": f"the {record['id']} watcher stopped the run: {record['title']}"},
                launched=True,
            )
        except (OSError, ValueError, KeyError, TypeError):
            pass
    rehearsal = run_dir / REHEARSAL_LOG
    if rehearsal.is_file() and not trained_steps(run_dir):
        return Outcome(
            "pruned",
            why={"id": "rehearsal", "title": f"the rehearsal failed: {launch.failure_cause(rehearsal)}"},
            launched=True,
        )
    return Outcome("failed", why={"id": "run", "title": last_line(run_dir / LAUNCH_LOG)}, launched=True)
