"""`sftdoctor train RUN.toml`: validate, gate, plan, then start the recipe (torchrun for several processes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from sftdoctor import report
from sftdoctor.checks import load_checks, run_checks
from sftdoctor.errors import InputError
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.configs import hub_cache_config
from sftdoctor.facts.packages import module_file
from sftdoctor.train import resolve
from sftdoctor.train.checkpoints import checkpoints, newest_complete, remove_incomplete

STOPPED = "stopped.json"  # written by sftdoctor.train.watch (kept in step with watch.STOPPED)

SMOKE_STEPS, SMOKE_SAVE_AT, SMOKE_ROWS = 4, 2, 64
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def parse_drill(text: str) -> dict[str, Any]:
    """"nan-loss@5" -> a non-finite loss at step 5 on every rank; "hang@3:1" -> rank 1 blocks at step 3."""
    kind, _, where = text.partition("@")
    step, _, rank = where.partition(":")
    if kind not in ("nan-loss", "hang") or not step.isdigit() or int(step) < 1 or (rank and not rank.isdigit()):
        raise InputError("--drill", f"expected nan-loss@STEP[:RANK] or hang@STEP[:RANK], got {text!r}")
    return {"kind": kind, "step": int(step), "rank": int(rank) if rank else None}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def build_plan(run_config: dict[str, Any], facts: Facts, smoke: bool) -> dict[str, Any]:
    gpus, packages = facts.get("gpus"), facts.get("packages") or {}
    probe = facts.get("packing_probe") or {}
    plan = resolve.make_plan(run_config, gpus, packages, facts.get("transformers_features"),
                             packing_isolated=probe.get("isolated"))
    training = run_config["training"]
    launch = run_config["launch"]
    plan.update(
        shape=(facts.get("data") or {})["train"]["shape"],
        seed=training["seed"],
        logging_steps=training["logging_steps"],
        save_steps=training["save_steps"],
        max_steps=training.get("max_steps"),
        cuda=bool((gpus or {}).get("devices")),
        watch=run_config["watch"],
        # The process group gives up only after our watchdog has named the rank behind, even while a
        # checkpoint saves (the watchdog then allows 4x hang_timeout_s).
        ddp_timeout_s=int(4 * run_config["watch"]["hang_timeout_s"] + 120),
        moe=any(k in (facts.get("model_config") or {}).get("raw_keys", ()) for k in MOE_KEYS),
        master_addr=launch["master_addr"],
        master_port=free_port() if launch["master_port"] == "auto" else launch["master_port"],
    )
    if smoke:
        plan.update(max_steps=SMOKE_STEPS, save_steps=SMOKE_SAVE_AT, logging_steps=1, data_limit=SMOKE_ROWS,
                    gradient_accumulation_steps=1, global_batch_size=plan["per_device_batch_size"] * plan["world_size"],
                    output_dir=str(Path(plan["output_dir"]) / "smoke"))
    return plan


def schedule(plan: dict[str, Any]) -> str:
    floor = ", ".join(f"{k}={v:g}" for k, v in plan["lr_scheduler_kwargs"].items()) or "no floor"
    warmup = next(iter(plan["warmup"].values()))
    return f"{floor}; warmup {f'{warmup:.0%} of the run' if warmup < 1 else f'{int(warmup)} steps'}"


def memory_plan(run_config: dict[str, Any], facts: Facts) -> str:
    shape = facts.get("model_shape")
    if shape is None:
        return f"memory          not planned: {facts.why_missing('model_shape')}"
    from sftdoctor.plan import plan_run, report as plan_report
    from sftdoctor.plan.shape import Shape

    planned = plan_run(run_config, Shape(**shape), facts.get("gpus"), facts.get("packages") or {},
                       facts.get("deepspeed_config"))
    return plan_report.summary(planned)


def describe(plan: dict[str, Any]) -> str:
    ds = plan["deepspeed"]
    stage = (ds or {}).get("zero_optimization", {}).get("stage") if ds else None
    lines = [
        f"world size      {plan['world_size']} ({plan['nproc_per_node']} per node x {plan['nnodes']} nodes)",
        f"global batch    {plan['global_batch_size']} = {plan['per_device_batch_size']} per device x "
        f"{plan['gradient_accumulation_steps']} accumulation x {plan['world_size']}",
        f"tokens per step <= {plan['tokens_per_step_max']:,} (max_length {plan['max_length']}, packing "
        f"{'on' if plan['packing'] else 'off'})",
        f"precision       {plan['precision']}; attention {plan['attn_implementation']}; liger-kernel "
        f"{'on' if plan['liger_kernel'] else 'off'}",
        f"schedule        {schedule(plan)}",
        f"deepspeed       {'off' if ds is None else f'ZeRO-{stage}'}",
        f"run directory   {plan['output_dir']}",
    ]
    if ds is not None:
        lines.append("deepspeed json  " + json.dumps(ds))
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    """Whole or not at all: written beside, then renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def command(resolved_path: Path, plan: dict[str, Any], max_restarts: int) -> list[str]:
    worker = ["-m", "sftdoctor.train.sft", str(resolved_path)]
    if plan["world_size"] == 1:
        return [sys.executable, *worker]
    return [sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={plan['nnodes']}", f"--nproc-per-node={plan['nproc_per_node']}",
            f"--max-restarts={max_restarts}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={plan['master_addr']}:{plan['master_port']}",
            f"--rdzv-id=sftdoctor-{Path(plan['output_dir']).name}-{plan['master_port']}", *worker]


def is_hub_id(path: str) -> bool:
    return not Path(path).exists() and path.count("/") == 1 and not path.startswith((".", "/", "~"))


