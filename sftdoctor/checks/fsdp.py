"""fsdp-config: an accelerate FSDP config (the YAML `accelerate config` writes, run by `accelerate launch`) judged
against the installed stack, the model, the GPUs and the run.

Each rule cites where it was read: accelerate 1.16.0 (commands/launch.py, utils/launch.py, utils/dataclasses.py,
utils/fsdp_utils.py, accelerator.py, commands/to_fsdp2.py), transformers 5.25.0 (trainer.py, training_args.py,
modeling_utils.py) and torch 2.13.0, with the releases each holds for. The YAML path: the launcher copies every
fsdp_config key onto its arguments (commands/launch.py _validate_launch_command), exports them as FSDP_* variables
(utils/launch.py prepare_multi_gpu_env) and FullyShardedDataParallelPlugin.__post_init__ reads those."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from sftdoctor.checks import check
from sftdoctor.errors import did_you_mean
from sftdoctor.findings import Finding, error, info, ok, warning
from sftdoctor.run import fsdp as reading
from sftdoctor.run.fsdp import FALSE_WORDS, STATE_DICTS, TRUE_WORDS
from sftdoctor.run.gpus import bf16_capable, describe_gpus, devices, version_tuple

# accelerate 1.16 commands/launch.py launch_command_parser (the fsdp_* arguments) and utils/launch.py
# prepare_multi_gpu_env (fsdp_ignored_modules, read with getattr): the fsdp_config settings `accelerate launch`
# reads, prefix stripped. Any other key is set on the arguments and read by nothing.
KNOWN = (
    "activation_checkpointing",
    "activation_checkpointing_offload",
    "auto_wrap_policy",
    "backward_prefetch",
    "cpu_ram_efficient_loading",
    "forward_prefetch",
    "ignored_modules",
    "min_num_params",
    "offload_params",
    "reshard_after_forward",
    "sharding_strategy",
    "state_dict_type",
    "sync_module_states",
    "transformer_layer_cls_to_wrap",
    "use_orig_params",
    "version",
)
# accelerate 1.16 commands/config/config_args.py ClusterConfig (with BaseConfig): from_yaml_file raises "The config
# file at ... had unknown keys ([...])" for any other top-level key (fp16 and dynamo_backend are converted first).
TOP_KEYS = [
    "command_file",
    "commands",
    "compute_environment",
    "debug",
    "deepspeed_config",
    "distributed_type",
    "downcast_bf16",
    "dynamo_config",
    "enable_cpu_affinity",
    "fp8_config",
    "fsdp_config",
    "gpu_ids",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "main_training_function",
    "megatron_lm_config",
    "mixed_precision",
    "mpirun_config",
    "num_machines",
    "num_processes",
    "parallelism_config",
    "rdzv_backend",
    "same_network",
    "tpu_env",
    "tpu_name",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "tpu_vm",
    "tpu_zone",
    "use_cpu",
    "fp16",
    "dynamo_backend",
]
# accelerate 1.16 utils/constants.py (0.2x-1.16): the names the plugin maps to torch's enums (their index + 1).
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")  # accelerate 1.16 utils/dataclasses.py PrecisionType
# accelerate 1.6-1.16 commands/to_fsdp2.py ARGUMENT_VALUE_MAPPING: the bool FSDP2's reshard_after_forward takes for
# each FSDP1 strategy (HYBRID_SHARD becomes plain full sharding: FSDP2 has no replica groups without a mesh).
TO_FSDP2 = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}
# accelerate 1.6-1.16 FullyShardedDataParallelPlugin.__post_init__ reads these FSDP_* variables only when
# fsdp_version == 1 (backward_prefetch is read, then dropped with "backward_prefetch is not supported in FSDP2.
# Setting backward prefetch to None."): under FSDP2 the launcher's value is never used, and no error is raised.
FSDP1_ONLY = {
    "sharding_strategy": "FSDP2 shards as fsdp_reshard_after_forward says (true unless given)",
    "forward_prefetch": "FSDP2 has no forward prefetch (the plugin raises when it is passed in Python)",
    "backward_prefetch": "FSDP2 prefetches the next unit's all-gather by itself; accelerate logs a warning",
    "use_orig_params": "FSDP2 always keeps the original parameters (DTensors)",
    "sync_module_states": "FSDP2 needs no broadcast of module states",
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
FP16_RANGE = (
    "fp16's largest value is 65504: activations of a model pretrained in bf16 overflow it and the loss turns NaN"
)


class NotJudged(NamedTuple):
    """A rule the facts at hand cannot decide, and why: said in one info, never passed over in silence."""

    rule: str
    why: str


@dataclass(frozen=True)
class Config:
    """The YAML as the launcher reads it: its FSDP version, settings (without the fsdp_ prefix) and top-level keys."""

    path: str
    version: int
    keys: dict[str, Any]
    written: dict[str, str]
    top: dict[str, Any]

    def name(self, key: str) -> str:
        return self.written.get(key, f"fsdp_{key}")

    def upper(self, key: str) -> str | None:
        value = self.keys.get(key)
        return str(value).strip().upper() if value is not None else None

    def flag(self, key: str, default: bool = False) -> bool | None:
        """A boolean setting as str_to_bool reads the launcher's str(value).lower(); None: not a truth value."""
        return reading.flag(self.keys, key, default)

    def mixed_precision(self) -> Any:
        """The YAML's mixed_precision; absent or null is "no" (accelerate 1.16 commands/launch.py
        _validate_launch_command: `if defaults.mixed_precision is None: args.mixed_precision = "no"`)."""
        value = self.top.get("mixed_precision")
        return "no" if value is None else value

    def wrap_policy(self) -> str:
        return reading.wrap_policy(self.keys)

    def state_dict_type(self) -> str:
        return reading.state_dict_type(self.version, self.keys)

    def ranks_per_node(self, plan) -> int | None:
        if plan is not None:
            return plan.nproc_per_node
        processes, machines = self.top.get("num_processes"), self.top.get("num_machines", 1)
        if isinstance(processes, int) and isinstance(machines, int) and processes > 0 and machines > 0:
            return max(1, processes // machines)
        return None


@dataclass(frozen=True)
class Facts:
    """The facts beside the YAML, each None when not known."""

    packages: dict[str, Any] | None
    model_config: dict[str, Any] | None
    model_classes: dict[str, Any] | None
    model_shape: dict[str, Any] | None
    gpus: dict[str, Any] | None
    fsdp_stack: dict[str, Any] | None
    run: Any
    plan: Any


def _evidence(c: Config, *keys: str) -> dict[str, Any]:
    return {"path": c.path, "fsdp_version": c.version, **{c.name(k): c.keys.get(k) for k in keys if k in c.keys}}


# ---------------------------------------------------------------- keys and values accelerate reads


def unknown_keys(c: Config, f: Facts) -> list[Finding]:
    """accelerate 1.16 commands/launch.py _validate_launch_command and commands/config/config_args.py
    ClusterConfig.from_yaml_file (0.2x-1.16)."""
    found = []
    stray = [k for k in c.keys if k not in KNOWN]
    if stray:
        said = "; ".join(c.name(k) + did_you_mean("fsdp_" + k, ["fsdp_" + n for n in KNOWN]) for k in stray)
        found.append(
            warning(
                f"{c.path}: fsdp_config keys accelerate never reads: {said}",
                detail="accelerate 1.16 `launch` copies every fsdp_config key onto its arguments "
                "(commands/launch.py _validate_launch_command) and exports only the ones it knows "
                "(utils/launch.py prepare_multi_gpu_env): these are dropped without a word, and their default applies.",
                fix="rename each to a key accelerate reads, or delete it (`accelerate config` writes today's names)",
                evidence={"path": c.path, "unknown": [c.name(k) for k in stray]},
                id="fsdp-config/unknown-key",
            )
        )
    top = [k for k in c.top if k not in TOP_KEYS]
    if top:
        said = "; ".join(k + did_you_mean(k, TOP_KEYS) for k in top)
        found.append(
            error(
                f"{c.path}: accelerate refuses the file: unknown top-level keys {said}",
                detail="accelerate 1.16 commands/config/config_args.py ClusterConfig.from_yaml_file raises "
                '"The config file at ... had unknown keys ([...])" before anything is launched.',
                fix="delete or rename them (compare with the file `accelerate config` writes)",
                evidence={"path": c.path, "unknown": top},
                id="fsdp-config/unknown-top-key",
            )
        )
    return found


def _bad_values(c: Config) -> list[str]:
    bad = []
    policy = c.wrap_policy()
    if policy not in WRAP_POLICIES:  # FullyShardedDataParallelPlugin.__post_init__ (0.2x-1.16)
        bad.append(
            f'{c.name("auto_wrap_policy")}: {policy} ("Invalid auto wrap policy"; one of {", ".join(WRAP_POLICIES)})'
        )
    state = c.state_dict_type()
    if state not in STATE_DICTS:  # set_state_dict_type: StateDictType[name] raises KeyError
        bad.append(f"{c.name('state_dict_type')}: {state} (one of {', '.join(STATE_DICTS)})")
    strategy = c.upper("sharding_strategy")
    if c.version == 1 and strategy and strategy not in (*STRATEGIES, "1", "2", "3", "4", "5"):
        bad.append(f"{c.name('sharding_strategy')}: {strategy} (one of {', '.join(STRATEGIES)})")
    prefetch = c.upper("backward_prefetch")
    if prefetch not in (None, *PREFETCH, "1", "2"):  # BackwardPrefetch[name]
        bad.append(f"{c.name('backward_prefetch')}: {prefetch} (one of {', '.join(PREFETCH)})")
    read = [
        "offload_params",
        "cpu_ram_efficient_loading",
        "activation_checkpointing",
        "activation_checkpointing_offload",
    ]
    read += ["forward_prefetch", "use_orig_params", "sync_module_states"] if c.version == 1 else []
    bad += [f'{c.name(k)}: {c.keys[k]!r} (str_to_bool: "invalid truth value")' for k in read if c.flag(k) is None]
    precision = c.mixed_precision()
    if precision not in MIXED_PRECISION:
        hint = " (YAML reads an unquoted no as false: write 'no')" if precision is False else ""
        bad.append(f"mixed_precision: {precision!r}{hint} (one of {', '.join(MIXED_PRECISION)})")
    return bad


def invalid_values(c: Config, f: Facts) -> list[Finding]:
    """accelerate 1.6-1.16 utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__, set_state_dict_type;
    utils/environment.py str_to_bool."""
    bad = _bad_values(c)
    if not bad:
        return []
    return [
        error(
            f"{c.path}: values accelerate cannot read: {'; '.join(bad)}",
            detail="accelerate 1.16 utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__ maps each "
            "to torch's enum or a bool and raises on any other value, when the Accelerator (or the Trainer) is made.",
            fix="use one of the values named",
            evidence={"path": c.path, "invalid": bad},
            id="fsdp-config/invalid-value",
        )
    ]


# ---------------------------------------------------------------- FSDP1 settings under FSDP2 and the reverse


def fsdp1_keys(c: Config, f: Facts) -> list[Finding]:
    """accelerate 1.6-1.16 utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__ (FSDP1_ONLY)."""
    if c.version != 2:
        return []
    given = [k for k in FSDP1_ONLY if k in c.keys and not (k == "sharding_strategy" and _hybrid(c))]
    if not given:
        return []
    return [
        warning(
            f"{c.path}: FSDP1 settings under fsdp_version 2, dropped without an error: "
            + ", ".join(c.name(k) for k in given),
            detail="accelerate 1.6-1.16 utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__ reads "
            "FSDP_SHARDING_STRATEGY, FSDP_FORWARD_PREFETCH, FSDP_USE_ORIG_PARAMS and FSDP_SYNC_MODULE_STATES only when "
            "fsdp_version == 1. " + " ".join(f"{c.name(k)}: {FSDP1_ONLY[k]}." for k in given),
            fix="delete them; for FSDP2 say fsdp_reshard_after_forward: true (FULL_SHARD) or false (SHARD_GRAD_OP). "
            "`accelerate to-fsdp2 --config_file OLD.yaml --output_file NEW.yaml` rewrites an FSDP1 config",
            evidence=_evidence(c, *given),
            id="fsdp-config/fsdp1-keys",
        )
    ]


def reshard_after_forward(c: Config, f: Facts) -> list[Finding]:
    """accelerate 1.6-1.16 FullyShardedDataParallelPlugin.__post_init__ (str_to_bool for FSDP2; for FSDP1 the
    launcher's FSDP_SHARDING_STRATEGY wins, utils/launch.py prepare_multi_gpu_env); commands/to_fsdp2.py."""
    if "reshard_after_forward" not in c.keys:
        return []
    value = c.keys["reshard_after_forward"]
    word = str(value).lower()
    if c.version == 2 and word not in TRUE_WORDS + FALSE_WORDS:
        meant = TO_FSDP2.get(str(value).strip().upper())
        fix = f"{c.name('reshard_after_forward')}: {str(meant).lower()}" if meant is not None else "true or false"
        return [
            error(
                f"{c.path}: {c.name('reshard_after_forward')}: {value} under fsdp_version 2: accelerate stops with "
                f'"invalid truth value {word}"',
                detail="FSDP2's reshard_after_forward is a bool: accelerate 1.6-1.16 FullyShardedDataParallelPlugin."
                "__post_init__ reads it with str_to_bool(..., to_bool=True) (utils/environment.py), which raises on a "
                "strategy name. accelerate's own to-fsdp2 maps FULL_SHARD and HYBRID_SHARD to true, SHARD_GRAD_OP, "
                "HYBRID_SHARD_ZERO2 and NO_SHARD to false (commands/to_fsdp2.py ARGUMENT_VALUE_MAPPING).",
                fix=fix,
                evidence=_evidence(c, "reshard_after_forward"),
                id="fsdp-config/reshard-strategy-string",
            )
        ]
    strategy = str(value).strip().upper()
    if c.version == 1 and "sharding_strategy" not in c.keys and strategy != "FULL_SHARD":
        return [
            warning(
                f"{c.path}: {c.name('reshard_after_forward')}: {value} is not used under FSDP1: FULL_SHARD is",
                detail="accelerate 1.6-1.16 `launch` always exports FSDP_SHARDING_STRATEGY (default FULL_SHARD, "
                "utils/launch.py prepare_multi_gpu_env), and FullyShardedDataParallelPlugin.__post_init__ reads "
                "reshard_after_forward only when no sharding strategy is set.",
                fix=f"fsdp_sharding_strategy: {strategy if strategy in STRATEGIES else 'SHARD_GRAD_OP'} for FSDP1, "
                "or fsdp_version: 2 with a true/false fsdp_reshard_after_forward",
                evidence=_evidence(c, "reshard_after_forward"),
                id="fsdp-config/reshard-ignored-fsdp1",
            )
        ]
    return []


def _hybrid(c: Config) -> bool:
    return (c.upper("sharding_strategy") or "") in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "4", "5")


