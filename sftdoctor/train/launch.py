"""`sftdoctor train RUN.toml`: validate, gate, plan, then start the recipe (torchrun for several processes).

Every setting comes from the one Plan (sftdoctor.run.resolve); this module only runs the gate, prints the
plan and starts the workers with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from sftdoctor import render
from sftdoctor.checks import load_checks, run_checks
from sftdoctor.distributed import gate as shared_gate
from sftdoctor.errors import InputError
from sftdoctor.findings import Severity
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.configs import hub_cache_config, hub_unreachable, is_hub_id
from sftdoctor.run import Plan, for_launch
from sftdoctor.run.resolve import REHEARSAL_SAVE_AT, REHEARSAL_STEPS
from sftdoctor.run.checkpoints import checkpoints, newest_complete, remove_incomplete, step_of
from sftdoctor.run.rundir import FINDINGS, LOG, METRICS, RESOLVED, STOPPED
from sftdoctor.train.processes import SIGNAL_EXIT, run_workers
from sftdoctor.train.summary import line_count, read_records, summary
from sftdoctor.train import compat, noise
from sftdoctor.train.evaluation import evaluate_run, result_line


def parse_drill(text: str) -> dict[str, Any]:
    """"nan-loss@5" -> a non-finite loss at step 5 on every rank; "hang@3:1" -> rank 1 blocks at step 3."""
    kind, _, where = text.partition("@")
    step, _, rank = where.partition(":")
    if (kind not in ("nan-loss", "hang") or not re.fullmatch(r"[0-9]+", step) or int(step) < 1
            or (rank and not re.fullmatch(r"[0-9]+", rank))):
        raise InputError("--drill", f"expected nan-loss@STEP[:RANK] or hang@STEP[:RANK], got {text!r}")
    return {"kind": kind, "step": int(step), "rank": int(rank) if rank else None}


def check_drill(drill: dict[str, Any] | None, plan: Plan) -> None:
    """A drill that can never fire is bad input: a rank the run does not have, a step after its end."""
    if drill is None:
        return
    if drill["rank"] is not None and drill["rank"] >= plan.world_size:
        raise InputError("--drill", f"rank {drill['rank']} does not exist: the run has {plan.world_size} "
                                    f"process{'es' if plan.world_size > 1 else ''} (ranks 0-{plan.world_size - 1})")
    if plan.total_steps and drill["step"] > plan.total_steps:
        raise InputError("--drill", f"step {drill['step']} comes after the run's last step ({plan.total_steps})")


def finished(run_dir: Path) -> str | None:
    """"step N of N" when the newest complete checkpoint is the run's last step and final/ was written."""
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
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if json.loads(line).get("step", 0) <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def schedule(plan: Plan) -> str:
    floor = ", ".join(f"{k}={v:g}" for k, v in plan.lr_scheduler_kwargs.items()) or "no floor"
    (key, value), = plan.warmup.items()
    warm = f"{value:.0%} of the run" if key == "warmup_ratio" or value < 1 else f"{int(value)} steps"
    return f"{floor}; warmup {warm}"


def memory_summary(plan: Plan, facts: Facts) -> str:
    from sftdoctor.plan.render import summary
    from sftdoctor.run.gpus import devices, smallest_memory
    from sftdoctor.run.resolve import memory_fit
    from sftdoctor.run.shape import Shape

    shape, gpus = facts.get("model_shape"), facts.get("gpus")
    if not devices(gpus) or not smallest_memory(gpus):
        return "memory          not planned: no GPU of known memory here (sftdoctor plan --gpu-memory plans for another machine)"
    if shape is None or "error" in shape:
        return f"memory          not planned: {(shape or {}).get('error') or facts.why_missing('model_shape')}"
    return summary(memory_fit(plan, Shape(**shape), smallest_memory(gpus)))


def adapters_line(lora: dict) -> str:
    from sftdoctor.train.adapters import describe

    line = describe(lora)
    if lora.get("trainable_params") and lora.get("base_params"):
        share = lora["trainable_params"] / lora["base_params"]
        line += f": {lora['trainable_params']:,} trainable of {lora['base_params']:,} ({share:.2%})"
    return line + ("; merged at the end" if lora["merge"] else "")


