"""The steps of the GPU suite. Each takes the Context and returns {"figures": {...}} (with "not_run" for the
parts it could not run and why, and "detail" for what goes only into the JSON), or {"skipped": reason}. A step
that fails raises (procs.ChildFailed carries the child's output tail); the suite records it and goes on."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import procs
import workload as wl
from context import Context, last_json

GIB = 2**30
# the findings of `check --distributed` that carry a link's all-reduce sweep (evidence["sizes"])
BANDWIDTH_IDS = ("collective-bandwidth/measured", "collective-bandwidth/below-expected")
CPU_PLAN_MEMORY = "16GiB"  # the rehearsal has no GPU to plan for: `sftdoctor plan --gpu-memory` this
SFTDOCTOR_ATTN = ["eager", "sdpa", "flash_attention_2"]  # [model] attn_implementation's choices
FLASH = {
    "flash_attention_2": ("flash-attn", "flash_attn"),  # the package each needs: env_probe.py's key
    "flash_attention_3": ("flash-attn 3 (flash_attn_interface)", "flash_attn_3"),
}


# ================================================================ shared: sftdoctor runs and plans


def run_config(
    ctx: Context,
    name: str,
    steps: int | None = None,
    batch: int | None = None,
    training: dict[str, Any] | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
) -> Path:
    load = ctx.load
    return wl.write_config(
        ctx.work / "configs" / f"{name}.toml",
        load,
        ctx.work / "runs" / name,
        steps or load.max_steps,
        batch or load.batch,
        training,
        sections,
    )


def train(ctx: Context, name: str, config: Path, share: float = 1.0, pin: bool = True, **env: str) -> dict[str, Any]:
    """`sftdoctor train CONFIG` on one GPU (or the CPU), once per name: what it resolved (resolved.json), its
    step records (metrics.jsonl) and its gate's verdict. The checkpoint and final model are deleted (GBs).
    --force: a gate error is recorded, not a reason to lose the run; --no-rehearse: one process, no DeepSpeed."""
    runs = ctx.memo.setdefault("runs", {})
    if name in runs:
        if isinstance(runs[name], Exception):
            raise runs[name]
        return runs[name]
    began = time.monotonic()
    try:
        _, stdout, stderr = ctx.sftdoctor(
            f"train-{name}",
            "train",
            str(config),
            "--force",
            "--no-rehearse",
            timeout=ctx.share(share),
            env=ctx.env(pin=pin, **env),
        )
        run_dir = ctx.work / "runs" / name
        records = wl.read_records(run_dir / "metrics.jsonl")
        if not records:
            raise procs.ChildFailed(
                f"sftdoctor train {name}: no step records in metrics.jsonl", procs.tail(stdout + stderr)
            )
    except procs.ChildFailed as exc:
        cause = next((line.strip() for line in exc.tail.splitlines() if "the run failed" in line), None)
        runs[name] = procs.ChildFailed(f"sftdoctor train {name}: {cause}", exc.tail) if cause else exc
        raise runs[name] from exc
    except Exception as exc:
        runs[name] = exc
        raise
    for folder in [*run_dir.glob("checkpoint-*"), run_dir / "final"]:
        shutil.rmtree(folder, ignore_errors=True)
    gate = next((line.strip() for line in stdout.splitlines() if " checks: " in line and "error" in line), None)
    runs[name] = {
        "name": name,
        "config": config,
        "plan": json.loads((run_dir / "resolved.json").read_text()),
        "records": records,
        "gate": gate,
        "seconds": round(time.monotonic() - began, 1),
    }
    return runs[name]


def settings(plan: dict[str, Any]) -> str:
    """What sftdoctor decided, in one line (from resolved.json)."""
    return (
        f"{plan['precision']} (weights {plan['load_dtype']}), {plan['attn_implementation']}, "
        f"packing {'on' if plan['packing'] else 'off'}, liger {'on' if plan['liger_kernel'] else 'off'}, "
        f"checkpointing {'on' if plan['checkpointing'] else 'off'}, micro-batch {plan['per_device_batch_size']}"
    )


def sftdoctor_plan(ctx: Context, config: Path, timeout: float, pin: bool = True) -> dict[str, Any]:
    """`sftdoctor plan CONFIG --json` (exit 1 only says the setting does not fit), once per config."""
    plans = ctx.memo.setdefault("plans", {})
    if config not in plans:
        memory = ["--gpu-memory", CPU_PLAN_MEMORY] if not ctx.cuda else []
        _, stdout, _ = ctx.sftdoctor(
            f"plan-{config.stem}",
            "plan",
            str(config),
            "--json",
            *memory,
            timeout=timeout,
            ok=(0, 1),
            env=ctx.env(pin=pin),
        )
        plans[config] = last_json(stdout)
    return plans[config]


def mean(values: list[float]) -> float | None:
    return statistics.mean(values) if values else None


# ================================================================ machine: facts and check, kept as a fixture

RAW = {  # file in the fixture folder: the command, as tests/fixtures/nvidia_smi and topology keep them
    "nvidia-smi.txt": ["nvidia-smi"],
    "nvidia-smi-q.txt": ["nvidia-smi", "-q"],
    "nvidia-smi-topo-m.txt": ["nvidia-smi", "topo", "-m"],
    "nvidia-smi-nvlink-status.txt": ["nvidia-smi", "nvlink", "--status"],
}


def machine(ctx: Context) -> dict[str, Any]:
    """`sftdoctor facts` and `sftdoctor check --json` on this machine, saved as a recorded fixture with the raw
    nvidia-smi outputs; sftdoctor's NVML and nvidia-smi probes compared with each other and with torch."""
    folder = ctx.fixture_dir
    folder.mkdir(parents=True, exist_ok=True)
    _, facts_out, _ = ctx.sftdoctor("facts", "facts", timeout=ctx.share(0.4))
    facts = json.loads(facts_out)
    (folder / "facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    code, check_out, _ = ctx.sftdoctor("check", "check", "--json", timeout=ctx.share(0.5), ok=(0, 1))
    check = json.loads(check_out)
    (folder / "check.json").write_text(json.dumps(check, indent=2) + "\n")
    recorded, not_run = raw_outputs(ctx, folder)
    gpus = facts["facts"].get("gpus") or {}
    devices = gpus.get("devices") or []
    problems = [
        f"{f['severity']} {f['id']}: {f['title']}" for f in check["findings"] if f["severity"] in ("error", "warning")
    ]
    figures = {
        "GPUs (sftdoctor facts)": describe_devices(devices) if devices else f"none: {gpus.get('error')}",
        "GPU probe source": gpus.get("source") or "none",
        "driver / its CUDA": f"{gpus.get('driver_version')} / {gpus.get('cuda_version')}",
        "torch (its CUDA)": f"{ctx.machine['torch'].get('torch')} ({ctx.machine['torch'].get('cuda_build')})",
        "check": f"{summary_line(check['summary'])}, exit {code}",
        "check errors and warnings": "; ".join(problems) or "none",
        "fixture": str(folder),
    }
    if ctx.rehearsal or not devices:
        not_run["NVML vs nvidia-smi vs torch"] = "no NVIDIA GPU: nothing to compare"
    else:
        figures.update(compare_views(ctx.machine))
    write_index(folder, facts, recorded)
    return {
        "figures": figures,
        "not_run": not_run,
        "detail": {"files": sorted(p.name for p in folder.iterdir()), "probes": ctx.machine},
    }


def raw_outputs(ctx: Context, folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    recorded, not_run = {}, {}
    if ctx.rehearsal or shutil.which("nvidia-smi") is None:
        return recorded, {"raw nvidia-smi outputs": "no nvidia-smi" if not ctx.rehearsal else "CPU rehearsal: no GPU"}
    for name, command in RAW.items():
        try:
            _, out, _ = procs.run(command, ctx.log(name), timeout=min(30, ctx.share(0.2)))
        except procs.ChildFailed as exc:
            not_run[name] = exc.line
            continue
        (folder / name).write_text(out)
        recorded[name] = " ".join(command)
    return recorded, not_run


def summary_line(summary: dict[str, int]) -> str:
    return ", ".join(f"{summary.get(k, 0)} {k}" for k in ("error", "warning", "info", "ok", "skipped"))


def describe_devices(devices: list[dict[str, Any]]) -> str:
    names = sorted({d.get("name") for d in devices})
    first = devices[0]
    return (
        f"{len(devices)}x {', '.join(map(str, names))} ({first.get('memory_total_mib'):,} MiB, "
        f"cc {first.get('compute_capability')})"
    )


def compare_views(machine: dict[str, Any]) -> dict[str, str]:
    """Do NVML, nvidia-smi and torch agree on the GPUs (name, memory, compute capability)?"""

    def rows(view):
        return [
            (d.get("name"), d.get("memory_total_mib"), d.get("compute_capability")) for d in view.get("devices") or []
        ]

    nvml, smi, torch = (
        rows(machine.get("nvml", {})),
        rows(machine.get("nvidia_smi", {})),
        rows(machine.get("torch", {})),
    )
    out = {
        "NVML vs nvidia-smi": "agree"
        if nvml and nvml == smi
        else f"differ: NVML {nvml or machine.get('nvml', {}).get('error')}; "
        f"nvidia-smi {smi or machine.get('nvidia_smi', {}).get('error')}"
    }
    if nvml and torch and len(nvml) != len(torch):
        out["torch vs NVML"] = (
            f"torch sees {len(torch)} of NVML's {len(nvml)} GPUs "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    elif nvml and torch:
        same = [(n, c) for n, _, c in nvml] == [(n, c) for n, _, c in torch]
        gap = max(abs((a or 0) - (b or 0)) for (_, a, _), (_, b, _) in zip(nvml, torch, strict=True))
        out["torch vs NVML"] = (
            f"{'same names and compute capability' if same else 'DIFFER: ' + repr((nvml, torch))}"
            f"; memory differs by up to {gap} MiB (torch counts what CUDA can allocate)"
        )
    return out


def write_index(folder: Path, facts: dict[str, Any], recorded: dict[str, str]) -> None:
    """index.json as the recorded fixtures have it: each file with where and how it was recorded."""
    gpus = facts["facts"].get("gpus") or {}
    source = f"recorded by bench/gpu/run.py on host {facts.get('host')} at {facts.get('collected_at')}"
    common = {
        "driver_version": gpus.get("driver_version"),
        "cuda_version": gpus.get("cuda_version"),
        "gpus": [
            {k: d.get(k) for k in ("index", "name", "memory_total_mib", "compute_capability")}
            for d in gpus.get("devices") or []
        ],
    }
    entries = [
        {"file": "facts.json", "source": f"{source}: `sftdoctor facts`", **common},
        {"file": "check.json", "source": f"{source}: `sftdoctor check --json`", **common},
    ]
    entries += [{"file": name, "source": f"{source}: `{command}`", **common} for name, command in recorded.items()]
    (folder / "index.json").write_text(json.dumps(entries, indent=2) + "\n")


# ================================================================ the packing probe under each attention


def packing_probe(ctx: Context) -> dict[str, Any]:
    """sftdoctor's packing probe (packed samples' logits against each alone) under each attention implementation
    installed here; on a GPU, eager and sdpa are probed on it as well."""
    impls, not_run = [], {}
    for impl in ctx.attn:
        package, module = FLASH.get(impl, (None, None))
        found = ctx.machine.get(module, {}) if module else {}
        if module and not found.get("installed"):
            not_run[impl] = f"{package} is not installed"
        elif module and not found.get("imports"):
            not_run[impl] = f"{package} does not import: {found.get('error')}"
        elif impl.startswith("flash") and not ctx.cuda:
            not_run[impl] = f"needs a CUDA GPU ({ctx.why_no_cuda()})"
        else:
            impls.append(impl)
    if "flex_attention" not in ctx.attn:
        not_run["flex_attention"] = (
            "not one of sftdoctor's choices; --attn ...,flex_attention adds it (its compile takes ~80 s on a CPU)"
        )
    _, out, _ = ctx.child(
        "packing-probe",
        "attention_probe.py",
        str(ctx.load.model_dir),
        ",".join(impls),
        *(["--cuda"] if ctx.cuda else []),
        timeout=ctx.left(),
    )
    results = last_json(out)
    figures = {}
    for name, r in results.items():
        if r.get("isolated") is None:
            figures[name] = f"not proven: {r.get('error')}"
            continue
        verdict = "isolated" if r["isolated"] else "NOT isolated"
        figures[name] = (
            f"{verdict} on {r.get('device')} (max |logit diff| {r['max_abs_diff']:.2g}, tolerance {r['tolerance']:g})"
        )
    return {"figures": figures, "not_run": not_run, "detail": results}


# =============================================================== throughput: sftdoctor's choices against TRL's defaults


def throughput(ctx: Context) -> dict[str, Any]:
    """The same model, data and steps: `sftdoctor train` with its own choices against a plain TRL SFTTrainer
    with its defaults, on the same GPU. Real tokens per second after the warm-up, and MFU for both."""
    load, figures, not_run, detail = ctx.load, {}, {}, {}
    config = run_config(ctx, "throughput")
    try:
        plan = sftdoctor_plan(ctx, config, timeout=min(120, ctx.share(0.3)))
    except (procs.ChildFailed, ValueError, KeyError) as exc:
        plan = None
        figures["sftdoctor plan"] = f"failed: {exc}"
        detail["plan_output_tail"] = getattr(exc, "tail", "")
    runs: dict[str, Any] = {}
    try:
        runs["sftdoctor"] = train(ctx, "throughput", config, share=0.6)
    except procs.ChildFailed as exc:
        figures["sftdoctor"] = f"failed: {exc.line}"
        detail["sftdoctor_output_tail"] = exc.tail
    try:
        runs["TRL"] = trl_baseline(ctx)
    except procs.ChildFailed as exc:
        figures["TRL"] = f"failed: {exc.line}"
        detail["trl_output_tail"] = exc.tail
    if not runs:
        raise procs.ChildFailed(
            "neither trainer ran", detail.get("sftdoctor_output_tail", "") + "\n" + detail.get("trl_output_tail", "")
        )
    parameters = plan["model"]["parameters"] if plan else runs["TRL"]["parameters"] if "TRL" in runs else None
    seq = wl.attention_seq_len(load.token_lengths)
    flops = wl.flops_per_token(load.config, parameters, seq) if parameters else None
    if flops:
        figures["model"] = (
            f"{load.name}: {parameters:,} parameters ({flops['non_embedding_parameters']:,} "
            f"non-embedding), max_length {load.max_length}, micro-batch {load.batch}, "
            f"{load.warmup} + {load.steps} steps"
        )
        figures["FLOPs per token (6N + attention)"] = flops["with_head"]
    figures["attention context (sum n^2 / sum n)"] = seq
    figures["peak bf16 TFLOPS per GPU"] = ctx.peak_tflops if ctx.peak_tflops else f"unknown: {ctx.peak_source}"
    rates = {}
    if "sftdoctor" in runs:
        ours = runs["sftdoctor"]
        rates["sftdoctor"] = trainer_figures(ctx, "sftdoctor", ours["records"], flops, figures, not_run)
        figures["sftdoctor settings"] = settings(ours["plan"])
        figures["sftdoctor gate"] = ours["gate"] or "no summary line"
        if ctx.cuda:
            figures["sftdoctor max_memory_allocated (GiB)"] = wl.peak_gib(ours["records"], "memory_allocated_gib")
        if plan and plan["time"].get("step_seconds"):
            figures["sftdoctor plan's step time at MFU 0.4 (s)"] = plan["time"]["step_seconds"]
    if "TRL" in runs:
        rates["TRL"] = trl_figures(ctx, runs["TRL"], flops, figures, not_run)
    if rates.get("sftdoctor") and rates.get("TRL"):
        figures["ratio sftdoctor / TRL (tokens/s)"] = rates["sftdoctor"] / rates["TRL"]
    if ctx.cuda and not ctx.machine.get("liger_kernel", {}).get("installed"):
        not_run["liger on CUDA"] = "liger-kernel is not installed: sftdoctor trained without it"
    if ctx.cuda and not ctx.machine.get("flash_attn", {}).get("imports"):
        not_run["flash-attn in training"] = "flash-attn is not installed (or does not import): sftdoctor chose sdpa"
    return {"figures": figures, "not_run": not_run, "detail": detail}


def trl_figures(ctx: Context, theirs: dict[str, Any], flops, figures: dict[str, Any], not_run: dict[str, str]):
    """The plain TRL run's figures, its settings and memory; its tokens per second."""
    rate = trainer_figures(ctx, "TRL", theirs["records"], flops, figures, not_run)
    figures["TRL settings"] = (
        f"{'bf16 autocast' if theirs['bf16'] else 'fp32'} ({theirs['dtype']} weights), "
        f"{theirs['attn_implementation']}, packing {'on' if theirs['packing'] else 'off'}, "
        f"checkpointing {'on' if theirs['gradient_checkpointing'] else 'off'}, "
        f"micro-batch {ctx.load.batch}, {theirs['optim']}"
    )
    if ctx.cuda and theirs.get("max_memory_allocated"):
        figures["TRL max_memory_allocated (GiB)"] = theirs["max_memory_allocated"] / GIB
    return rate


def trainer_figures(
    ctx: Context,
    who: str,
    records: list[dict[str, Any]],
    flops: dict[str, float] | None,
    figures: dict[str, Any],
    not_run: dict[str, str],
) -> float | None:
    warmup = ctx.load.warmup
    rate = wl.tokens_per_second(records, warmup)
    figures[f"{who} tokens/s"] = rate
    figures[f"{who} median step (s)"] = wl.median_step_s(records, warmup)
    padding = [r["padding_fraction"] for r in wl.measured(records, warmup) if "padding_fraction" in r]
    if padding:
        figures[f"{who} padding share"] = mean(padding)
    elif records and "slots" in records[-1]:
        figures[f"{who} padding share"] = 1 - records[-1]["tokens_seen"] / max(1, records[-1]["slots"])
    if not ctx.cuda:
        not_run[f"{who} MFU"] = ctx.why_no_cuda()
    elif flops is None:
        not_run[f"{who} MFU"] = "no parameter count (the plan failed, and so did the TRL run)"
    elif not ctx.peak_tflops:
        not_run[f"{who} MFU"] = f"the GPU's peak is unknown ({ctx.peak_source}); give --peak-tflops"
    else:
        figures[f"{who} MFU"] = wl.mfu(rate, flops["with_head"], ctx.peak_tflops)
        figures[f"{who} MFU (non-embedding 6N)"] = wl.mfu(rate, flops["non_embedding"], ctx.peak_tflops)
    return rate


def trl_baseline(ctx: Context) -> dict[str, Any]:
    load, result = ctx.load, ctx.work / "trl-result.json"
    ctx.child(
        "trl-baseline",
        "trl_baseline.py",
        str(load.model_dir),
        str(load.data),
        str(ctx.work / "runs" / "trl"),
        str(load.max_steps),
        str(load.batch),
        str(load.max_length),
        str(result),
        timeout=ctx.left(),
        env=ctx.env(pin=True),
    )
    return json.loads(result.read_text())


# ================================================================ the memory plan against max_memory_allocated


def memory_plan(ctx: Context) -> dict[str, Any]:
    """The plan's predicted peak per GPU against torch.cuda.max_memory_allocated (the largest of the
    memory_allocated_gib the runs log) for three settings: checkpointing on and off, two micro-batches."""
    figures, not_run, detail = {}, {}, {}
    chosen = memory_settings(ctx)
    for index, (label, name, config) in enumerate(chosen):
        detail[label] = {}
        runs_left = sum(1 for _, n, _ in chosen[index:] if ctx.cuda and n not in ctx.memo.get("runs", {}))
        plans_left = len(chosen) - index
        try:  # a run is worth about four plans
            predicted = sftdoctor_plan(ctx, config, timeout=ctx.share(1 / (plans_left + 4 * runs_left)))["current"]
        except (procs.ChildFailed, ValueError, KeyError) as exc:
            predicted = None
            figures[f"{label}: predicted"] = f"failed: {exc}"
            detail[label]["plan_output_tail"] = getattr(exc, "tail", "")
        if predicted:
            terms = {t["name"]: t["bytes"] for t in predicted["gpu_terms"]}
            live = predicted["gpu_peak_bytes"] - terms.get("fragmentation", 0) - terms.get("CUDA context and NCCL", 0)
            figures[f"{label}: predicted peak (GiB)"] = predicted["gpu_peak_bytes"] / GIB
            figures[f"{label}: predicted live tensors (GiB)"] = live / GIB
            detail[label].update(plan_setting=predicted["setting"], terms_gib={k: v / GIB for k, v in terms.items()})
        if not ctx.cuda and name != "throughput":
            not_run[f"{label}: measured"] = f"torch.cuda.max_memory_allocated needs a GPU ({ctx.why_no_cuda()})"
            continue
        try:
            run = train(ctx, name, config, share=1 / max(1, runs_left))
        except procs.ChildFailed as exc:
            figures[f"{label}: measured"] = f"failed: {exc.line}"
            detail[label]["output_tail"] = exc.tail
            continue
        detail[label]["run_settings"] = settings(run["plan"])
        allocated = wl.peak_gib(run["records"], "memory_allocated_gib")
        if allocated is None:
            not_run[f"{label}: measured"] = f"the run logged no CUDA memory ({ctx.why_no_cuda()})"
            continue
        figures[f"{label}: measured max_memory_allocated (GiB)"] = allocated
        figures[f"{label}: measured max_memory_reserved (GiB)"] = wl.peak_gib(run["records"], "memory_reserved_gib")
        if predicted:
            figures[f"{label}: predicted peak / measured allocated"] = predicted["gpu_peak_bytes"] / GIB / allocated
            figures[f"{label}: predicted live / measured allocated"] = live / GIB / allocated
    return {"figures": figures, "not_run": not_run, "detail": detail}


def memory_settings(ctx: Context) -> list[tuple[str, str, Path]]:
    """(label, run name, config): the throughput run's own setting (its run is reused), the other checkpointing,
    and half the micro-batch. Without a throughput run: checkpointing on and off at the micro-batch, and on at half."""
    load = ctx.load
    base = ctx.memo.get("runs", {}).get("throughput")
    checkpointing = base["plan"]["checkpointing"] if isinstance(base, dict) else True
    half = max(1, load.batch // 2)

    def label(ckpt: bool, batch: int) -> str:
        return f"checkpointing {'on' if ckpt else 'off'}, micro-batch {batch}"

    first = (
        (label(checkpointing, load.batch), "throughput", run_config(ctx, "throughput"))
        if isinstance(base, dict)
        else (
            label(checkpointing, load.batch),
            "memory-a",
            run_config(ctx, "memory-a", load.memory_steps, load.batch, {"gradient_checkpointing": checkpointing}),
        )
    )
    return [
        first,
        (
            label(not checkpointing, load.batch),
            "memory-b",
            run_config(ctx, "memory-b", load.memory_steps, load.batch, {"gradient_checkpointing": not checkpointing}),
        ),
        (
            label(checkpointing, half),
            "memory-c",
            run_config(ctx, "memory-c", load.memory_steps, half, {"gradient_checkpointing": checkpointing}),
        ),
    ]


# ================================================================ sharding: FSDP2 beside ZeRO-2 and ZeRO-3

ENGINES = {  # label: the run config's sharding section ({}: the bare header, every key at its default)
    "ZeRO-2": {"deepspeed": {"zero_stage": 2}},
    "ZeRO-3": {"deepspeed": {"zero_stage": 3}},
    "FSDP2": {"fsdp": {}},
}
REHEARSED_ENGINES = ["FSDP2"]  # the CPU rehearsal's time allows one 2-rank run: the new engine's


def sharding(ctx: Context) -> dict[str, Any]:
    """The throughput workload trained with each sharding engine on every GPU (2 gloo ranks in the rehearsal):
    real tokens/s after the warm-up, peak GPU memory (max_memory_allocated) and the plan's predicted peak for the
    same config (`sftdoctor plan --json`) next to it. The rehearsal trains FSDP2 only and reads host RSS instead."""
    ranks = 2 if ctx.rehearsal else len(ctx.cuda_devices)
    if not ctx.rehearsal and not ctx.cuda:
        return {"skipped": ctx.why_no_cuda()}
    figures: dict[str, Any] = {"ranks": f"{ranks} ({'gloo, CPU' if ctx.rehearsal else 'nccl'})"}
    not_run: dict[str, str] = {}
    detail: dict[str, Any] = {}
    engines = REHEARSED_ENGINES if ctx.rehearsal else list(ENGINES)
    if ranks < 2:  # sftdoctor refuses it (fsdp-world), as transformers would: nothing to shard over
        engines = [label for label in engines if label != "FSDP2"]
        not_run["FSDP2"] = f"{ranks} GPU: FSDP shards over 2 ranks or more (the fsdp-world check refuses one)"
    for label in ENGINES:
        if label not in engines and label not in not_run:
            not_run[label] = "CPU rehearsal: only the FSDP2 run fits its time (the ZeRO runs take the same code path)"
    rates, peaks = {}, {}
    for index, label in enumerate(engines):
        config = sharded_config(ctx, label, ranks)
        left = len(engines) - index
        detail[label] = {}
        planned = engine_plan(ctx, label, config, left, figures, not_run, detail[label])
        try:
            run = train(ctx, f"sharding-{label.lower()}", config, share=1 / left, pin=False)
        except procs.ChildFailed as exc:
            figures[f"{label}: run"] = f"failed: {exc.line}"
            detail[label]["output_tail"] = exc.tail
            continue
        rates[label] = wl.tokens_per_second(run["records"], ctx.load.warmup)
        figures[f"{label} tokens/s"] = rates[label]
        figures[f"{label} median step (s)"] = wl.median_step_s(run["records"], ctx.load.warmup)
        figures[f"{label} settings"] = settings(run["plan"])
        peaks[label] = engine_memory(ctx, label, run["records"], planned, figures, not_run)
    for a, b in (("FSDP2", "ZeRO-3"), ("FSDP2", "ZeRO-2")):
        if rates.get(a) and rates.get(b):
            figures[f"ratio {a} / {b} (tokens/s)"] = rates[a] / rates[b]
        if peaks.get(a) and peaks.get(b):
            figures[f"ratio {a} / {b} (peak GPU memory)"] = peaks[a] / peaks[b]
    if not rates:
        raise procs.ChildFailed("no sharding engine trained", procs.tail(json.dumps(detail, default=str)))
    return {"figures": figures, "not_run": not_run, "detail": detail}


def sharded_config(ctx: Context, label: str, ranks: int) -> Path:
    """The throughput run's config on `ranks` processes (global batch = micro-batch x ranks) with one engine."""
    load = ctx.load
    return run_config(
        ctx,
        f"sharding-{label.lower()}",
        training={"global_batch_size": load.batch * ranks},
        sections={"launch": {"nproc_per_node": ranks, "master_port": "auto"}, **ENGINES[label]},
    )


def engine_plan(
    ctx: Context,
    label: str,
    config: Path,
    runs_left: int,
    figures: dict[str, Any],
    not_run: dict[str, str],
    detail: dict[str, Any],
) -> dict[str, Any] | None:
    """The plan's estimate for the engine's config, or None (with the reason) when the plan failed or modelled
    another engine than the config's: a peak for the wrong engine would be no prediction of this one."""
    try:  # a run is worth about four plans
        current = sftdoctor_plan(ctx, config, timeout=ctx.share(1 / (1 + 4 * runs_left)), pin=False)["current"]
    except (procs.ChildFailed, ValueError, KeyError) as exc:
        figures[f"{label}: predicted"] = f"failed: {exc}"
        detail["plan_output_tail"] = getattr(exc, "tail", "")
        return None
    setting = current["setting"]
    detail["plan_setting"] = setting
    detail["terms_gib"] = {t["name"]: t["bytes"] / GIB for t in current["gpu_terms"]}
    wanted = ENGINES[label]
    modelled = "FSDP2" if setting.get("fsdp") else f"ZeRO-{setting.get('zero_stage')}"
    if modelled != label:
        not_run[f"{label}: predicted peak"] = (
            f"`sftdoctor plan --json` modelled this config as {modelled} (current.setting {json.dumps(setting)}), "
            f"not as its {json.dumps(wanted)}; its {current['gpu_peak_bytes'] / GIB:.3g} GiB is in the JSON only"
        )
        detail["plan_peak_gib_other_engine"] = current["gpu_peak_bytes"] / GIB
        return None
    return current


def engine_memory(
    ctx: Context,
    label: str,
    records: list[dict[str, Any]],
    planned: dict[str, Any] | None,
    figures: dict[str, Any],
    not_run: dict[str, str],
) -> float | None:
    """Measured peak GPU memory (the largest memory_allocated_gib: each record's peak since the one before, the
    max over ranks) beside the plan's predicted peak and live tensors; host RSS where there is no GPU."""
    if planned:
        terms = {t["name"]: t["bytes"] for t in planned["gpu_terms"]}
        live = planned["gpu_peak_bytes"] - terms.get("fragmentation", 0) - terms.get("CUDA context and NCCL", 0)
        figures[f"{label} predicted peak (GiB)"] = planned["gpu_peak_bytes"] / GIB
        figures[f"{label} predicted live tensors (GiB)"] = live / GIB
    allocated = wl.peak_gib(records, "memory_allocated_gib")
    if allocated is None:
        not_run[f"{label}: measured GPU memory"] = f"the run logged no CUDA memory ({ctx.why_no_cuda()})"
        figures[f"{label} peak host RSS, max over ranks (GiB)"] = wl.peak_gib(records, "host_rss_gib")
        return None
    figures[f"{label} measured max_memory_allocated (GiB)"] = allocated
    figures[f"{label} measured max_memory_reserved (GiB)"] = wl.peak_gib(records, "memory_reserved_gib")
    if planned:
        figures[f"{label} predicted peak / measured allocated"] = planned["gpu_peak_bytes"] / GIB / allocated
        figures[f"{label} predicted live / measured allocated"] = live / GIB / allocated
    return allocated


# ================================================================ all-reduce bus bandwidth and the flight recorder


def allreduce(ctx: Context) -> dict[str, Any]:
    """`sftdoctor check --distributed` on every GPU (gloo over 2 CPU processes in the rehearsal) against a plain
    all-reduce loop at the sizes sftdoctor measured."""
    ranks = 2 if ctx.rehearsal else len(ctx.cuda_devices)
    if not ctx.rehearsal and not ctx.cuda:
        return {"skipped": ctx.why_no_cuda()}
    if ranks < 2:
        return {"skipped": f"needs 2+ GPUs ({ranks} visible to torch)"}
    seconds = 1.0 if ctx.rehearsal else max(3.0, min(20.0, ctx.share(0.3)))
    code, out, _ = ctx.torchrun(
        "check-distributed",
        ranks,
        "-m",
        "sftdoctor",
        "check",
        "--distributed",
        "--json",
        "--seconds",
        f"{seconds:g}",
        "--out",
        str(ctx.work / "distributed"),
        timeout=ctx.share(0.6),
        ok=(0, 1),
    )
    doc = last_json(out)
    found = {f["id"]: f for f in doc["findings"]}
    bandwidth = [f for f in doc["findings"] if f["id"] in BANDWIDTH_IDS]
    if not bandwidth:
        raise procs.ChildFailed(
            "check --distributed reported no collective-bandwidth finding",
            procs.tail(json.dumps(doc["findings"], indent=1)),
        )
    evidence = bandwidth[0]["evidence"]
    ours = {s["bytes"]: s["busbw_gbps"] for s in evidence["sizes"]}
    peer = collective_loop(ctx, ranks, sorted(ours), timeout=ctx.left())
    theirs = {s["bytes"]: s["busbw_gbps"] for s in peer["sizes"]}
    common = max(set(ours) & set(theirs))
    figures = {
        "ranks, backend": f"{ranks}, {evidence['backend']}",
        f"sftdoctor bus bandwidth at {common / 2**20:g} MiB (GB/s)": ours[common],
        f"plain loop bus bandwidth at {common / 2**20:g} MiB (GB/s)": theirs[common],
        "ratio sftdoctor / plain loop": ours[common] / theirs[common] if theirs[common] else None,
        "sftdoctor verdict": f"{bandwidth[0]['severity']}: {bandwidth[0]['title']}",
        "collective-correctness": (found.get("collective-correctness") or {}).get("title", "absent"),
        "cluster-consistency": (found.get("cluster-consistency") or {}).get("title", "absent"),
        "check --distributed exit": code,
    }
    if evidence.get("expected"):
        figures["expected from the topology"] = json.dumps(evidence["expected"])[:160]
    detail = {
        "sizes": [
            {"bytes": b, "sftdoctor_busbw_gbps": ours.get(b), "plain_busbw_gbps": theirs.get(b)}
            for b in sorted(set(ours) | set(theirs))
        ],
        "findings": doc["findings"],
    }
    return {"figures": figures, "detail": detail}


def collective_loop(ctx: Context, ranks: int, sizes: list[int], timeout: float) -> dict[str, Any]:
    """children/collective_loop.py under torchrun with the flight recorder on, as sftdoctor's launcher sets it."""
    from sftdoctor.train.compat import flight_recorder_env  # reads torch's headers, never imports torch

    result = ctx.work / f"collective-{ranks}.json"
    env = ctx.env(**flight_recorder_env(ctx.work / "flight-recorder"))
    ctx.torchrun(
        f"collective-loop-{ranks}",
        ranks,
        str(Path(__file__).parent / "children" / "collective_loop.py"),
        str(result),
        ",".join(map(str, sizes)),
        timeout=timeout,
        env=env,
    )
    ctx.memo["collective"] = json.loads(result.read_text())
    return ctx.memo["collective"]


def flight_recorder(ctx: Context) -> dict[str, Any]:
    """PyTorch's flight recorder after real collectives, read by sftdoctor's dump (what the hang watchdog saves):
    the all-reduce step's loop where it ran, else one NCCL rank on a GPU."""
    if not ctx.rehearsal and not ctx.cuda:
        return {"skipped": ctx.why_no_cuda()}
    peer = ctx.memo.get("collective")
    if peer is None:
        ranks = 2 if ctx.rehearsal else 1
        peer = collective_loop(ctx, ranks, [2**k for k in range(16, 25)], timeout=ctx.left())
    fr = peer["flight_recorder"]
    figures = {"backend, ranks": f"{peer['backend']}, {peer['world_size']}", "dumped": fr.get("dumped")}
    if not fr.get("dumped") or not fr.get("parsed"):
        figures["why"] = fr.get("why") or fr.get("error")
        return {"figures": figures, "detail": peer}
    collectives = ", ".join(f"{k} x{v}" for k, v in fr["collectives"].items()) or "none"
    figures.update(
        {
            "entries": fr["entries"],
            "collectives recorded": collectives,
            "states": ", ".join(f"{k} x{v}" for k, v in fr["states"].items()) or "none",
            "entries with a Python stack": fr["with_stack"],
            "dump format version": fr.get("version"),
            "dump bytes": fr["bytes"],
        }
    )
    if peer["backend"] == "nccl" and not any(str(k).startswith("nccl:") for k in fr["collectives"]):
        figures["warning"] = "an NCCL group recorded no nccl: collective"
    return {"figures": figures, "detail": {k: v for k, v in peer.items() if k != "sizes"}}


# ================================================================ the watchers' overhead


def watch_overhead(ctx: Context) -> dict[str, Any]:
    """The throughput run (watchers on) against the same config with SFTDOCTOR_NO_WATCH=1: median step times."""
    on = train(ctx, "throughput", run_config(ctx, "throughput"), share=0.5)
    off = train(ctx, "watch-off", run_config(ctx, "watch-off"), SFTDOCTOR_NO_WATCH="1")
    warmup = ctx.load.warmup
    on_s, off_s = wl.median_step_s(on["records"], warmup), wl.median_step_s(off["records"], warmup)
    figures = {
        "median step, watchers on (ms)": on_s * 1000 if on_s else None,
        "median step, watchers off (ms)": off_s * 1000 if off_s else None,
        "steps measured": len([r for r in on["records"] if r["step"] > warmup]),
    }
    if on_s and off_s:
        figures["ratio on / off"] = on_s / off_s
        figures["overhead per step (ms)"] = (on_s - off_s) * 1000
    detail = {
        f"step_time_s watchers {which}": [r.get("step_time_s") for r in run["records"]]
        for which, run in (("on", on), ("off", off))
    }
    return {"figures": figures, "detail": detail}
