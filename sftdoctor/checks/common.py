"""Helpers shared by the built-in checks: what a DeepSpeed JSON says about precision, and the precision
the run will use (the Plan's decision, or a DeepSpeed JSON's alone when there is no run config)."""

from __future__ import annotations

from typing import Any

from sftdoctor.run.gpus import (BF16_MIN_CC, bf16_capable, capability, describe_gpus, lacking,  # noqa: F401
                                version_tuple)


def ds_flag(config: dict[str, Any], *sections: str) -> tuple[Any, str | None]:
    """`enabled` of the first present section: True, False, "auto", or None when absent.
    A section present without `enabled` is disabled (DeepSpeed's default)."""
    for section in sections:
        block = config.get(section)
        if isinstance(block, dict):
            return block.get("enabled", False), section
    return None, None


def ds_precision_flags(config: dict[str, Any]) -> dict[str, Any]:
    fp16, _ = ds_flag(config, "fp16")
    # DeepSpeed reads "bf16" and, for old configs, "bfloat16" (runtime/precision_config.py, 0.10-0.19).
    bf16, bf16_key = ds_flag(config, "bf16", "bfloat16")
    return {"fp16": fp16, "bf16": bf16, "bf16_key": bf16_key}


def requested_precision(plan, deepspeed_config: dict[str, Any] | None) -> tuple[str | None, str]:
    """The mixed precision the run will use, and where that was decided: the Plan's, or with no run config,
    what a DeepSpeed JSON hard-codes."""
    if plan is not None:
        return plan.precision, plan.reasons.get("precision", "the plan")
    if deepspeed_config:
        flags = ds_precision_flags(deepspeed_config["config"])
        if flags["bf16"] is True:
            return "bf16", f"{flags['bf16_key']}.enabled in {deepspeed_config['path']}"
        if flags["fp16"] is True:
            return "fp16", f"fp16.enabled in {deepspeed_config['path']}"
    return None, ""