def loading(plan: Plan, run_dir: Path) -> list[str]:
    """How to load what the run wrote: the model, or the adapter (and the merged model)."""
    from sftdoctor.train.adapters import MERGED

    final = os.path.normpath(run_dir / "final")
    if plan.lora is None:
        return [f"load it: AutoModelForCausalLM.from_pretrained({final!r})"]
    lines = [f"load it: peft.AutoPeftModelForCausalLM.from_pretrained({final!r}) (base + adapter)"]
    if plan.lora["merge"]:
        lines.append(f"or merged: AutoModelForCausalLM.from_pretrained({os.path.normpath(run_dir / MERGED)!r})")
    return lines


def describe(plan: Plan) -> str:
    accumulation = plan.gradient_accumulation_steps or "no whole"
    lines = [
        f"world size      {plan.world_size} ({plan.nproc_per_node} per node x {plan.nnodes} node"
        f"{'s' if plan.nnodes > 1 else ''})",
        f"global batch    {plan.global_batch_size} = {plan.per_device_batch_size} per device x {accumulation} "
        f"accumulation x {plan.world_size}",
        f"tokens per step <= {plan.tokens_per_step_max:,} (max_length {plan.max_length})",
        f"packing         {'on' if plan.packing else 'off'} ({plan.reasons.get('packing')})",
        f"checkpointing   {'on' if plan.checkpointing else 'off'} ({plan.reasons.get('checkpointing')})",
        f"precision       {plan.precision} (weights loaded in {plan.load_dtype}); attention {plan.attn_implementation}; "
        f"liger-kernel {'on' if plan.liger_kernel else 'off'}",
        f"schedule        {schedule(plan)}",
        f"loss            {'assistant turns only' if plan.assistant_only_loss else 'completions only' if plan.data_shape == 'prompt_completion' else 'every token'}"
        + (f"; chat template {Path(plan.chat_template).name}" if plan.chat_template else ""),
        f"deepspeed       {'off' if plan.deepspeed is None else f'ZeRO-{plan.zero_stage} ({plan.deepspeed_source})'}",
        f"run directory   {os.path.normpath(plan.output_dir)}",
    ]
    if plan.lora is not None:
        lines.insert(-2, f"adapters        {adapters_line(plan.lora)}")
    if "global_batch_size" in plan.reasons:
        lines.insert(1, f"                {plan.reasons['global_batch_size']}")
    if plan.deepspeed is not None:
        lines.append("deepspeed json  " + json.dumps(plan.deepspeed))
    if plan.world_size > 1:
        lines.insert(1, f"rendezvous      {plan.master_addr}:{plan.master_port} ({plan.reasons.get('master_port')})")
    if plan.nnodes > 1:
        lines.insert(1, f"node rank       {plan.node_rank} ({plan.reasons.get('node_rank')})")
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    """Whole or not at all: written beside, then renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def command(resolved_path: Path, plan: Plan, resume: bool, stop_after: int | None) -> list[str]:
    worker = ["-m", "sftdoctor.train.sft", str(resolved_path)] + (["--resume"] if resume else []) + \
             ([f"--stop-after={stop_after}"] if stop_after else [])
    if plan.world_size == 1:
        return [sys.executable, *worker]
    # With the c10d rendezvous torchrun ignores --node-rank; node 0 hosting the store is what the rank means
    # (torch 2.x run.py and c10d_rendezvous_backend.py: "is_host"), so say it instead of relying on hostname matching.
    host = [f"--rdzv-conf=is_host={'true' if plan.node_rank == 0 else 'false'},join_timeout={plan.join_timeout_s}"] \
        if plan.nnodes > 1 else []
    return [sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={plan.nnodes}", f"--nproc-per-node={plan.nproc_per_node}",
            f"--max-restarts={plan.max_restarts}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={plan.master_addr}:{plan.master_port}", *host,
            f"--rdzv-id={rendezvous_id(plan)}", *worker]


def rendezvous_id(plan: Plan) -> str:
    """The same on every node of a run, another for its rehearsal (another run directory)."""
    return f"sftdoctor-{Path(plan.output_dir).name}-{plan.master_port}"


def worker_env(plan: Plan, config: Path, run_dir: Path) -> dict[str, str]:
    """The workers' environment: offline-safe model loading and reporting."""
    env = dict(os.environ)
    hub_ids = [p for p in {plan.model_path, plan.tokenizer_path} if is_hub_id(p)]
    missing = [p for p in hub_ids if hub_cache_config(p) is None]
    if missing and env.get("HF_HUB_OFFLINE") == "1":
        raise InputError(config, f"{missing[0]} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1",
                         key="[model].path")
    for model_id in missing:
        if why := hub_unreachable(model_id):
            key = "[model].path" if model_id == plan.model_path else "[model].tokenizer"
            raise InputError(config, f"{model_id} is not in the local Hugging Face cache, and {why}", key=key)
    if hub_ids and not missing:
        env.setdefault("HF_HUB_OFFLINE", "1")  # everything is cached: never wait on a hub that may be unreachable
    to = plan.report_to
    if to != "none" and find_spec(to) is None:
        raise InputError(config, f"{to} is not installed (pip install {to})", key="[report].to")
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


