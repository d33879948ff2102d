"""An accelerate FSDP config (the YAML `accelerate config` writes) as `accelerate launch` reads it, and the same
settings in the words transformers' TrainingArguments read, so that `[fsdp] config = "X.yaml"` trains as
`accelerate launch --config_file X.yaml` would. One place for both readings: the plan and the fsdp-config check.

The launcher (accelerate 1.6-1.16: commands/launch.py _validate_launch_command, utils/launch.py
prepare_multi_gpu_env) exports each fsdp_* key as an FSDP_* variable, with its own defaults for absent ones, and
FullyShardedDataParallelPlugin.__post_init__ (utils/dataclasses.py) reads them. transformers 5.x
(training_args.py _process_fsdp_args) builds the same plugin from fsdp_config, under other names and defaults:
`cpu_offload` not `offload_params`, no `sharding_strategy` (FSDP1 takes the strategy as reshard_after_forward),
cpu_ram_efficient_loading false, FULL_STATE_DICT and TRANSFORMER_BASED_WRAP when absent.
"""

from __future__ import annotations

from typing import Any

# str_to_bool (accelerate 1.16 utils/environment.py; transformers training_args.py), which every flag goes through
TRUE_WORDS, FALSE_WORDS = ("y", "yes", "t", "true", "on", "1"), ("n", "no", "f", "false", "off", "0")
# accelerate 1.16 commands/launch.py launch_command_parser: the launcher's values for absent keys
LAUNCHER_MIN_NUM_PARAMS = 100_000_000
STATE_DICTS = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")  # torch's StateDictType 1, 2, 3


def flag(keys: dict[str, Any], key: str, default: bool = False) -> bool | None:
    """A boolean setting as str_to_bool reads str(value).lower(); None: not a truth value (accelerate raises)."""
    if key not in keys:
        return default
    word = str(keys[key]).lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def wrap_policy(keys: dict[str, Any]) -> str:
    """NO_WRAP when absent: the launcher exports none and the plugin defaults to it (dataclasses.py, 1.6-1.16)."""
    value = keys.get("auto_wrap_policy")
    return str(value).strip().upper() if value is not None else "NO_WRAP"


def state_dict_type(version: int, keys: dict[str, Any]) -> str:
    """FULL_STATE_DICT for FSDP1, SHARDED_STATE_DICT for FSDP2 when absent (set_state_dict_type, 1.6-1.16); the
    enum's number (1-3) as its name."""
    value = keys.get("state_dict_type")
    if value is None:
        return "FULL_STATE_DICT" if version == 1 else "SHARDED_STATE_DICT"
    given = str(value).strip().upper()
    return STATE_DICTS[int(given) - 1] if given in ("1", "2", "3") else given


def trainer_config(version: int, keys: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments' fsdp_config that builds the plugin `accelerate launch` builds from these keys (prefix
    stripped). A value the launcher would refuse is passed as written, so transformers refuses it in the same
    words (`invalid truth value full_shard`)."""
    config: dict[str, Any] = {
        "version": version,
        "auto_wrap_policy": wrap_policy(keys),
        "min_num_params": keys.get("min_num_params", LAUNCHER_MIN_NUM_PARAMS),
        "cpu_offload": keys.get("offload_params", False),
        "cpu_ram_efficient_loading": keys.get("cpu_ram_efficient_loading", True),
        "state_dict_type": state_dict_type(version, keys),
        "activation_checkpointing": keys.get("activation_checkpointing", False),
    }
    if keys.get("transformer_layer_cls_to_wrap") is not None:
        config["transformer_layer_cls_to_wrap"] = keys["transformer_layer_cls_to_wrap"]
    if version == 2:  # the FSDP1 keys are read only for version 1 (dataclasses.py __post_init__)
        config["reshard_after_forward"] = keys.get("reshard_after_forward", True)
        return config
    return {  # FSDP1: the launcher's FSDP_SHARDING_STRATEGY (FULL_SHARD unless given) wins over reshard_after_forward
        **config,
        "reshard_after_forward": keys.get("sharding_strategy", "FULL_SHARD"),
        "forward_prefetch": keys.get("forward_prefetch", False),
        "backward_prefetch": keys.get("backward_prefetch") or "NO_PREFETCH",
        "use_orig_params": keys.get("use_orig_params", True),
        "sync_module_states": keys.get("sync_module_states", True),
    }


def trainer_checkpointing(plan) -> bool:
    """Whether the Trainer's own activation checkpointing is on: the plan's, unless FSDP checkpoints the wrapped
    layers itself (once, never both: transformers 5.x Trainer.create_accelerator_and_postprocess refuses the pair)."""
    return plan.checkpointing and not flag(plan.fsdp or {}, "activation_checkpointing")
