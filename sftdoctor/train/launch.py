"""Starting the workers of a run: the recipe (sftdoctor.train.sft), under torchrun for several processes, with
the environment they need; a launch's end told in one line or the summary block; a rehearsal's two launches.

Every setting comes from the one Plan (sftdoctor.run.resolve); this module only starts the workers with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

from sftdoctor import render
from sftdoctor.facts.launch_inputs import in_hub_cache
from sftdoctor.run import Plan
from sftdoctor.run.checkpoints import newest_complete, step_of
from sftdoctor.run.layout import LOG, METRICS, STOPPED
from sftdoctor.run.resolve import REHEARSAL_SAVE_AT
from sftdoctor.train import compat, noise
from sftdoctor.train.describe import loading
from sftdoctor.train.evaluation import evaluate_run, result_line
from sftdoctor.train.processes import SIGNAL_EXIT, run_workers
from sftdoctor.train.run_dir import last_step, node_file, owner, plan_file, write_json
from sftdoctor.train.summary import line_count, read_records, summary


def command(resolved_path: Path, plan: Plan, resume: bool, stop_after: int | None) -> list[str]:
    worker = (
        ["-m", "sftdoctor.train.sft", str(resolved_path)]
        + (["--resume"] if resume else [])
        + ([f"--stop-after={stop_after}"] if stop_after else [])
    )
    if plan.world_size == 1:
        return [sys.executable, *worker]
    # With the c10d rendezvous torchrun ignores --node-rank; node 0 hosting the store is what the rank means
    # (torch 2.x run.py and c10d_rendezvous_backend.py: "is_host"), so say it instead of relying on hostname matching.
    host = (
        [f"--rdzv-conf=is_host={'true' if plan.node_rank == 0 else 'false'},join_timeout={plan.join_timeout_s}"]
        if plan.nnodes > 1
        else []
    )
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={plan.nnodes}",
        f"--nproc-per-node={plan.nproc_per_node}",
        f"--max-restarts={plan.max_restarts}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={plan.master_addr}:{plan.master_port}",
        *host,
        f"--rdzv-id={rendezvous_id(plan)}",
        *worker,
    ]


def rendezvous_id(plan: Plan) -> str:
    """The same on every node of a run, another for its rehearsal (another run directory)."""
    return f"sftdoctor-{Path(plan.output_dir).name}-{plan.master_port}"


def worker_env(plan: Plan, config: Path, run_dir: Path) -> dict[str, str]:
    """The workers' environment: offline-safe model loading and reporting."""
    env = dict(os.environ)
    # A hub model neither cached nor reachable, or a [report] backend not installed, was refused before the checks
    # (facts.launch_inputs), as `check --config` refuses it.
    hub_ids = [p for p in {plan.model_path, plan.tokenizer_path} if not Path(p).exists()]
    if hub_ids and all(in_hub_cache(p) for p in hub_ids):
        env.setdefault("HF_HUB_OFFLINE", "1")  # everything is cached: never wait on a hub that may be unreachable
    to = plan.report_to
    if to == "wandb":
        env.setdefault("WANDB_DIR", str(run_dir))
        if "WANDB_API_KEY" not in env:
            env.setdefault("WANDB_MODE", "offline")  # no credentials: log locally, `wandb sync` later
    # NCCL runs: PyTorch's flight recorder on, its dumps in the run directory; the stack's noise silenced.
    for name, value in {**compat.flight_recorder_env(run_dir), **noise.worker_env(plan.cuda, plan.world_size)}.items():
        env.setdefault(name, value)
    if plan.world_size > 1:
        # torchrun (torch >= 2.5) hands every restart round the same agent-hosted TCPStore and never clears it
        # (elastic/rendezvous/dynamic_rendezvous.py builds the server once), while init_process_group's keys
        # are the same each round: a restarted gloo group reads the killed ranks' addresses ("Gloo
        # connectFullMesh failed ... Connection refused", or a stall; pytorch#135712). Opting out gives each
        # round a store of its own, on worker rank 0, at a port published through that round's rendezvous.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        # torchrun signalled itself (Slurm signals every process of the step) kills the ranks after this long
        # (torch 2.13 reads it, older releases wait 30 s): as long as the launcher grants them.
        env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(plan.stop_grace_s))
    return env


