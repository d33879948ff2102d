"""Helpers shared by the built-in checks: what a DeepSpeed JSON says about precision, and the precision
the run will use (the Plan's decision, or a DeepSpeed JSON's alone when there is no run config)."""

from __future__ import annotations

from typing import Any


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


# transformers fills these DeepSpeed keys where they are "auto" and refuses any other value that differs from
# TrainingArguments, at trainer.train() once the model has loaded ("Please correct the following DeepSpeed
# config values that mismatch TrainingArguments values"; HfTrainerDeepSpeedConfig.trainer_config_process,
# 4.x-5.24). The plan's value of each; adam betas and epsilon are TrainingArguments' defaults: sftdoctor keeps them.
BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")


def trainer_values(plan) -> dict[str, Any]:
    accumulation = plan.gradient_accumulation_steps
    return {
        "train_micro_batch_size_per_gpu": plan.per_device_batch_size,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": plan.per_device_batch_size * accumulation * plan.world_size if accumulation else None,
        "gradient_clipping": plan.max_grad_norm,
        "optimizer.params.lr": plan.learning_rate,
        "optimizer.params.betas": [0.9, 0.999],
        "optimizer.params.eps": 1e-8,
        "optimizer.params.weight_decay": plan.weight_decay,
        "scheduler.params.warmup_max_lr": plan.learning_rate,
    }


def ds_value(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def trainer_mismatches(config: dict[str, Any], plan, keys: tuple[str, ...] | None = None) -> dict[str, tuple[Any, Any]]:
    """{key: (the JSON's value, the run's)} for each fixed value transformers would refuse."""
    found = {}
    for key, expected in trainer_values(plan).items():
        value = ds_value(config, key)
        if (keys is None or key in keys) and expected is not None and value not in (None, "auto"):
            same = value == expected or (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and isinstance(expected, (int, float))
                and float(value) == float(expected)
            )
            if not same:
                found[key] = (value, expected)
    return found