def worker_env(run_config: dict[str, Any], config: Path, run_dir: Path) -> dict[str, str]:
    """The workers' environment: offline-safe model loading and reporting."""
    env = dict(os.environ)
    model = run_config["model"]
    hub_ids = [p for p in {model["path"], model.get("tokenizer") or model["path"]} if is_hub_id(p)]
    missing = [p for p in hub_ids if hub_cache_config(p) is None]
    if missing and env.get("HF_HUB_OFFLINE") == "1":
        raise InputError(config, f"{missing[0]} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1",
                         key="[model].path")
    if hub_ids and not missing:
        env.setdefault("HF_HUB_OFFLINE", "1")  # everything is cached: never wait on a hub that may be unreachable
    to = run_config["report"]["to"]
    if to != "none" and find_spec(to) is None:
        raise InputError(config, f"{to} is not installed (pip install {to})", key="[report].to")
    if to == "wandb":
        env.setdefault("WANDB_DIR", str(run_dir))
        if "WANDB_API_KEY" not in env:
            env.setdefault("WANDB_MODE", "offline")  # no credentials: log locally, `wandb sync` later
    # NCCL runs: PyTorch's flight recorder on, its dumps in the run directory.
    for name, value in flight_recorder_env(run_dir).items():
        env.setdefault(name, value)
    return env


def flight_recorder_env(run_dir: Path) -> dict[str, str]:
    """PyTorch's NCCL flight recorder, dumping into the run directory, under the names the installed torch
    reads: torch 2.13 reads TORCH_FR_BUFFER_SIZE / TORCH_FR_DUMP_TEMP_FILE and warns on the older
    TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE; TORCH_NCCL_DUMP_ON_TIMEOUT kept its
    name. Which generation is installed is read from its c10d FlightRecorder.hpp."""
    header = module_file("torch", "include", "torch", "csrc", "distributed", "c10d", "FlightRecorder.hpp")
    new = header is not None and "TORCH_FR_BUFFER_SIZE" in header.read_text(errors="replace")
    dump = str(run_dir / "nccl-trace-rank-")
    if new:
        return {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": dump}
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump}


def start(resolved: dict[str, Any], run_dir: Path, max_restarts: int, env: dict[str, str]) -> int:
    resolved_path = run_dir / ("resolved-smoke.json" if resolved.get("smoke") else "resolved.json")
    write_json(resolved_path, resolved)
    stopped = run_dir / STOPPED
    stopped.unlink(missing_ok=True)
    code = subprocess.run(command(resolved_path, resolved["plan"], max_restarts), env=env).returncode
    if code and stopped.exists():  # a watcher stopped the run: its own exit code, whatever torchrun says
        record = json.loads(stopped.read_text())
        print(f"sftdoctor: stopped by {record['id']}: {record['title']} (exit {record['exit_code']})", flush=True)
        return int(record["exit_code"])
    return code


def train(config: Path, resume: bool = False, dry_run: bool = False, smoke: bool = False, force: bool = False,
          drill: dict[str, Any] | None = None) -> int:
    facts = Facts(Inputs(config=config))
    run_config = facts.get("run_config")
    facts.get("data")  # bad data files are bad input: exit 2 before anything runs
    registry = load_checks()
    findings, skipped = run_checks(registry.phase("preflight"), facts)
    findings = registry.problems + findings
    report.render_table(findings, skipped)
    blocked = report.exit_code(findings) == 1
    plan = build_plan(run_config, facts, smoke)
    plan["drill"] = drill
    print("\n" + describe(plan), flush=True)
    if dry_run:
        print(memory_plan(run_config, facts))
        return 1 if blocked and not force else 0
    if blocked and not force:
        print("\nsftdoctor: not starting: the checks above found errors (fix them, or run with --force)")
        return 1
    run_dir = Path(plan["output_dir"])
    env = worker_env(run_config, config, run_dir)
    existing = checkpoints(run_dir)
    if existing and not resume and not smoke:
        raise InputError(run_dir, "already holds checkpoints; add --resume to continue, or set another "
                                  "[training] output_dir", key="[training].output_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        remove_incomplete(run_dir)
        print(f"sftdoctor: resuming from {newest_complete(run_dir) or 'scratch: no complete checkpoint'}")
    if plan["deepspeed"] is not None:
        plan["deepspeed_path"] = str(run_dir / "deepspeed.json")
        write_json(Path(plan["deepspeed_path"]), plan["deepspeed"])
    with open(run_dir / "findings.jsonl", "a", encoding="utf-8") as log:
        for finding in findings:
            log.write(json.dumps({"phase": "preflight", "time": time.time(), "forced": force and blocked,
                                  **finding.to_json()}, default=str) + "\n")
    resolved = {"run_config": run_config, "plan": plan, "resume": resume, "forced": force and blocked,
                "smoke": smoke}
    max_restarts = run_config["launch"]["max_restarts"]
    if not smoke:
        return start(resolved, run_dir, max_restarts, env)
    began = time.perf_counter()
    code = start({**resolved, "stop_after_step": SMOKE_SAVE_AT}, run_dir, max_restarts, env)
    if code == 0:
        code = start({**resolved, "resume": True}, run_dir, max_restarts, env)
    verdict = "passed" if code == 0 else f"FAILED (exit {code})"
    print(f"\nsftdoctor: smoke test {verdict}: {SMOKE_STEPS} steps with a save at step {SMOKE_SAVE_AT} and a resume, "
          f"in {time.perf_counter() - began:.0f} s ({run_dir})")
    return code