def start(
    plan: Plan,
    run_dir: Path,
    env: dict[str, str],
    resume: bool,
    stop_after: int | None = None,
    config: Path | None = None,
    log: Path | None = None,
) -> int:
    """One launch of the workers. With no `log` of its own (a rehearsal has one) it is the run: its output shows
    on the terminal and goes to train.log, and it ends with one line (stopped, failed) or the summary block."""
    resolved_path = plan_file(plan, run_dir)
    write_json(resolved_path, plan.to_json())
    stopped = run_dir / STOPPED
    if owner(plan):
        stopped.unlink(missing_ok=True)
    echo, log = log is None, log or node_file(run_dir, LOG, plan)
    began, log_from = time.perf_counter(), log.stat().st_size if log.exists() else 0
    records_from = line_count(run_dir / METRICS)
    first_step = step_of(resumed) if resume and (resumed := newest_complete(run_dir)) else 0
    try:
        code, sig = run_workers(
            command(resolved_path, plan, resume, stop_after),
            env,
            log,
            echo=echo,
            grace_s=plan.stop_grace_s,
            launcher=plan.world_size > 1,
        )
    finally:
        if not owner(plan):
            shutil.rmtree(resolved_path.parent, ignore_errors=True)
    if sig is not None:  # asked to stop (Ctrl-C, scancel): `sftdoctor report RUN_DIR` draws it later
        return stopped_by_signal(plan, run_dir, sig, config)
    drawn = echo and not plan.rehearsal and owner(plan)  # the run (not a rehearsal) gets its report, however it ended
    if code and stopped.exists():  # a watcher stopped the run: its own exit code, whatever torchrun says
        record = json.loads(stopped.read_text())
        print(f"sftdoctor: stopped by {record['id']}: {record['title']} (exit {record['exit_code']})", flush=True)
        if drawn:
            print_report_line(run_dir, plan)
        return int(record["exit_code"])
    if not echo:
        return code
    if code:
        step = last_step(run_dir)
        print(
            f"\nsftdoctor: the run failed (exit {code}"
            + (f", after step {step}" if step is not None and step > first_step else ", before its first step")
            + f"): {failure_cause(log, log_from)}",
            flush=True,
        )
        if drawn:
            print_report_line(run_dir, plan)
    elif not stop_after and not plan.rehearsal:
        evaluated = ended_well(plan, run_dir, env, log, records_from, began, first_step)
        if evaluated:
            return evaluated
    return code


def stopped_by_signal(plan: Plan, run_dir: Path, sig: int, config: Path | None) -> int:
    """The line for a run asked to stop (Ctrl-C, scancel): after which step, the checkpoint to resume from."""
    checkpoint = newest_complete(run_dir)
    step = max((s for s in (last_step(run_dir), checkpoint and step_of(checkpoint)) if s), default=None)
    print(
        f"\nsftdoctor: stopped by {signal.Signals(sig).name}"
        + (f" after step {step}" if step is not None else "")
        + f"; newest complete checkpoint: {os.path.normpath(checkpoint) if checkpoint else 'none yet'}"
        + (
            f"; resume with: sftdoctor train {os.path.normpath(config)} --resume"
            if config and not plan.rehearsal
            else ""
        ),
        flush=True,
    )
    return SIGNAL_EXIT[sig]


def ended_well(
    plan: Plan, run_dir: Path, env: dict[str, str], log: Path, records_from: int, began: float, first_step: int
) -> int | None:
    """A run that trained to its end: its evaluation (node 0, when asked for), then the summary block. The
    evaluation's exit code, or None when there was none."""
    evaluated = evaluate_run(plan, run_dir, env, log) if plan.evaluation and owner(plan) else None
    where = report_of(run_dir, plan) if owner(plan) else f"written by node 0 ({plan.master_addr})"
    text = summary(
        run_dir,
        read_records(run_dir / METRICS, records_from),
        time.perf_counter() - began,
        first_step,
        newest_complete(run_dir),
        loading(plan, run_dir),
        report=where,
        silenced=plan.silenced,
    )
    line = result_line(run_dir) if evaluated == 0 else None
    print("\n" + text + (f"\n  eval         {line}" if line else ""), flush=True)
    if evaluated:
        how = (
            f"was stopped by {signal.Signals(evaluated - 128).name}"
            if evaluated in SIGNAL_EXIT.values()
            else f"failed (exit {evaluated})"
        )
        print(
            f"\nsftdoctor: the evaluation {how}; the trained model is in "
            f"{os.path.normpath(run_dir / 'final')} (line {line_count(log)} of {os.path.normpath(log)})",
            flush=True,
        )
    return evaluated


