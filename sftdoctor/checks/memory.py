"""memory-fit: the run's predicted peak GPU memory (sftdoctor.plan) against the smallest GPU."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, ok, warning

GIB = 2**30


def change(current, better) -> str:
    """The run-config lines that turn `current` into `better`."""
    a, b = current.setting, better.setting
    lines = []
    if (a.zero_stage, a.offload_optimizer) != (b.zero_stage, b.offload_optimizer):
        lines.append(f"[deepspeed] zero_stage = {b.zero_stage}" + (", offload_optimizer = true" if b.offload_optimizer else ""))
    if a.checkpointing != b.checkpointing:
        lines.append(f"[training] gradient_checkpointing = {str(b.checkpointing).lower()}")
    if a.micro_batch != b.micro_batch:
        lines.append(f"[training] per_device_batch_size = {b.micro_batch} (accumulation {better.accumulation})")
    if a.liger != b.liger:
        lines.append(f"[training] liger_kernel = {str(b.liger).lower()}")
    return "; ".join(lines)


@check("memory-fit", "the run's predicted peak GPU memory against the GPUs (sftdoctor plan)", explain="memory-fit")
def memory_fit(run_config: dict[str, Any], model_shape: dict[str, Any], gpus: dict[str, Any],
               packages: dict[str, Any] | None = None, deepspeed_config: dict[str, Any] | None = None):
    from sftdoctor.plan import HEADROOM, plan_run
    from sftdoctor.plan.shape import Shape

    if not gpus.get("devices"):
        raise NotApplicable("no NVIDIA GPU visible")
    planned = plan_run(run_config, Shape(**model_shape), gpus, packages or {}, deepspeed_config)
    current, best, memory = planned.current, planned.recommended, planned.gpu_memory
    peak = current.estimate.gpu_peak
    terms = ", ".join(f"{t.name} {t.bytes / GIB:.1f}" for t in current.estimate.gpu)
    evidence = {"gpu_memory_bytes": memory, "gpu_peak_bytes": peak, "setting": vars(current.setting),
                "terms": [t.to_json() for t in current.estimate.gpu],
                "recommended": vars(best.setting) if best else None}
    head = (f"predicted peak {peak / GIB:.1f} GiB per GPU of {memory / GIB:.1f} GiB "
            f"({current.describe()})")
    detail = f"GiB per GPU: {terms}. `sftdoctor plan RUN.toml` shows every term and the candidates."
    if peak > memory:
        fix = change(current, best) if best else "more GPUs, or a shorter max_length: no setting fits these GPUs"
        return error(head + " — more than the GPU has", detail=detail, fix=fix, evidence=evidence)
    if peak > memory * (1 - HEADROOM):
        fix = change(current, best) if best and best.setting != current.setting else "a smaller micro-batch or checkpointing"
        return warning(head + f": less than {HEADROOM:.0%} headroom", detail=detail, fix=fix, evidence=evidence)
    return ok(head, detail=detail, evidence=evidence)