def start(plan: Plan, run_dir: Path, env: dict[str, str], resume: bool, stop_after: int | None = None,
          config: Path | None = None, log: Path | None = None) -> int:
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
    resumed_from = newest_complete(run_dir) if resume else None
    first_step = step_of(resumed_from) if resumed_from else 0
    try:
        code, sig = run_workers(command(resolved_path, plan, resume, stop_after), env, log, echo=echo,
                                grace_s=plan.stop_grace_s, launcher=plan.world_size > 1)
    finally:
        if not owner(plan):
            shutil.rmtree(resolved_path.parent, ignore_errors=True)
    if sig is not None:  # asked to stop (Ctrl-C, scancel): `sftdoctor report RUN_DIR` draws it later
        checkpoint = newest_complete(run_dir)
        step = max((s for s in (last_step(run_dir), checkpoint and step_of(checkpoint)) if s), default=None)
        print(f"\nsftdoctor: stopped by {signal.Signals(sig).name}"
              + (f" after step {step}" if step is not None else "")
              + f"; newest complete checkpoint: {os.path.normpath(checkpoint) if checkpoint else 'none yet'}"
              + (f"; resume with: sftdoctor train {os.path.normpath(config)} --resume"
                 if config and not plan.rehearsal else ""), flush=True)
        return SIGNAL_EXIT[sig]
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
        print(f"\nsftdoctor: the run failed (exit {code}"
              + (f", after step {step}" if step is not None and step > first_step else ", before its first step")
              + f"): {failure_cause(log, log_from)}", flush=True)
        if drawn:
            print_report_line(run_dir, plan)
    elif not stop_after and not plan.rehearsal:
        evaluated = evaluate_run(plan, run_dir, env, log) if plan.evaluation and owner(plan) else None
        where = report_of(run_dir, plan) if owner(plan) else f"written by node 0 ({plan.master_addr})"
        text = summary(run_dir, read_records(run_dir / METRICS, records_from), time.perf_counter() - began,
                       first_step, newest_complete(run_dir), loading(plan, run_dir), report=where)
        line = result_line(run_dir) if evaluated == 0 else None
        print("\n" + text + (f"\n  eval         {line}" if line else ""), flush=True)
        if evaluated:
            how = (f"was stopped by {signal.Signals(evaluated - 128).name}" if evaluated in SIGNAL_EXIT.values()
                   else f"failed (exit {evaluated})")
            print(f"\nsftdoctor: the evaluation {how}; the trained model is in "
                  f"{os.path.normpath(run_dir / 'final')} (line {line_count(log)} of {os.path.normpath(log)})", flush=True)
            return evaluated
    return code


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
    print(f"\nsftdoctor: submitted {os.path.normpath(path)} as Slurm job {job} (squeue -j {job}; its output: "
          f"{os.path.normpath(Path(plan.output_dir) / f'slurm-{job}.out')})")
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
    if lead is not None:
        return f"{lead.finding.title} (line {before + lead.line} of {shown}; `sftdoctor explain --log {shown}`)"
    words = [line.strip() for line in tail if not BANNER.fullmatch(line.strip())]
    return words[-1] if words else "it printed nothing"


