"""triton-shared-memory: how much shared memory a Triton kernel may use per block on these GPUs.

Only an indication, never more than info: how much a kernel needs is fixed when it compiles (its block sizes,
num_stages, the head or hidden dimension it tiles), which no fact before launch says. What the facts do say is each
GPU's per-block limit (run/smem.py, from its compute capability), and whether this run compiles Triton kernels at all:
sftdoctor's trainer does only through liger-kernel (no torch.compile, no flex_attention), and liger's RoPE, RMSNorm
and SwiGLU kernels work on one row at a time, with little shared memory.
"""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import info
from sftdoctor.run.gpus import capability, devices
from sftdoctor.run.smem import TUNED_ON, gpu_class, per_block


@check(
    "triton-shared-memory",
    "shared memory per block that Triton kernels get on these GPUs (when the run compiles any)",
    messages={
        "capability-unknown": "the GPUs' shared memory per block is unknown",
        "as-tuned": "the GPUs have the shared memory per block A100/H100-tuned kernels expect",
        "small": "the GPUs have less shared memory per block than A100/H100-tuned kernels may need",
    },
)
def triton_shared_memory(gpus: dict[str, Any], plan=None):
    found = devices(gpus)
    if not found:
        raise NotApplicable("no NVIDIA GPU is visible")
    if plan is not None and not plan.liger_kernel:
        raise NotApplicable("this run compiles no Triton kernels (liger-kernel off; sftdoctor does not torch.compile)")
    limits = {d.get("name") or "unknown GPU": _limit(d) for d in found}
    unknown = sorted(name for name, limit in limits.items() if limit is None)
    known = {name: limit for name, limit in limits.items() if limit is not None}
    evidence = {"limits": limits, "run_uses_liger": plan is not None}
    if unknown and not known:
        return info(
            f"cannot tell the shared memory per block of {', '.join(unknown)} (compute capability unknown)",
            detail="Triton raises OutOfResources when a kernel needs more than the GPU's per-block limit.",
            evidence=evidence,
            id="triton-shared-memory/capability-unknown",
        )
    smallest = min(known.values())
    names = ", ".join(sorted(name for name, limit in known.items() if limit == smallest))
    who = (
        "liger-kernel's kernels in this run"
        if plan is not None
        else "Triton kernels (liger-kernel, torch.compile, flex_attention)"
    )
    if smallest >= TUNED_ON:
        return info(
            f"{names}: {smallest} B of shared memory per block, what A100/H100-tuned Triton kernels expect",
            detail=f"{gpu_class(smallest)}.",
            evidence=evidence,
            id="triton-shared-memory/as-tuned",
        )
    return info(
        f"{names}: {smallest} B of shared memory per block ({gpu_class(smallest)}); {who} tuned on A100/H100 "
        f"({TUNED_ON} B or more) can fail with OutOfResources here",
        detail="Which kernel needs how much is only known when it compiles. liger-kernel's RoPE/RMSNorm/SwiGLU "
        "kernels are row-wise and small; flex_attention's default blocks, inductor's max-autotune "
        "matmul templates and models with their own Triton kernels are what usually exceed 99 KB.",
        fix="if a run fails with 'out of resource: shared memory', see `sftdoctor explain triton-shared-memory`",
        evidence=evidence,
        id="triton-shared-memory/small",
    )


def _limit(device: dict[str, Any]) -> int | None:
    cc = capability(device)
    return per_block(cc) if cc is not None else None
