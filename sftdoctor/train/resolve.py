"""From a validated run config and the machine's facts to the plan a run follows.

Pure and cheap (no torch): the gate checks, `--dry-run` and the workers all read the same plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sftdoctor.checks.common import bf16_capable, lacking
from sftdoctor.facts.configs import read_json_object


def world(run_config: dict[str, Any], gpus: dict[str, Any] | None) -> tuple[int, int]:
    """(processes per node, nodes); nproc_per_node = "auto" is every visible GPU, or 1 without GPUs."""
    launch = run_config.get("launch") or {}
    nproc = launch.get("nproc_per_node", "auto")
    if nproc == "auto":
        nproc = max(1, len((gpus or {}).get("devices") or []))
    return int(nproc), int(launch.get("nnodes", 1))


def accumulation(global_batch: int, per_device: int, world_size: int) -> int | None:
    """global = per_device x accumulation x world size; None when no whole accumulation hits it."""
    step = per_device * world_size
    return global_batch // step if global_batch % step == 0 else None


def nearest_global_batches(global_batch: int, per_device: int, world_size: int) -> list[int]:
    step = per_device * world_size
    below = (global_batch // step) * step
    return [b for b in (below, below + step) if b > 0]


def precision(run_config: dict[str, Any], gpus: dict[str, Any] | None) -> str:
    asked = (run_config.get("model") or {}).get("precision", "auto")
    if asked != "auto":
        return asked
    capable = bf16_capable(gpus)
    if capable is None:  # no GPU (or unknown ones): full precision on the CPU
        return "fp32"
    return "bf16" if capable else "fp16"


def attn_implementation(run_config: dict[str, Any], gpus: dict[str, Any] | None, packages: dict[str, Any]) -> str:
    asked = (run_config.get("model") or {}).get("attn_implementation", "auto")
    if asked != "auto":
        return asked
    devices = (gpus or {}).get("devices") or []
    if devices and packages.get("flash-attn") and not lacking(devices, (8, 0)):
        return "flash_attention_2"
    return "sdpa"


def liger_kernel(run_config: dict[str, Any], gpus: dict[str, Any] | None, packages: dict[str, Any]) -> bool:
    """Liger's Triton kernels need a CUDA GPU."""
    asked = (run_config.get("training") or {}).get("liger_kernel", "auto")
    if asked == "auto":
        return bool((gpus or {}).get("devices")) and bool(packages.get("liger-kernel"))
    return bool(asked)


def deepspeed_config(run_config: dict[str, Any]) -> dict[str, Any] | None:
    """The DeepSpeed JSON the run uses: the given file, or one generated for zero_stage with "auto" values
    that transformers fills from the run (integrations/deepspeed.py, 4.x-5.x)."""
    section = run_config.get("deepspeed") or {}
    if "config" in section:
        return read_json_object(Path(section["config"]), "DeepSpeed config")
    if "zero_stage" not in section:
        return None
    stage = section["zero_stage"]
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": "auto"}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto",
                    stage3_gather_16bit_weights_on_model_save=True)
    if section.get("offload_optimizer"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if section.get("offload_params"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                 "hysteresis": 2, "min_loss_scale": 1},
        "zero_optimization": zero,
        "gradient_clipping": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
    }


def lr_scheduler_kwargs(training: dict[str, Any], features: dict[str, Any] | None) -> dict[str, float]:
    """The cosine_with_min_lr floor, passed the way the installed transformers takes it: exactly one of
    min_lr / min_lr_rate (both or neither raise when the scheduler is built, at train start)."""
    if training.get("lr_scheduler") != "cosine_with_min_lr":
        return {}
    if "min_lr" in training:
        return {"min_lr": float(training["min_lr"])}
    rate = float(training.get("min_lr_rate", 0.1))
    if features and features.get("min_lr_rate") is False:  # older transformers knew only min_lr
        return {"min_lr": rate * float(training["learning_rate"])}
    return {"min_lr_rate": rate}


def warmup_arguments(training: dict[str, Any], features: dict[str, Any] | None) -> dict[str, float]:
    """Steps, or a ratio of the run: transformers 4.x took warmup_ratio; 5.x removed it and reads a
    warmup_steps below 1 as the ratio."""
    if "warmup_steps" in training:
        return {"warmup_steps": int(training["warmup_steps"])}
    ratio = float(training.get("warmup_ratio", 0.03))
    if features and features.get("warmup_ratio"):
        return {"warmup_ratio": ratio}
    return {"warmup_steps": ratio}


def make_plan(run_config: dict[str, Any], gpus: dict[str, Any] | None, packages: dict[str, Any],
              features: dict[str, Any] | None = None, packing_isolated: bool | None = None) -> dict[str, Any]:
    training, data = run_config["training"], run_config["data"]
    nproc, nnodes = world(run_config, gpus)
    world_size = nproc * nnodes
    per_device = training["per_device_batch_size"]
    global_batch = training.get("global_batch_size") or per_device * world_size
    accum = accumulation(global_batch, per_device, world_size)
    packing = training["packing"]
    if packing == "auto":
        packing = bool(packing_isolated)
    ds = deepspeed_config(run_config)
    return {
        "nproc_per_node": nproc,
        "nnodes": nnodes,
        "world_size": world_size,
        "per_device_batch_size": per_device,
        "global_batch_size": global_batch,
        "gradient_accumulation_steps": accum,
        "nearest_global_batch_sizes": None if accum else nearest_global_batches(global_batch, per_device, world_size),
        "precision": precision(run_config, gpus),
        "attn_implementation": attn_implementation(run_config, gpus, packages),
        "liger_kernel": liger_kernel(run_config, gpus, packages),
        "packing": packing,
        "max_length": data["max_length"],
        "tokens_per_step_max": global_batch * data["max_length"],
        "lr_scheduler_kwargs": lr_scheduler_kwargs(training, features),
        "warmup": warmup_arguments(training, features),
        "deepspeed": ds,
        "output_dir": training["output_dir"],
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str)