def gate(facts: Facts, plugins: bool) -> tuple[list, bool]:
    """The preflight suite on this machine and this config; (findings, any error)."""
    registry = load_checks(plugins)
    findings, skipped = run_checks(registry.phase("preflight"), facts)
    findings = registry.problems + findings
    render.render_table(findings, skipped)
    return findings, render.exit_code(findings) == 1


def preflight(config: Path, plugins: bool, facts_file: Path | None = None) -> tuple[Facts, list, bool]:
    """The gate of `sftdoctor train`, and of every trial of `sftdoctor sweep`: the run config and its data read
    (bad input raises, before anything runs), the preflight checks run and shown; (facts, findings, any
    error). `facts_file`: judge a recorded machine's facts (`sftdoctor facts`) instead of this one's."""
    facts = Facts(Inputs(config=config, facts=facts_file))
    facts.get("run")  # a bad run config or data file is bad input: exit 2 before anything runs
    facts.get("data")
    findings, blocked = gate(facts, plugins)
    if facts.get("plan") is None:  # a probe of the run's inputs failed: nothing to launch
        raise InputError(config, f"the run cannot be planned: {facts.why_missing('plan') or facts.why_missing('run')}")
    return facts, findings, blocked


def record_preflight(run_dir: Path, findings: list, forced: bool = False) -> None:
    """The gate's findings appended to RUN_DIR/findings.jsonl (the report marks them before step 0)."""
    with open(run_dir / FINDINGS, "a", encoding="utf-8") as log:
        for finding in findings:
            log.write(json.dumps({"phase": "preflight", "time": time.time(), "host": socket.gethostname(),
                                  "forced": forced, **finding.to_json()}, default=str) + "\n")


def rejoining(plan: Plan) -> bool:
    """A node other than 0 that finds its run in progress at the rendezvous (it crashed and is back, and the
    others wait in a restart round): it joins that round, without the shared gate or a rehearsal."""
    if plan.nnodes == 1 or owner(plan) or plan.rehearsal:
        return False
    if not shared_gate.in_progress(plan.master_addr, plan.master_port, compat.rendezvous_key(rendezvous_id(plan))):
        return False
    print(f"\nsftdoctor: the run is in progress at {plan.master_addr}:{plan.master_port}: this node rejoins it "
          f"(torchrun's next restart round; {plan.max_restarts} restart{'s' if plan.max_restarts != 1 else ''} allowed)",
          flush=True)
    return True


def nodes_agree(plan: Plan, findings: list, blocked: bool) -> bool:
    """Every node's gate verdict, shared (sftdoctor.distributed.gate): whether all of them let the run start. Says
    which node stops it, or which never came."""
    errors = [f.title for f in findings if f.severity is Severity.ERROR]
    print(f"\nsftdoctor: waiting for all {plan.nnodes} nodes' checks at {plan.master_addr}:{plan.master_port}", flush=True)
    try:
        verdicts = shared_gate.share(plan.master_addr, plan.master_port, plan.nnodes, plan.node_rank == 0,
                                     plan.join_timeout_s, {"blocked": blocked, "errors": errors})
    except shared_gate.GateError as e:
        print(f"sftdoctor: not starting: {e}", flush=True)
        return False
    me = socket.gethostname()
    others = [v for v in shared_gate.blocking(verdicts) if v["host"] != me]
    for v in others:
        print(f"sftdoctor: not starting: the checks on {v['host']} found errors: {'; '.join(v['errors'])} "
              "(fix them there, or run with --force on it)", flush=True)
    if not others:
        print(f"sftdoctor: {'every node passed its checks' if not blocked else 'the other nodes passed their checks'}: "
              f"{', '.join(v['host'] for v in verdicts)}", flush=True)
    return not others


