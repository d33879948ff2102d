"""`sftdoctor plan` output: the run's setting term by term, the recommended one, the candidates, the time."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sftdoctor.plan.speed import DEFAULT_MFU, flops_per_token, peak_tflops, step_seconds
from sftdoctor.run.memory import Candidate, Fit, engine

GIB = 2**30
SHOWN = 12  # candidate rows printed (all are in --json)
HEADER = "  ZeRO offload ckpt  micro accum liger  peak GiB  fits  compute comm"
LORA_HEADER = "  ZeRO offload ckpt  micro accum liger   base  peak GiB  fits  compute comm"
ENGINE = 24  # an FSDP2 run's table names each row's engine: "FSDP2 no-reshard offload" at most
BASE = {"none": "16-bit", "4bit": "4-bit", "8bit": "8-bit"}  # Setting.quantize, as the table shows it
ADAPTERS = {"none": "LoRA on the 16-bit base", "4bit": "QLoRA on a 4-bit NF4 base", "8bit": "LoRA on an 8-bit base"}


def timing(
    planned: Fit,
    counted: dict[str, Any],
    gpu_name: str | None,
    mfu: float = DEFAULT_MFU,
    tflops: float | None = None,
    tokens_per_second: float | None = None,
) -> dict[str, Any]:
    """The run's length: from a measured tokens/s, or from FLOPs, the GPU's peak and an assumed MFU."""
    run, best = planned.run, planned.recommended or planned.current
    tflops = tflops or peak_tflops(gpu_name)
    out = {
        **counted,
        "mfu": mfu,
        "peak_tflops": tflops,
        "flops_per_token": flops_per_token(run.shape.parameters, run.shape.layers, run.shape.hidden, run.seq_len),
    }
    if tokens_per_second:
        out["step_seconds"] = counted["tokens_per_step"] / tokens_per_second
        out["basis"] = f"measured {tokens_per_second:,.0f} tokens/s"
    elif tflops:
        out["step_seconds"] = step_seconds(
            counted["tokens_per_step"], out["flops_per_token"], run.world, tflops, mfu, best.setting.checkpointing
        )
        out["basis"] = f"MFU {mfu:.2f} of {tflops:g} TFLOPS per GPU"
    if counted.get("steps") and out.get("step_seconds"):
        out["run_hours"] = counted["steps"] * out["step_seconds"] / 3600
    return out


def to_json(planned: Fit, timing_: dict[str, Any]) -> dict[str, Any]:
    lora = asdict(planned.run.lora) if planned.run.lora else None
    return {
        "model": asdict(planned.run.shape),
        "lora": lora,
        "world_size": planned.run.world,
        "ranks_per_node": planned.run.per_node,
        "seq_len": planned.run.seq_len,
        "attention": planned.run.attention,
        "precision": planned.run.precision,
        "gpu_memory_bytes": planned.gpu_memory,
        "global_batch_size": planned.global_batch,
        "current": planned.current.to_json(),
        "recommended": planned.recommended.to_json() if planned.recommended else None,
        "candidates": [c.to_json() for c in planned.candidates],
        "time": timing_,
    }


def _terms(c: Candidate) -> list[str]:
    e = c.estimate
    lines = [f"  {t.name:<24} {t.bytes / GIB:8.2f} GiB  {t.formula}" for t in e.gpu]
    lines.append(f"  {'= peak per GPU':<24} {e.gpu_peak / GIB:8.2f} GiB")
    lines += [f"  {t.name + ' per node':<24} {t.bytes / GIB:8.2f} GiB  {t.formula}" for t in e.host]
    return lines


def render(planned: Fit, timing_: dict[str, Any]) -> str:
    run, shape = planned.run, planned.run.shape
    memory = f"{planned.gpu_memory / GIB:.1f} GiB" if planned.gpu_memory else "unknown memory"
    lines = [
        f"model      {shape.model_type}: {shape.parameters:,} parameters "
        f"({shape.layers} layers, hidden {shape.hidden}, "
        f"vocab {shape.vocab}; counted {shape.counted_by})",
        f"GPUs       {run.world} x {memory} ({run.per_node} per node)",
        f"run        {run.seq_len:,} tokens per row, global batch {planned.global_batch}, "
        f"{run.precision}, {run.attention}",
        *_adapters(planned),
        *_unreachable(planned),
        "",
        f"this run's setting: {planned.current.describe()} — {'fits' if planned.current.fits else 'does NOT fit'}",
        *_terms(planned.current),
        "",
    ]
    best = planned.recommended
    if best is None and not planned.candidates:
        lines.append("recommended: none: no setting reaches the global batch on these ranks (see the batch-size check)")
    elif best is None:
        lines.append(
            "recommended: none fits these GPUs; more GPUs, a shorter max_length, or ZeRO-3 with offload_params"
        )
    elif best.setting == planned.current.setting:
        lines.append("recommended: this run's setting (the fastest that fits)")
    else:
        lines += [f"recommended: {best.describe()} — {best.estimate.gpu_peak / GIB:.1f} GiB per GPU", *_terms(best)]
    fitting = [c for c in planned.candidates if c.fits]
    if fitting:
        lines += [
            "",
            f"settings that fit, fastest first ({min(SHOWN, len(fitting))} of {len(fitting)} that fit, "
            f"{len(planned.candidates)} tried; all in --json):",
            _header(planned),
        ]
    else:
        lines += ["", f"no setting fits ({len(planned.candidates)} tried; all in --json)"]
    fsdp = planned.current.setting.fsdp
    lines += [_row(c, bool(run.lora), fsdp) for c in fitting[:SHOWN]]
    t = timing_
    lines += [
        "",
        f"tokens     {t['tokens_per_step']:,} per step ({t['token_basis']})",
        "time       "
        + (f"{t['steps']:,} steps" if t.get("steps") else "steps unknown")
        + (
            f"; {t['step_seconds']:.1f} s per step ({t['basis']})"
            if t.get("step_seconds")
            else "; give --peak-tflops or --tokens-per-second for a time"
        )
        + (f"; about {_duration(t['run_hours'])}" if t.get("run_hours") else ""),
    ]
    return "\n".join(lines)


def _header(planned: Fit) -> str:
    """The table's header; an FSDP2 run's first column names the engine (FSDP2 rows beside ZeRO's)."""
    header = LORA_HEADER if planned.run.lora else HEADER
    if not planned.current.setting.fsdp:
        return header
    return f"  {'engine':<{ENGINE}}" + header[len("  ZeRO") :]


def _row(c: Candidate, lora: bool, fsdp: bool = False) -> str:
    s = c.setting
    base = f" {BASE[s.quantize or 'none']:>6}" if lora else ""
    first = f"{engine(s):<{ENGINE}}" if fsdp else f"{s.zero_stage:>4}"
    return (
        f"  {first} {'yes' if s.offload_optimizer else 'no':>7} {'on' if s.checkpointing else 'off':>4} "
        f"{s.micro_batch:>6} {c.accumulation:>5} {'on' if s.liger else 'off':>5}{base} "
        f"{c.estimate.gpu_peak / GIB:9.1f} "
        f"{'yes' if c.fits else 'no':>5} {c.compute:7.2f} {c.communication:4.1f}"
    )


def _adapters(planned: Fit) -> list[str]:
    """The adapters' line: what trains, of how many parameters."""
    lora, shape = planned.run.lora, planned.run.shape
    if lora is None:
        return []
    kind = ADAPTERS[planned.current.setting.quantize or "none"]
    dropout = f", dropout {lora.dropout:g}" if lora.dropout else ""
    line = (
        f"adapters   {kind}: r {lora.r}{dropout} on {', '.join(lora.wrapped) or 'no decoder layer'}; "
        f"{lora.trainable:,} trainable parameters ({lora.trainable / shape.parameters:.2%} of the base)"
    )
    return [line]


def _unreachable(planned: Fit) -> list[str]:
    if planned.candidates:
        return []
    return [
        f"           global batch {planned.global_batch} cannot be shared evenly by {planned.run.world} ranks: "
        "no setting reaches it (see the batch-size check)"
    ]


def _duration(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def summary(planned: Fit) -> str:
    """Two lines for `sftdoctor train --dry-run`."""
    current, best = planned.current, planned.recommended
    line = (
        f"memory          predicted peak {current.estimate.gpu_peak / GIB:.1f} GiB per GPU of "
        f"{planned.gpu_memory / GIB:.1f} GiB ({'fits' if current.fits else 'does NOT fit'})"
    )
    if best is not None and best.setting != current.setting:
        line += f"\n                fastest that fits: {best.describe()} ({best.estimate.gpu_peak / GIB:.1f} GiB)"
    return line + "\n                every term: sftdoctor plan RUN.toml"