def hybrid_shard(c: Config, f: Facts) -> list[Finding]:
    """accelerate 1.6-1.16 FullyShardedDataParallelPlugin.__post_init__ (the strategy read for FSDP1 only),
    commands/to_fsdp2.py (HYBRID_SHARD -> true), utils/fsdp_utils.py fsdp2_prepare_model (the mesh)."""
    if c.version != 2 or not _hybrid(c):
        return []
    machines = c.top.get("num_machines") if isinstance(c.top.get("num_machines"), int) else None
    per_node = c.ranks_per_node(f.plan)
    mesh = c.top.get("parallelism_config") if isinstance(c.top.get("parallelism_config"), dict) else {}
    replicas = mesh.get("parallelism_config_dp_replicate_size", mesh.get("dp_replicate_size"))
    already = isinstance(replicas, int) and replicas > 1
    shape = f"dp_replicate_size {machines or 'NODES'} x dp_shard_size {per_node or 'GPUS_PER_NODE'}"
    return [
        warning(
            f"{c.path}: {c.name('sharding_strategy')}: {c.keys['sharding_strategy']} under fsdp_version 2 is "
            "ignored: every parameter is sharded over all ranks of all nodes, with no replica groups",
            detail="accelerate 1.6-1.16 reads FSDP_SHARDING_STRATEGY only for FSDP1 (utils/dataclasses.py "
            "FullyShardedDataParallelPlugin.__post_init__) and its to-fsdp2 maps HYBRID_SHARD to "
            "reshard_after_forward: true. FSDP2 replicates only over a device mesh: fsdp2_prepare_model "
            "(utils/fsdp_utils.py) passes fully_shard the mesh of parallelism_config, and without one each "
            "all-gather and reduce-scatter spans every rank, across the nodes too."
            + (" This file's parallelism_config already asks for replicas: the key is only dead." if already else ""),
            fix="delete it; for HSDP add parallelism_config: {parallelism_config_dp_replicate_size: N, "
            f"parallelism_config_dp_shard_size: M}} ({shape}), as accelerate's examples/torch_native_parallelism do",
            evidence={**_evidence(c, "sharding_strategy"), "parallelism_config": mesh or None},
            id="fsdp-config/hybrid-shard-fsdp2",
        )
    ]