TRAINING_STACK = ("torch", "transformers", "trl", "accelerate", "datasets")


def require_training_stack() -> None:
    """Before any check runs: a light install (`pip install -e .`) has none of the stack the workers import."""
    for module in TRAINING_STACK:
        if find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def train(config: Path, resume: bool = False, dry_run: bool = False, smoke: bool = False, force: bool = False,
          drill: dict[str, Any] | None = None, plugins: bool = True, rehearse_first: bool = True,
          batch: str | None = None) -> int:
    """`batch`: "write" the run as a Slurm batch script instead of training, or "submit" it too."""
    require_training_stack()
    facts, findings, blocked = preflight(config, plugins)
    plan = for_launch(facts.get("plan"), rehearsal=smoke, drill=drill, plugins=plugins, forced=force,
                      rehearse=rehearse_first)
    check_drill(drill, plan)
    print("\n" + describe(plan), flush=True)
    if dry_run:
        print(memory_summary(plan, facts))
        return 1 if blocked and not force else 0
    if batch is not None:
        return batch_job(plan, config, facts.get("run"), blocked and not force, batch == "submit")
    rejoin = rejoining(plan)
    if plan.nnodes > 1 and not rejoin and not nodes_agree(plan, findings, blocked and not force):
        return 1
    if blocked and not force:
        print("\nsftdoctor: not starting: the checks above found errors (fix them, or run with --force)")
        return 1
    run_dir = Path(plan.output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(config, f"{run_dir} exists and is not a folder", key="[training].output_dir")
    env = worker_env(plan, config, run_dir)
    if (plan.rehearsal or plan.drill) and owner(plan):  # each rehearsal and drill starts clean
        shutil.rmtree(run_dir, ignore_errors=True)
    if checkpoints(run_dir) and not resume:
        raise InputError(run_dir, "already holds checkpoints; add --resume to continue, or set another "
                                  "[training] output_dir", key="[training].output_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    done = finished(run_dir) if resume and not smoke else None
    if done:
        print(f"sftdoctor: the run is complete ({done}); the final model is in {os.path.normpath(run_dir / 'final')}")
        return 0
    if resume:
        if owner(plan):
            remove_incomplete(run_dir)
        checkpoint = newest_complete(run_dir)
        if owner(plan):
            forget_metrics_after(run_dir, step_of(checkpoint) if checkpoint else 0)
        print(f"sftdoctor: resuming from {checkpoint or 'scratch: no complete checkpoint'}")
    if plan.deepspeed is not None and owner(plan):
        write_json(run_dir / "deepspeed.json", plan.deepspeed)  # for the reader; the workers take it from the plan
    record_preflight(run_dir, findings, forced=force and blocked)
    if plan.rehearse and not rejoin:
        began, log = time.perf_counter(), node_file(run_dir, "rehearsal.log", plan)
        log.unlink(missing_ok=True)
        print("sftdoctor: rehearsing on the shrunk model (4 steps, a save and a resume; --no-rehearse skips it)",
              flush=True)
        rehearsal = for_launch(facts.get("plan"), rehearsal=True, plugins=plugins, forced=force)
        if owner(plan):
            shutil.rmtree(rehearsal.output_dir, ignore_errors=True)  # each rehearsal starts clean
        code = rehearse(rehearsal, env, log)
        if code in SIGNAL_EXIT.values():
            return code
        if code:
            print(f"sftdoctor: not starting: the rehearsal failed (exit {code}): {failure_cause(log)}", flush=True)
            return 1
        print(f"sftdoctor: rehearsal passed in {time.perf_counter() - began:.0f} s", flush=True)
    if not smoke:
        return start(plan, run_dir, env, resume, config=config)
    began = time.perf_counter()
    code = rehearse(plan, env)
    verdict = "passed" if code == 0 else f"FAILED (exit {code})"
    print(f"\nsftdoctor: smoke test {verdict}: {REHEARSAL_STEPS} steps with a save at step {REHEARSAL_SAVE_AT} and a "
          f"resume, in {time.perf_counter() - began:.0f} s ({run_dir})")
    return code
