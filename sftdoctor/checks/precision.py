"""bf16-support and model-dtype: what the GPUs can do, what the weights are, what the run asks."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.checks._common import requested_precision
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.gpus import BF16_MIN_CC, bf16_capable, describe_gpus, lacking

FP16_RISK = (
    "fp16's largest value is 65504: activations and gradients of models pretrained in bf16 "
    "overflow it and the loss turns NaN; dynamic loss scaling skips overflowing steps and can "
    "collapse to its minimum. fp32 avoids it at twice the memory and a fraction of the speed."
)


@check(
    "bf16-support",
    "bf16 and tf32 need compute capability >= 8.0 (Ampere or newer)",
    messages={
        "bf16-unsupported": "bf16 is requested but some GPUs lack it",
        "no-bf16": "the GPUs have no bf16: use fp16 with loss scaling",
        "capability-unknown": "a GPU's compute capability is unknown",
        "fp16-on-bf16-gpus": "fp16 is requested although every GPU supports bf16",
    },
)
def bf16_support(gpus: dict[str, Any], plan=None, deepspeed_config: dict[str, Any] | None = None):
    devices = gpus.get("devices") or []
    if not devices:
        raise NotApplicable("no NVIDIA GPU visible")
    precision, source = requested_precision(plan, deepspeed_config)
    old = lacking(devices, BF16_MIN_CC)
    evidence = {"gpus": describe_gpus(devices), "requested": precision, "requested_by": source}
    if old:
        text = describe_gpus(old)
        if precision == "bf16":
            return error(
                f"bf16 is requested ({source}) but {text} lack bf16",
                detail="bf16 and tf32 tensor cores need compute capability 8.0 (Ampere). On older GPUs "
                "torch.cuda.is_bf16_supported() still says True (it counts emulation), so transformers and "
                "DeepSpeed start the run, which then computes bf16 in slow emulation; flash-attn refuses it. "
                + FP16_RISK,
                fix='use fp16 with dynamic loss scaling: [model] precision = "fp16", and in a DeepSpeed JSON '
                '{"fp16": {"enabled": "auto", "loss_scale": 0}, "bf16": {"enabled": false}}',
                evidence=evidence,
                id="bf16-support/bf16-unsupported",
                explain="bf16-support#bf16-unsupported",
            )
        if precision == "fp16":
            return ok(
                f"fp16 requested; {text} have no bf16, so fp16 is the right mixed precision",
                detail=FP16_RISK,
                evidence=evidence,
            )
        return info(
            f"{text} have no bf16 or tf32: use fp16 mixed precision with loss scaling",
            detail=FP16_RISK,
            fix='[model] precision = "fp16" (or "auto", which picks it here)',
            evidence=evidence,
            id="bf16-support/no-bf16",
            explain="bf16-support#bf16-unsupported",
        )
    if bf16_capable(gpus) is None:
        return warning(
            "compute capability unknown for some GPUs: cannot tell whether bf16 is supported",
            detail=describe_gpus(devices),
            fix="run on the machine itself (NVML), or update sftdoctor",
            evidence=evidence,
            id="bf16-support/capability-unknown",
        )
    if precision == "fp16":
        return warning(
            f"fp16 is requested ({source}) although all GPUs support bf16",
            detail="bf16 has fp32's range: no loss scaling, no overflow NaNs, same speed. " + FP16_RISK,
            fix='[model] precision = "bf16" (or "auto")',
            evidence=evidence,
            id="bf16-support/fp16-on-bf16-gpus",
            explain="bf16-support#fp16-on-bf16-gpus",
        )
    return ok(f"bf16 and tf32 supported: {describe_gpus(devices)}", evidence=evidence)


@check(
    "model-dtype",
    "the dtype the model was saved in vs the run's precision",
    messages={
        "no-dtype": "the model's config.json records no dtype",
        "bf16-as-fp16": "a model saved in bf16 trains in fp16",
        "float32": "the model is saved in float32, twice bf16's memory",
        "unusual-dtype": "the model is saved in an unusual dtype",
    },
)
def model_dtype(model_config: dict[str, Any], plan=None, deepspeed_config: dict[str, Any] | None = None):
    if plan is not None and plan.weights == "random":
        raise NotApplicable('[model] weights = "random": no saved weights to load')
    dtype, key = model_config.get("dtype"), model_config.get("dtype_key")
    precision, source = requested_precision(plan, deepspeed_config)
    evidence = {
        "config": model_config.get("path"),
        "dtype": dtype,
        "key": key,
        "transformers_version": model_config.get("transformers_version"),
        "precision": precision,
        "precision_from": source,
    }
    saved = f'{model_config.get("model_type") or "model"} saved in {dtype} ("{key}")'
    if dtype is None:
        return info(
            f'{model_config.get("path")} records no dtype (neither "dtype" nor "torch_dtype")',
            detail='transformers >= 5 loads with dtype="auto", which then falls back to the weights\' own dtype; '
            "4.x loaded float32 unless told otherwise.",
            fix="pass the dtype explicitly when loading (sftdoctor train does: see the plan's load dtype)",
            evidence=evidence,
            id="model-dtype/no-dtype",
        )
    if dtype == "bfloat16" and precision == "fp16":
        return warning(
            f"{saved} will train in fp16 ({source})",
            detail=FP16_RISK,
            fix="train in bf16 on Ampere or newer GPUs; on older GPUs keep fp16 only with dynamic loss scaling "
            "and watch for NaN, or use fp32",
            evidence=evidence,
            id="model-dtype/bf16-as-fp16",
        )
    if dtype == "float32":
        return info(
            f"{saved}: 4 bytes per parameter, twice bf16",
            detail='transformers >= 5 loads in the saved dtype by default (dtype="auto"), so a 7B model takes '
            "28 GB per process to load instead of 14 GB (TRL's SFTTrainer, given a model name, loads "
            "float32 whatever the config says unless model_init_kwargs sets dtype); mixed precision keeps "
            "an fp32 master copy anyway.",
            fix=f"load with dtype={'torch.bfloat16' if precision != 'fp16' else 'torch.float16'} "
            "(sftdoctor train loads in the run's precision)",
            evidence=evidence,
            id="model-dtype/float32",
        )
    if dtype not in ("bfloat16", "float16", "auto"):
        return warning(
            f"{saved}: unusual dtype",
            fix="check the model's config.json",
            evidence=evidence,
            id="model-dtype/unusual-dtype",
        )
    if precision is None:
        return ok(saved, evidence=evidence)
    return ok(f"{saved}, trained in {precision}", evidence=evidence)
