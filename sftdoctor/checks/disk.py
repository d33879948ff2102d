"""disk-full: the checkpoints a run keeps, the final model and the rehearsal, against the free space of the
filesystem output_dir will be on (the size model: sftdoctor.run.saves)."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.memory import adapters
from sftdoctor.run.saves import GIB, budget
from sftdoctor.run.shape import Shape

# The size model is within +5% of a real save (tests/checks/test_disk.py measures +1.7%), and other writers share
# the disk while the run trains (caches, logs, other jobs): less than one more checkpoint, or a tenth of what the
# run needs, left at the peak is one stray write away from ENOSPC.
MARGIN_SHARE = 0.10


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.0f} MiB"


@check(
    "disk-full",
    "the checkpoints kept at once (save_total_limit + 1), the final model and the rehearsal "
    "against the free space at output_dir",
    messages={
        "free-unknown": "the free space at output_dir is unknown",
        "size-unknown": "the checkpoints' size is unknown",
        "does-not-fit": "the checkpoints, final model and rehearsal do not fit the free space",
        "low-margin": "little space would be left at output_dir",
    },
)
def disk_full(
    plan,
    disk_space: dict[str, Any],
    model_shape: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
):
    unknown = _free_unknown(disk_space) or _size_unknown(disk_space, model_shape)
    if unknown:
        return unknown
    b = _budget(plan, model_shape, model_config)
    free = disk_space["free_bytes"]
    what = "adapter" if plan.lora is not None else "checkpoint"
    head = (
        f"{_gib(b.checkpoint)} per {what} x {b.kept} kept at once (save_total_limit {plan.save_total_limit} + the "
        f"one being written) + final {_gib(b.final)} + rehearsal {_gib(b.rehearsal)} = {_gib(b.total)}; "
        f"{_gib(free)} free at {disk_space['probed']}"
    )
    evidence = _evidence(disk_space, b)
    detail = (
        f"{b.per_param} B x {b.saved_params:,} parameters per checkpoint (weights in the saved dtype + optimizer "
        f"states{', ZeRO-' + str(plan.zero_stage) if plan.deepspeed is not None else ''}), plus up to 64 MiB of "
        "tokenizer and trainer state. The Trainer writes a checkpoint before it deletes the oldest."
    )
    if b.total > free:
        return error(
            head + ": does not fit",
            detail=detail,
            fix=_fit_fix(plan, b, free),
            evidence=evidence,
            id="disk-full/does-not-fit",
        )
    left = free - b.total
    if left < max(b.checkpoint, MARGIN_SHARE * b.total):
        return warning(
            head + f": {_gib(left)} would be left",
            detail=detail + " Caches, logs and other jobs write to the same disk.",
            fix=f"free more space at {disk_space['probed']}, or lower [training] save_total_limit",
            evidence=evidence,
            id="disk-full/low-margin",
        )
    return ok(head, detail=detail, evidence=evidence)


def _free_unknown(disk_space: dict[str, Any]):
    if disk_space.get("error") or disk_space.get("free_bytes") is None:
        return info(
            f"the free space at {disk_space.get('output_dir')} is unknown: {disk_space.get('error')}",
            fix=f"df -h {disk_space.get('probed') or disk_space.get('output_dir')}",
            evidence=disk_space,
            id="disk-full/free-unknown",
        )
    return None


def _size_unknown(disk_space: dict[str, Any], model_shape: dict[str, Any] | None):
    if model_shape is None or "error" in model_shape or not model_shape.get("parameters"):
        why = (model_shape or {}).get("error", "no model size")
        return info(
            f"the checkpoints' size is unknown ({why}); {_gib(disk_space['free_bytes'])} free at "
            f"{disk_space['probed']}",
            fix="give the model's config.json ([model] path) so they can be sized",
            evidence=disk_space,
            id="disk-full/size-unknown",
        )
    return None


def _budget(plan, model_shape: dict[str, Any], model_config: dict[str, Any] | None):
    """What the run writes (sftdoctor.run.saves), its adapters counted on the Llama names when not listed."""
    tied = bool((model_config or {}).get("tie_word_embeddings", True))
    lora = plan.lora
    if lora is not None and lora.get("trainable_params") is None:  # no layer listing: counted on the Llama names
        lora = {**lora, "trainable_params": adapters(lora, Shape(**model_shape)).trainable}
    return budget(
        model_shape["parameters"],
        plan.zero_stage,
        plan.load_dtype,
        plan.deepspeed is not None,
        plan.save_total_limit,
        lora,
        model_shape.get("vocab", 0),
        tied,
    )


def _evidence(disk_space: dict[str, Any], b) -> dict[str, Any]:
    return {
        **disk_space,
        "checkpoint_bytes": b.checkpoint,
        "bytes_per_param": b.per_param,
        "saved_params": b.saved_params,
        "kept": b.kept,
        "final_bytes": b.final,
        "rehearsal_bytes": b.rehearsal,
        "needed_bytes": b.total,
    }


def _fit_fix(plan, b, free: int) -> str:
    """A disk that fits, or the save_total_limit that would, and adapters for a full fine-tune."""
    fits = max(0, (free - b.final - b.rehearsal) // b.checkpoint - 1)
    fix = (
        f"[training] output_dir on a disk with {_gib(b.total)} free, or save_total_limit = {fits}"
        if fits >= 1
        else f"[training] output_dir on a disk with {_gib(b.total)} free"
    )
    if plan.lora is None:
        fix += ", or train adapters ([lora]): megabytes per checkpoint"
    return fix