def report_of(run_dir: Path, plan: Plan) -> str | None:
    """`sftdoctor report RUN_DIR` at the end of a run: the curve readers' table, then what to say of the report
    (where it is, or why there is none); None when no step was logged. It never fails the run."""
    if not (run_dir / METRICS).is_file():
        return None
    try:
        from sftdoctor.report.command import build

        written = build([run_dir], plugins=plan.plugins)
    except ModuleNotFoundError as exc:
        return f"not written: {exc.name} is not installed (pip install 'sftdoctor[report]')"
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while drawing: the run is done; `sftdoctor report` draws it later
        return f"not written (interrupted): sftdoctor report {os.path.normpath(run_dir)}"
    except Exception as exc:  # a broken metrics line, a full disk: the run itself is done
        return f"not written: {type(exc).__name__}: {exc}"
    [judged] = written.judged
    print("\nsftdoctor: the curves, read after the run:")
    render.render_table(judged.verdicts, judged.skipped)
    return f"{os.path.normpath(written.html)} ({len(written.panels)} panels)"


def print_report_line(run_dir: Path, plan: Plan) -> None:
    """After a run that failed or was stopped by a watcher, once it logged a step."""
    where = report_of(run_dir, plan)
    if where is not None:
        print(f"sftdoctor: report of the run up to step {last_step(run_dir)}: {where}", flush=True)


def batch_job(plan: Plan, config: Path, run, blocked: bool, submit: bool) -> int:
    from sftdoctor.train import slurm

    if blocked:
        print("\nsftdoctor: no batch script: the checks above found errors (fix them, or run with --force)")
        return 1
    path = slurm.write(plan, config, run)
    if not submit:
        print(f"\nsftdoctor: wrote {os.path.normpath(path)}; submit it with: sbatch {os.path.normpath(path)}")
        return 0
    job = slurm.submit(path)
    print(
        f"\nsftdoctor: submitted {os.path.normpath(path)} as Slurm job {job} (squeue -j {job}; its output: "
        f"{os.path.normpath(Path(plan.output_dir) / f'slurm-{job}.out')})"
    )
    return 0


def rehearse(plan: Plan, env: dict[str, str], log: Path | None = None) -> int:
    """The plan's rehearsal (`for_launch(..., rehearsal=True)`): 4 steps on the shrunk model with the same
    launcher, DeepSpeed config, data path and scheduler, a save at step 2 and a resume; exit code."""
    run_dir = Path(plan.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    code = start(plan, run_dir, env, resume=False, stop_after=REHEARSAL_SAVE_AT, log=log)
    return start(plan, run_dir, env, resume=True, log=log) if code == 0 else code


BANNER = re.compile(r"[=\-*_]{8,}")  # torchrun's failure report is framed by rules of '=': never the last words


def failure_cause(log: Path, offset: int = 0) -> str:
    """The root cause of a failed launch, found as `sftdoctor explain --log` finds it in what the launch wrote
    to `log` (from byte `offset`), else its last words."""
    from sftdoctor.triage import diagnose

    with open(log, "rb") as stream:
        before = stream.read(offset).count(b"\n")
        found = diagnose(stream, str(log))
        stream.seek(offset)
        tail = [line for line in stream.read()[-4096:].decode(errors="replace").splitlines() if line.strip()]
    shown = os.path.normpath(log)
    lead = found.root or next(iter(found.findings), None)
    if lead is not None and lead.finding.id == "crash-log" and lead.line:  # no known cause: the failing line itself
        return (
            f"{lead.finding.evidence['text']} (line {before + lead.line} of {shown}; no known cause: "
            f"`sftdoctor explain --log {shown}`)"
        )
    if lead is not None:
        return f"{lead.finding.title} (line {before + lead.line} of {shown}; `sftdoctor explain --log {shown}`)"
    words = [line.strip() for line in tail if not BANNER.fullmatch(line.strip())]
    return words[-1] if words else "it printed nothing"
