"""memory-fit: the run's predicted peak GPU memory against the smallest GPU, with the fastest setting
that fits as the fix. The one memory model (sftdoctor.run.memory) over the one plan; it counts model
states as DeepSpeed's own estimators do, so it also judges the ZeRO stage."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.gpus import devices, smallest_memory
from sftdoctor.run.memory import HEADROOM, Candidate, setting_json
from sftdoctor.run.shape import Shape

GIB = 2**30


def change(current: Candidate, better: Candidate) -> str:
    """The run-config lines that turn `current` into `better`."""
    a, b = current.setting, better.setting
    lines = []
    if b.fsdp and (a.fsdp, a.reshard_after_forward, a.offload_optimizer) != (
        b.fsdp,
        b.reshard_after_forward,
        b.offload_optimizer,
    ):
        lines.append(
            f"[fsdp] reshard_after_forward = {str(b.reshard_after_forward).lower()}, "
            f"offload = {str(b.offload_optimizer).lower()}"
        )
    elif not b.fsdp and (a.fsdp, a.zero_stage, a.offload_optimizer) != (b.fsdp, b.zero_stage, b.offload_optimizer):
        lines.append(
            f"[deepspeed] zero_stage = {b.zero_stage}" + (", offload_optimizer = true" if b.offload_optimizer else "")
        )
    if a.checkpointing != b.checkpointing:
        lines.append(f"[training] gradient_checkpointing = {str(b.checkpointing).lower()}")
    if a.micro_batch != b.micro_batch:
        lines.append(f"[training] per_device_batch_size = {b.micro_batch} (accumulation {better.accumulation})")
    if a.liger != b.liger:
        lines.append(f"[training] liger_kernel = {str(b.liger).lower()}")
    if a.quantize != b.quantize:  # offered only where no 16-bit base fits (run.memory.candidates)
        lines.append(f'[lora] quantize = "{b.quantize}" (no 16-bit base fits)')
    return "; ".join(lines)


@check(
    "memory-fit",
    "the run's predicted peak GPU memory (model states by ZeRO stage, activations, logits) "
    "against the GPUs (sftdoctor plan)",
    messages={
        "does-not-fit": "the predicted peak is more than the GPU has",
        "low-headroom": "the predicted peak leaves too little headroom",
        "lower-zero-fits": "a lower ZeRO stage would fit too and communicate less",
    },
)
def memory_fit(plan, model_shape: dict[str, Any], gpus: dict[str, Any]):
    if not devices(gpus):
        raise NotApplicable("no NVIDIA GPU visible")
    if not smallest_memory(gpus):
        raise NotApplicable("the GPUs' memory is unknown")
    if "error" in model_shape:
        raise NotApplicable(f"the model's size is unknown: {model_shape['error']}")
    from sftdoctor.run.resolve import memory_fit as fit_of  # here: a plain `check` (no plan) needs no resolver

    found = fit_of(plan, Shape(**model_shape), smallest_memory(gpus))
    current, best, memory = found.current, found.recommended, found.gpu_memory
    peak = current.estimate.gpu_peak
    terms = ", ".join(f"{t.name} {t.bytes / GIB:.1f}" for t in current.estimate.gpu)
    trainable = found.run.lora.trainable if found.run.lora else None
    evidence = {
        "gpu_memory_bytes": memory,
        "gpu_peak_bytes": peak,
        "setting": setting_json(current.setting),
        "parameters": model_shape["parameters"],
        "trainable_parameters": trainable,
        "terms": [t.to_json() for t in current.estimate.gpu],
        "recommended": setting_json(best.setting) if best else None,
    }
    head = (
        f"{model_shape['parameters'] / 1e9:.2f}B parameters{f' ({trainable:,} trainable)' if trainable else ''} "
        f"on {plan.world_size} GPU"
        f"{'s' if plan.world_size > 1 else ''}: predicted peak {peak / GIB:.1f} GiB per GPU of {memory / GIB:.1f} GiB "
        f"({current.describe()})"
    )
    detail = f"GiB per GPU: {terms}. `sftdoctor plan RUN.toml` shows every term and the candidates."
    if peak > memory:
        fix = change(current, best) if best else "more GPUs, or a shorter max_length: no setting fits these GPUs"
        return error(
            head + " — more than the GPU has", detail=detail, fix=fix, evidence=evidence, id="memory-fit/does-not-fit"
        )
    if peak > memory * (1 - HEADROOM):
        fix = (
            change(current, best)
            if best and best.setting != current.setting
            else "a smaller micro-batch or checkpointing"
        )
        return warning(
            head + f": less than {HEADROOM:.0%} headroom",
            detail=detail,
            fix=fix,
            evidence=evidence,
            id="memory-fit/low-headroom",
        )
    faster = best is not None and best.speed_key() < current.speed_key() and best.setting != current.setting
    if faster and current.setting.zero_stage == 3 and best.setting.zero_stage < 3:
        return info(
            head + f"; ZeRO-{best.setting.zero_stage} would fit too and communicates less",
            detail=detail,
            fix=change(current, best),
            evidence=evidence,
            id="memory-fit/lower-zero-fits",
        )
    return ok(head, detail=detail, evidence=evidence)