# ---------------------------------------------------------------- the installed stack


def fsdp2_stack(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """accelerate 1.6.0 added FSDP2; accelerate 1.7-1.14 accelerator.py Accelerator.__init__ raise for torch < 2.6
    (FSDP2_PYTORCH_VERSION), 1.16 requires torch>=2.6; torch < 2.7 drops ignored_modules (dataclasses.py, 1.16)."""
    if c.version != 2:
        return []
    packages = f.packages or {}
    accelerate, torch = version_tuple(packages.get("accelerate")), version_tuple(packages.get("torch"))
    if accelerate is None or torch is None:
        missing = " and ".join(n for n, v in (("accelerate", accelerate), ("torch", torch)) if v is None)
        return [NotJudged("the stack FSDP2 needs", f"{missing} not installed here (or its version unreadable)")]
    found = []
    if accelerate < (1, 6):
        found.append(
            f"accelerate {packages['accelerate']} has no FSDP2 (1.6.0 added it): fsdp_version is read by "
            "nothing, and FSDP1 runs"
        )
    if torch < (2, 6):
        found.append(
            f"torch {packages['torch']} is older than FSDP2's 2.6: accelerate 1.7-1.14 raise \"FSDP2 "
            'requires PyTorch >= 2.6.0" (accelerator.py), 1.16 requires torch>=2.6 when installed, and '
            "torch < 2.6 has no fully_shard in torch.distributed.fsdp"
        )
    if found:
        return [
            error(
                f"{c.path}: fsdp_version 2 on {'; '.join(found)}",
                fix="pip install 'torch>=2.6' 'accelerate>=1.6' (the torch build for your driver: "
                "`sftdoctor explain torch-cuda-match`), or fsdp_version: 1",
                evidence={**_evidence(c), "torch": packages.get("torch"), "accelerate": packages.get("accelerate")},
                id="fsdp-config/fsdp2-too-old",
            )
        ]
    if torch < (2, 7) and c.keys.get("ignored_modules") is not None:
        return [
            warning(
                f"{c.path}: {c.name('ignored_modules')} is dropped on torch {packages['torch']}: FSDP2 shards those "
                "modules too",
                detail='accelerate 1.16 utils/dataclasses.py: "FSDP2 ignored_params/ignored_modules is not available '
                'for torch version < 2.7.0" (fully_shard takes ignored_params from torch 2.7).',
                fix="pip install 'torch>=2.7', or leave the key out",
                evidence={**_evidence(c, "ignored_modules"), "torch": packages.get("torch")},
                id="fsdp-config/fsdp2-too-old",
            )
        ]
    return []


# ---------------------------------------------------------------- precision


def bf16_gpus(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """accelerate 1.16 accelerator.py (bf16 refused only where torch.cuda.is_bf16_supported() is False, which
    counts emulation); compute capability 8.0 as run/gpus.py BF16_MIN_CC."""
    if c.mixed_precision() != "bf16":
        return []
    if f.gpus is None or not devices(f.gpus):
        return [NotJudged("bf16 on these GPUs", "no NVIDIA GPU visible here, none recorded")]
    capable = bf16_capable(f.gpus)
    if capable is None:
        return [NotJudged("bf16 on these GPUs", "a GPU's compute capability is unknown")]
    if capable:
        return []
    return [
        error(
            f"{c.path}: mixed_precision bf16 on {describe_gpus(devices(f.gpus))}, which lack bf16",
            detail="bf16 tensor cores need compute capability 8.0. accelerate 1.16 (accelerator.py) refuses bf16 only "
            "where torch.cuda.is_bf16_supported() is False, and torch counts emulation: the run starts and computes "
            "bf16 in slow emulation.",
            fix="mixed_precision: fp16 (FSDP keeps a loss scaler for it), or run on Ampere or newer GPUs",
            evidence={**_evidence(c), "mixed_precision": "bf16", "gpus": describe_gpus(devices(f.gpus))},
            id="fsdp-config/bf16-unsupported",
        )
    ]


def model_precision(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """accelerate 1.16 utils/dataclasses.py set_mixed_precision, utils/fsdp_utils.py fsdp2_prepare_model (the fp32
    upcast only when mixed_precision is not no; 1.6-1.16)."""
    precision = c.mixed_precision()
    if precision not in ("no", "fp16"):
        return []
    if f.model_config is None:
        return [NotJudged("mixed precision vs the model's dtype", "no model config given (--model-config)")]
    dtype = f.model_config.get("dtype")
    evidence = {**_evidence(c), "mixed_precision": precision, "model_dtype": dtype}
    if precision == "fp16" and dtype == "bfloat16":
        return [
            warning(
                f"{c.path}: mixed_precision fp16 for a model whose weights are bfloat16",
                detail=FP16_RANGE + "; accelerate 1.16 set_mixed_precision (utils/dataclasses.py) computes and reduces "
                "gradients in fp16 under both FSDP versions.",
                fix="mixed_precision: bf16 on Ampere or newer GPUs",
                evidence=evidence,
                id="fsdp-config/mixed-precision",
            )
        ]
    if precision == "no" and dtype in ("bfloat16", "float16"):
        return [
            info(
                f"{c.path}: mixed_precision no: the model trains in its own {dtype}, with no fp32 master weights",
                detail="accelerate 1.16 utils/fsdp_utils.py fsdp2_prepare_model upcasts trainable parameters to fp32 "
                "only when mixed_precision is not no; FSDP1 keeps the dtype the weights were loaded in. Updates "
                "smaller "
                f"than {dtype}'s precision are lost (fine for QLoRA, whose adapters peft keeps in fp32).",
                fix="mixed_precision: bf16 for fp32 master weights with bf16 compute",
                evidence=evidence,
                id="fsdp-config/mixed-precision",
            )
        ]
    return []


def run_precision(c: Config, f: Facts) -> list[Finding]:
    """accelerate 1.16 commands/launch.py (ACCELERATE_MIXED_PRECISION from the YAML) vs the run's Trainer."""
    if f.plan is None:
        return []
    asked = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}.get(f.plan.precision)
    given = c.mixed_precision()
    if asked is None or given == asked:
        return []
    return [
        warning(
            f"{c.path}: mixed_precision {given} but the run's precision is {f.plan.precision}",
            detail="`accelerate launch` runs the YAML's mixed_precision (commands/launch.py exports "
            "ACCELERATE_MIXED_PRECISION); `sftdoctor train` gives the Trainer the run's bf16/fp16 arguments and "
            "ignores the YAML's top-level keys: the same file trains in two precisions.",
            fix=f"mixed_precision: {asked} in the YAML, or [model] precision to match it",
            evidence={**_evidence(c), "mixed_precision": given, "run_precision": f.plan.precision},
            id="fsdp-config/precision-mismatch",
        )
    ]


# ---------------------------------------------------------------- loading, checkpointing, saving


def _parameters(f: Facts) -> int | None:
    for source in (f.model_shape, f.model_classes):
        count = (source or {}).get("parameters")
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            return count
    return None


def _load_bytes(f: Facts) -> tuple[int, str]:
    """Bytes per parameter from_pretrained loads in: the plan's load dtype, else the config's (transformers 5's
    dtype="auto"), else fp32 (transformers' default without a dtype in config.json)."""
    dtype = getattr(f.plan, "load_dtype", None) or (f.model_config or {}).get("dtype") or "float32"
    return DTYPE_BYTES.get(dtype, 4), dtype


def ram_efficient_loading(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """transformers 5.25 modeling_utils.py and distributed/fsdp.py is_fsdp_enabled; accelerate 1.16
    utils/fsdp_utils.py fsdp2_prepare_model / fsdp2_load_full_state_dict; launcher default true (commands/launch.py)."""
    if c.flag("cpu_ram_efficient_loading", default=True) is not False:  # launcher default "true" (launch.py)
        return []
    if f.run is not None and f.run.model.weights != "pretrained":
        return []
    ranks = c.ranks_per_node(f.plan)
    if ranks is None:
        return [NotJudged("host RAM when loading", "num_processes unknown (not in the YAML, no run config)")]
    if ranks < 2:
        return []
    params = _parameters(f)
    size, dtype = _load_bytes(f)
    each = f"{params * size / 2**30:.1f} GiB" if params else ""
    total = f"{ranks} x {each} = {ranks * params * size / 2**30:.0f} GiB in {dtype}" if params else f"{ranks} copies"
    return [
        warning(
            f"{c.path}: {c.name('cpu_ram_efficient_loading')} false: each of {ranks} ranks per node loads the whole "
            f"pretrained model into host RAM ({total})",
            detail="With it on, transformers 5.25 keeps the weights on the meta device on every rank but local rank 0 "
            "(modeling_utils.py, distributed/fsdp.py is_fsdp_enabled reads FSDP_CPU_RAM_EFFICIENT_LOADING) and "
            "accelerate broadcasts rank 0's copy into the shards (utils/fsdp_utils.py fsdp2_load_full_state_dict; "
            "FSDP1: sync_module_states). Off, the node's RAM must hold a full copy per rank at once."
            + ("" if f.run is not None else " (Judged as for pretrained weights: no run config says otherwise.)"),
            fix=f"{c.name('cpu_ram_efficient_loading')}: true (FSDP1 also needs fsdp_sync_module_states: true)",
            evidence={**_evidence(c, "cpu_ram_efficient_loading"), "ranks_per_node": ranks, "parameters": params},
            id="fsdp-config/ram-efficient-loading-off",
        )
    ]


def ram_loading_sync(c: Config, f: Facts) -> list[Finding]:
    # accelerate 0.2x-1.16 utils/launch.py prepare_multi_gpu_env, before any process starts, under both versions:
    # `if args.fsdp_cpu_ram_efficient_loading and not args.fsdp_sync_module_states: raise ValueError(...)`, on the
    # YAML's values as they are (a YAML false is falsy, the string "false" is not); both default to "true".
    loading = c.keys.get("cpu_ram_efficient_loading", "true")
    sync = c.keys.get("sync_module_states", "true")
    if not (loading and not sync):
        return []
    return [
        error(
            f"{c.path}: {c.name('cpu_ram_efficient_loading')} with {c.name('sync_module_states')}: {sync}: accelerate "
            'launch stops with "When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to '
            '`True`"',
            detail="accelerate 1.16 utils/launch.py prepare_multi_gpu_env checks the pair under FSDP2 too, although "
            "FSDP2 itself never reads sync_module_states.",
            fix=f"{c.name('sync_module_states')}: true (or delete it: the launcher's default is true)",
            evidence=_evidence(c, "cpu_ram_efficient_loading", "sync_module_states"),
            id="fsdp-config/ram-loading-without-sync",
        )
    ]


def checkpointing_twice(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """transformers 5.25 trainer.py Trainer.create_accelerator_and_postprocess (4.33-4.x: Trainer.__init__)."""
    if c.flag("activation_checkpointing") is not True:
        return []
    if f.plan is not None:  # what the run passes the Trainer: off where its [fsdp] has FSDP checkpoint instead
        trainer, arg = reading.trainer_checkpointing(f.plan), f.plan.checkpointing_arg
    elif f.run is not None and isinstance(f.run.training.gradient_checkpointing, bool):
        trainer, arg = f.run.training.gradient_checkpointing, "activation_checkpointing"
    else:
        why = "no run config given (--config)" if f.run is None else "the run's gradient_checkpointing is auto"
        return [NotJudged("activation checkpointing twice", why + ", so the Trainer's own checkpointing is unknown")]
    if not trainer:
        return []
    return [
        error(
            f"{c.path}: {c.name('activation_checkpointing')} and the run's gradient checkpointing are both on: "
            "transformers refuses the pair",
            detail='transformers 5.25 trainer.py Trainer.create_accelerator_and_postprocess raises "`fsdp_config'
            "['activation_checkpointing']` (FSDP's own activation checkpointing) and the `activation_checkpointing` "
            'training argument can\'t both be set to True." (4.33-4.x: "... can\'t be set to True simultaneously"); '
            f"the run passes {arg}=True.",
            fix="[training] gradient_checkpointing = false, keeping FSDP's (it checkpoints the wrapped layers "
            "without the Trainer's redundant all-gather in backward)",
            evidence={**_evidence(c, "activation_checkpointing"), arg: True},
            id="fsdp-config/checkpointing-twice",
        )
    ]


def state_dict(c: Config, f: Facts) -> list[Finding]:
    """transformers 5.25 trainer.py Trainer.save_model (FULL_STATE_DICT only); accelerate 1.8-1.16
    set_state_dict_type (LOCAL under FSDP2), utils/fsdp_utils.py save_fsdp_model, commands/merge.py."""
    kind = c.state_dict_type()
    given = "state_dict_type" in c.keys
    origin = "" if given else f" ({c.name('state_dict_type')} absent: FSDP{c.version}'s default)"
    if kind == "LOCAL_STATE_DICT" and c.version == 2:
        return [
            error(
                f"{c.path}: {c.name('state_dict_type')} LOCAL_STATE_DICT under fsdp_version 2: accelerate refuses it",
                detail='accelerate 1.8-1.16 utils/dataclasses.py set_state_dict_type: "FSDP2 does not support '
                'LOCAL_STATE_DICT. Please set `fsdp_state_dict_type` to `SHARDED_STATE_DICT` or `FULL_STATE_DICT`."',
                fix=f"{c.name('state_dict_type')}: FULL_STATE_DICT",
                evidence=_evidence(c, "state_dict_type"),
                id="fsdp-config/local-state-dict",
            )
        ]
    if kind not in ("SHARDED_STATE_DICT", "LOCAL_STATE_DICT"):
        return []
    return [
        warning(
            f"{c.path}: {kind}{origin}: Trainer.save_model writes no model, so the run ends without a loadable "
            "model.safetensors",
            detail="transformers 5.25 trainer.py Trainer.save_model saves under FSDP only when the plugin's "
            "state_dict_type is FULL_STATE_DICT, silently otherwise; checkpoints hold a torch.distributed.checkpoint "
            "folder (pytorch_model_fsdp_0/, accelerate utils/fsdp_utils.py save_fsdp_model) that from_pretrained "
            "cannot read.",
            fix=f"{c.name('state_dict_type')}: FULL_STATE_DICT (gathered on rank 0 at each save), or merge a "
            "checkpoint "
            "afterwards: accelerate merge-weights RUN/checkpoint-N/pytorch_model_fsdp_0 OUT (safetensors, on the CPU)",
            evidence={**_evidence(c, "state_dict_type"), "state_dict_type": kind},
            id="fsdp-config/state-dict-saves-no-model",
        )
    ]


# ---------------------------------------------------------------- wrapping


def _layer_names(c: Config) -> list[str] | None:
    """The classes to wrap as accelerate 1.16 reads them: str(value).split(",") with no strip
    (FullyShardedDataParallelPlugin.__post_init__), so "A, B" names " B"."""
    value = c.keys.get("transformer_layer_cls_to_wrap")
    return None if value is None else str(value).split(",")


def _classes_shown(classes: dict[str, Any]) -> str:
    names = [n for n in classes.get("classes") or [] if n.endswith(("Layer", "Block"))]
    names = sorted({*names, *(classes.get("no_split_modules") or [])})
    return ", ".join(names[:12]) + (", ..." if len(names) > 12 else "") if names else "none named *Layer or *Block"


def wrap_classes(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """accelerate 0.34-1.16 utils/dataclasses.py set_auto_wrap_policy (FSDP1), utils/fsdp_utils.py
    fsdp2_prepare_auto_wrap_policy (FSDP2): "Could not find the transformer layer class {name} in the model."."""
    names = _layer_names(c)
    if names is None or c.wrap_policy() != "TRANSFORMER_BASED_WRAP":
        return []
    spaced = [n for n in names if n != n.strip() or not n.strip().isidentifier()]
    classes = f.model_classes if f.model_classes and "error" not in f.model_classes else None
    if classes is None and not spaced:
        why = (f.model_classes or {}).get("error") or "no model config given (--model-config)"
        return [NotJudged("the wrap classes", why)]
    have = set(classes["classes"] or []) if classes else set()
    missing = spaced + [n for n in names if n not in spaced and classes and n not in have]
    if not missing:
        return []
    said = "; ".join(f"{n!r}" + (did_you_mean(n.strip(), have) if have else "") for n in missing)
    model = f" {classes['architecture']}" if classes and classes.get("architecture") else ""
    return [
        error(
            f"{c.path}: {c.name('transformer_layer_cls_to_wrap')} names classes the model{model} does not have: {said}",
            detail='accelerate 0.34-1.16 raises "Could not find the transformer layer class {name} in the model." when '
            "the model is prepared (utils/dataclasses.py set_auto_wrap_policy for FSDP1, utils/fsdp_utils.py "
            "fsdp2_prepare_auto_wrap_policy for FSDP2); it splits the value on commas without stripping spaces."
            + (f" The model's layer classes: {_classes_shown(classes)}." if classes else ""),
            fix="name the model's own classes, comma-separated without spaces, or delete the key so that "
            "accelerate wraps the model's _no_split_modules"
            + (f" ({', '.join(classes['no_split_modules'])})" if classes and classes.get("no_split_modules") else ""),
            evidence={**_evidence(c, "transformer_layer_cls_to_wrap"), "missing": missing},
            id="fsdp-config/wrap-class-missing",
        )
    ]


def _one_unit_why(c: Config, f: Facts) -> str | NotJudged | None:
    policy = c.wrap_policy()
    if policy == "NO_WRAP":
        given = "auto_wrap_policy" in c.keys
        ignored = (
            " (fsdp_transformer_layer_cls_to_wrap is then unused)" if "transformer_layer_cls_to_wrap" in c.keys else ""
        )
        return f"{c.name('auto_wrap_policy')} {'NO_WRAP' if given else 'absent (NO_WRAP)'}{ignored}"
    if policy == "SIZE_BASED_WRAP" and c.version == 1 and str(c.keys.get("min_num_params")) == "0":
        return (
            f'SIZE_BASED_WRAP with {c.name("min_num_params")} 0 (accelerate drops the policy: "we silently ignore it")'
        )
    if policy != "TRANSFORMER_BASED_WRAP" or "transformer_layer_cls_to_wrap" in c.keys:
        return None
    classes = f.model_classes if f.model_classes and "error" not in f.model_classes else None
    if classes is None:
        return NotJudged("what TRANSFORMER_BASED_WRAP wraps", (f.model_classes or {}).get("error") or "no model config")
    present = [n for n in classes.get("no_split_modules") or [] if n in (classes.get("classes") or [])]
    if present:
        return None
    return f"TRANSFORMER_BASED_WRAP with no class named, and {classes['architecture']} has no _no_split_modules class"


def one_unit(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """accelerate 1.16 FullyShardedDataParallelPlugin.__post_init__ (NO_WRAP when absent), set_auto_wrap_policy,
    utils/fsdp_utils.py fsdp2_prepare_model / fsdp2_prepare_auto_wrap_policy."""
    why = _one_unit_why(c, f)
    if why is None or isinstance(why, NotJudged):
        return [why] if why else []
    params = _parameters(f)
    size = f" ({params * 2 / 2**30:.1f} GiB in 16-bit)" if params else ""
    return [
        warning(
            f"{c.path}: {why}: the decoder layers are one FSDP unit, gathered whole on every GPU{size}",
            detail="accelerate 1.16 FSDP2 (utils/fsdp_utils.py fsdp2_prepare_model) then shards only the embeddings, "
            "the final norm with the head, and the root, which holds every layer: each forward and backward "
            "all-gathers all of them at once, so a GPU must hold the whole unsharded model. FSDP1 makes the whole "
            "model one flat parameter.",
            fix="fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP, with fsdp_transformer_layer_cls_to_wrap naming the "
            "decoder-layer class where the model has no _no_split_modules",
            evidence={**_evidence(c, "auto_wrap_policy", "transformer_layer_cls_to_wrap", "min_num_params")},
            id="fsdp-config/no-wrap",
        )
    ]


# ---------------------------------------------------------------- gradients and QLoRA


def clipping(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """accelerate 1.10-1.14 vs 1.16 accelerator.py Accelerator.clip_grad_norm_; transformers 5.25 trainer.py
    Trainer._clip_grad_norm; torch 2.13 torch/distributed/tensor/_dispatch.py (mixed Tensor and DTensor)."""
    if c.version != 2 or c.keys.get("ignored_modules") is None:
        return []
    if f.plan is not None and not f.plan.max_grad_norm:
        return []
    if f.fsdp_stack is None:
        return [NotJudged("clipping over sharded and ignored parameters", "accelerate and transformers not installed")]
    accelerate, trainer = f.fsdp_stack.get("accelerate_clips_per_mesh"), f.fsdp_stack.get("trainer_clips_per_mesh")
    if accelerate is None:
        return [NotJudged("clipping over sharded and ignored parameters", "accelerate is not installed here")]
    if accelerate:
        return []
    title = (
        f"{c.path}: {c.name('ignored_modules')} leaves parameters out of FSDP2: this accelerate's clip_grad_norm_ "
        "meets DTensor and plain gradients together"
    )
    detail = (
        "accelerate 1.10-1.14 accelerator.py Accelerator.clip_grad_norm_ hands FSDP2's parameters to "
        'torch.nn.utils.clip_grad_norm_, which stops with "got mixed torch.Tensor and DTensor" when some gradients '
        "are plain tensors (torch/distributed/tensor/_dispatch.py); accelerate 1.16 clips one device mesh at a time."
    )
    fix = "pip install 'accelerate>=1.16', or leave fsdp_ignored_modules out"
    evidence = {**_evidence(c, "ignored_modules"), **f.fsdp_stack}
    if trainer:
        return [
            info(
                title + " (the Trainer of this transformers clips per mesh itself)",
                detail=detail + " transformers 5.25 trainer.py Trainer._clip_grad_norm goes to _mixed_mesh_grad_norm "
                "first: only a loop of your own calling accelerator.clip_grad_norm_ fails.",
                fix=fix,
                evidence=evidence,
                id="fsdp-config/clipping-mixed-dtensor",
            )
        ]
    return [error(title, detail=detail, fix=fix, evidence=evidence, id="fsdp-config/clipping-mixed-dtensor")]


def _torch_at_least(f: Facts, *version: int) -> bool | None:
    found = version_tuple((f.packages or {}).get("torch"))
    return None if found is None else found >= version


def qlora_storage(c: Config, f: Facts) -> list[Finding | NotJudged]:
    """torch 2.13 torch/distributed/fsdp/_flat_param.py (FSDP1: one dtype per flat parameter, no integers);
    accelerate 1.16 utils/fsdp_utils.py fsdp2_prepare_model (uint8 Params4bit left out of sharding, torch >= 2.7)."""
    lora = getattr(f.run, "lora", None)
    if lora is None or lora.quantize != "4bit":
        return []
    planned = getattr(f.plan, "lora", None) or {}
    storage, dtype = planned.get("quant_storage"), getattr(f.plan, "load_dtype", None)
    if storage is None or dtype is None:
        return [NotJudged("QLoRA's quant storage", "the run's plan could not be made")]
    if storage == dtype:
        return []
    evidence = {**_evidence(c), "quant_storage": storage, "load_dtype": dtype}
    fix = f"store the 4-bit weights in the model's dtype: bnb_4bit_quant_storage = torch.{dtype}"
    if storage == "uint8" and c.version == 2 and _torch_at_least(f, 2, 7):
        return [
            warning(
                f"{c.path}: QLoRA's 4-bit weights stored as uint8: FSDP2 leaves them out of sharding, a full copy "
                "on every GPU",
                detail="accelerate 1.16 utils/fsdp_utils.py fsdp2_prepare_model passes frozen non-floating Params4bit "
                'to fully_shard as ignored_params ("Found N non-floating frozen Params4bit. Excluding from FSDP2 '
                'sharding to prevent quant_state corruption.") and skips cpu_ram_efficient_loading for them.',
                fix=fix,
                evidence=evidence,
                id="fsdp-config/qlora-quant-storage",
            )
        ]
    said = (
        'torch/distributed/fsdp/_flat_param.py: "Cannot flatten integer dtype tensors"'
        if storage == "uint8" and c.version == 1
        else "FSDP1 flattens each unit's parameters into one tensor of one dtype"
        if c.version == 1
        else "before torch 2.7 accelerate cannot exclude them, and fully_shard's DTensor conversion corrupts their "
        "quant_state (utils/fsdp_utils.py fsdp2_prepare_model)"
    )
    return [
        error(
            f"{c.path}: QLoRA's 4-bit weights stored as {storage}, the model's other weights {dtype}: FSDP{c.version} "
            "cannot shard them",
            detail=said + ". transformers passes bnb_4bit_quant_storage to bitsandbytes as is "
            "(integrations/bitsandbytes.py); nothing compares it with the model's dtype before FSDP does.",
            fix=fix,
            evidence=evidence,
            id="fsdp-config/qlora-quant-storage",
        )
    ]


# ---------------------------------------------------------------- the check

RULES = (
    unknown_keys,
    invalid_values,
    fsdp1_keys,
    reshard_after_forward,
    hybrid_shard,
    fsdp2_stack,
    bf16_gpus,
    model_precision,
    run_precision,
    ram_efficient_loading,
    ram_loading_sync,
    checkpointing_twice,
    state_dict,
    wrap_classes,
    one_unit,
    clipping,
    qlora_storage,
)


@check(
    "fsdp-config",
    "an accelerate FSDP config vs accelerate, transformers and torch, the model, the GPUs and the run",
    messages={
        "unknown-key": "an fsdp_config key accelerate never reads (dropped without a word)",
        "unknown-top-key": "a top-level key accelerate refuses the file for",
        "invalid-value": "a value accelerate cannot map to torch's enums or a bool",
        "fsdp1-keys": "FSDP1-only settings under fsdp_version 2, dropped without an error",
        "reshard-strategy-string": "fsdp_reshard_after_forward is a strategy name under FSDP2 (a bool there)",
        "reshard-ignored-fsdp1": "fsdp_reshard_after_forward under FSDP1, where the sharding strategy wins",
        "hybrid-shard-fsdp2": "HYBRID_SHARD under FSDP2: ignored, sharded over every rank of every node",
        "fsdp2-too-old": "torch or accelerate too old for FSDP2 (or for its ignored modules)",
        "bf16-unsupported": "mixed_precision bf16 on GPUs without bf16",
        "mixed-precision": "mixed_precision against the model's dtype",
        "precision-mismatch": "mixed_precision disagrees with the run's precision",
        "ram-efficient-loading-off": "every rank loads the whole pretrained model into host RAM",
        "ram-loading-without-sync": "cpu_ram_efficient_loading with sync_module_states false: the launcher refuses",
        "checkpointing-twice": "FSDP's activation checkpointing and the run's gradient checkpointing both on",
        "state-dict-saves-no-model": "a state dict type with which Trainer.save_model writes no model",
        "local-state-dict": "LOCAL_STATE_DICT under FSDP2",
        "wrap-class-missing": "fsdp_transformer_layer_cls_to_wrap names a class the model does not have",
        "no-wrap": "no wrap policy in effect: the decoder layers are one FSDP unit",
        "clipping-mixed-dtensor": "gradient clipping over DTensor and plain gradients (ignored modules)",
        "qlora-quant-storage": "QLoRA's 4-bit storage dtype FSDP cannot shard",
        "not-judged": "rules the facts at hand cannot decide, and why",
    },
)
def fsdp_config_check(
    fsdp_config: dict[str, Any],
    packages: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
    model_classes: dict[str, Any] | None = None,
    model_shape: dict[str, Any] | None = None,
    gpus: dict[str, Any] | None = None,
    fsdp_stack: dict[str, Any] | None = None,
    run=None,
    plan=None,
):
    c = Config(
        str(fsdp_config["path"]),
        fsdp_config["version"],
        fsdp_config["fsdp"],
        fsdp_config["written"],
        fsdp_config["top"],
    )
    f = Facts(packages, model_config, model_classes, model_shape, gpus, fsdp_stack, run, plan)
    said = [outcome for rule in RULES for outcome in rule(c, f)]
    findings = [s for s in said if isinstance(s, Finding)]
    unjudged = [s for s in said if isinstance(s, NotJudged)]
    if unjudged:
        findings.append(
            info(
                f"{c.path}: not judged: {'; '.join(f'{u.rule} ({u.why})' for u in unjudged)}",
                fix="give what is missing: --model-config (or --config with [model] path), a run config, GPU facts",
                evidence={"path": c.path, "not_judged": [u._asdict() for u in unjudged]},
                id="fsdp-config/not-judged",
            )
        )
    if all(x.severity.rank <= 1 for x in findings):
        judged = f"{len(RULES) - len(unjudged)} of {len(RULES)} rules judged, none broken"
        findings.insert(0, ok(f"{c.path}: {_summary(c)}: {judged}", evidence=_evidence(c)))
    return findings


def _summary(c: Config) -> str:
    wrap = c.wrap_policy()
    names = _layer_names(c)
    wrap += f" ({','.join(names)})" if names and wrap == "TRANSFORMER_BASED_WRAP" else ""
    return f"FSDP{c.version}, mixed_precision {c.mixed_precision()}, {c.state_dict_type()}, {wrap}"


@check(
    "fsdp-world",
    "FSDP has ranks to shard over: transformers refuses it in a single process",
    messages={"one-process": "[fsdp] asked of a run of one process"},
)
def fsdp_world(plan):
    """transformers 4.x-5.25 trainer.py Trainer.__init__: `if args.fsdp ... and args.parallel_mode !=
    ParallelMode.DISTRIBUTED: raise ValueError("Using fsdp only works in distributed training.")`."""
    if plan.fsdp is None:
        return []
    if plan.world_size > 1:
        return [ok(f"FSDP{plan.fsdp.get('version', 2)} shards over {plan.world_size} ranks", id="fsdp-world")]
    return [
        error(
            '[fsdp] in a run of one process: transformers refuses it ("Using fsdp only works in distributed '
            'training.")',
            detail="FSDP shards the model's states over the ranks; with one there is nothing to shard over, and the "
            "Trainer stops at its start, after the model has loaded.",
            fix="launch several processes ([launch] nproc_per_node = the GPUs of a node, or nnodes > 1), or remove "
            "[fsdp] to train on one GPU (with [lora] or gradient checkpointing where memory is short)",
            evidence={"world_size": plan.world_size, "nproc_per_node": plan.nproc_per_node, "nnodes": plan.nnodes},
            id="fsdp-world/one-process",
        )
    ]
