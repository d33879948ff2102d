"""Checks of a run config against the installed stack and the machine: batch-size, lr-scheduler,
gradient-checkpointing, zero-stage. They run in `sftdoctor train`'s gate and in `check --config`."""

from __future__ import annotations

import math
from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.train import resolve

BIG_ACCUMULATION = 64
HEADROOM = 0.5  # share of GPU memory a recommended stage may give model states; activations need the rest


@check("batch-size", "global batch = per-device batch x gradient accumulation x world size, exactly")
def batch_size(run_config: dict[str, Any], gpus: dict[str, Any] | None = None):
    training = run_config["training"]
    nproc, nnodes = resolve.world(run_config, gpus)
    world = nproc * nnodes
    per_device = training["per_device_batch_size"]
    target = training.get("global_batch_size") or per_device * world
    accum = resolve.accumulation(target, per_device, world)
    evidence = {"global_batch_size": target, "per_device_batch_size": per_device, "world_size": world,
                "nproc_per_node": nproc, "nnodes": nnodes, "gradient_accumulation_steps": accum}
    if accum is None:
        nearest = resolve.nearest_global_batches(target, per_device, world)
        return error(
            f"global batch {target} is not a multiple of {per_device} per device x {world} processes",
            detail=f"global = per_device x accumulation x world size; with {world} processes "
                   f"({nproc} per node x {nnodes} nodes) the nearest that work are {' or '.join(map(str, nearest))}.",
            fix=f"[training] global_batch_size = {nearest[-1]} (or {nearest[0]}), or change per_device_batch_size",
            evidence=evidence)
    line = (f"global batch {target} = {per_device} per device x {accum} accumulation x {world} "
            f"process{'es' if world > 1 else ''}")
    if per_device == 1 and accum > BIG_ACCUMULATION:
        return warning(
            f"{line}: {accum} sequential micro-steps per optimizer step",
            detail="Each micro-step of one sequence leaves the GPU underused; with packing each row already "
                   "holds max_length tokens, so a larger per-device batch usually fits and runs faster.",
            fix="raise [training] per_device_batch_size (memory permitting) and keep global_batch_size", evidence=evidence)
    return ok(line, evidence=evidence)


def _total_steps(run_config: dict[str, Any], data: dict[str, Any] | None, gpus) -> int | None:
    training = run_config["training"]
    if training.get("max_steps"):
        return training["max_steps"]
    if not data:
        return None
    nproc, nnodes = resolve.world(run_config, gpus)
    target = training.get("global_batch_size") or training["per_device_batch_size"] * nproc * nnodes
    rows = data["train"]["rows"] * (1 - run_config["data"].get("eval_fraction", 0.0))
    return max(1, math.ceil(training["epochs"] * rows / target))


@check("lr-scheduler", "the learning-rate schedule the installed transformers/DeepSpeed will really run")
def lr_scheduler(run_config: dict[str, Any], transformers_features: dict[str, Any] | None = None,
                 deepspeed_config: dict[str, Any] | None = None, data: dict[str, Any] | None = None,
                 gpus: dict[str, Any] | None = None):
    training = run_config["training"]
    kind = training["lr_scheduler"]
    kwargs = resolve.lr_scheduler_kwargs(training, transformers_features)
    total = _total_steps(run_config, data, gpus)
    warmup = training.get("warmup_steps")
    if warmup is None:
        warmup = math.ceil(training.get("warmup_ratio", 0.03) * total) if total else None
    evidence = {"lr_scheduler": kind, "kwargs": kwargs, "warmup_steps": warmup, "total_steps": total,
                "features": transformers_features}
    ds = (deepspeed_config or {}).get("config") or resolve.deepspeed_config(run_config) or {}
    if "scheduler" in ds:
        return warning(
            f"the DeepSpeed JSON's scheduler ({ds['scheduler'].get('type')}) replaces {kind}",
            detail="transformers hands scheduling to DeepSpeed when its JSON has a \"scheduler\" block "
                   "(integrations/deepspeed.py, 4.x-5.x): [training] lr_scheduler, its floor and warmup are ignored.",
            fix='delete the "scheduler" block from the DeepSpeed JSON', evidence=evidence)
    if kind == "cosine_with_min_lr" and transformers_features and not transformers_features.get("cosine_with_min_lr"):
        return error("the installed transformers has no cosine_with_min_lr schedule (added in 4.38)",
                     fix="pip install -U 'transformers>=4.38', or lr_scheduler = \"cosine\"", evidence=evidence)
    if total is not None and warmup is not None and warmup >= total:
        return error(f"warmup of {warmup} steps is as long as the whole run ({total} steps)",
                     detail="The learning rate would never reach its peak, and the schedule never decays.",
                     fix="lower [training] warmup_steps, or use warmup_ratio = 0.03", evidence=evidence)
    floor = ""
    if kwargs:
        key, value = next(iter(kwargs.items()))
        floor = f" to a floor of {value:g}" + (" x learning_rate" if key == "min_lr_rate" else "") + f" ({key})"
    steps = f"; warmup {warmup} of ~{total} steps" if total else ""
    return ok(f"{kind} from {training['learning_rate']:g}{floor}{steps}", evidence=evidence)


@check("gradient-checkpointing", "activation checkpointing: on, non-reentrant, under the name the installed transformers reads")
def gradient_checkpointing(run_config: dict[str, Any], transformers_features: dict[str, Any] | None = None,
                           deepspeed_config: dict[str, Any] | None = None):
    on = run_config["training"]["gradient_checkpointing"]
    arg = (transformers_features or {}).get("checkpointing_arg", "gradient_checkpointing")
    ds = (deepspeed_config or {}).get("config") or resolve.deepspeed_config(run_config) or {}
    findings = []
    if "activation_checkpointing" in ds:
        findings.append(warning(
            "the DeepSpeed JSON's \"activation_checkpointing\" block does nothing for Hugging Face models",
            detail="It configures deepspeed.checkpointing, which only Megatron-style model code calls; "
                   "transformers models checkpoint through TrainingArguments instead.",
            fix='remove the block; use [training] gradient_checkpointing = true', evidence={"deepspeed": ds["activation_checkpointing"]}))
    if on:
        findings.insert(0, ok(
            f"on, non-reentrant (use_reentrant=False), passed as TrainingArguments.{arg}",
            detail="transformers 5 renamed gradient_checkpointing to activation_checkpointing (the old name is a "
                   "deprecated alias); sftdoctor passes the name the installed version reads.",
            evidence={"argument": arg}))
    else:
        findings.insert(0, info("off: every layer's activations stay in memory (fastest, most memory)",
                                fix="[training] gradient_checkpointing = true if memory runs short"))
    return findings


def parameter_count(model: dict[str, Any]) -> int | None:
    """Parameters of a llama-style decoder (gated MLP) from config.json, without torch; None for other
    families. Equal to the model transformers 5.24 builds (tests/plan compares them on the meta device):
    Qwen2 has q/k/v biases, `attention_bias`/`mlp_bias` add the others, Qwen3 a q/k RMSNorm per layer."""
    needed = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads")
    if model.get("model_type") not in GATED_MLP or any(not model.get(k) for k in needed):
        return None
    h, layers, inter, vocab = model["hidden_size"], model["num_hidden_layers"], model["intermediate_size"], model["vocab_size"]
    heads = model["num_attention_heads"]
    head_dim = model.get("head_dim") or h // heads
    q, kv = heads * head_dim, (model.get("num_key_value_heads") or heads) * head_dim
    attention = 2 * h * q + 2 * h * kv
    if model.get("attention_bias"):
        attention += q + 2 * kv + h
    elif model["model_type"] == "qwen2":
        attention += q + 2 * kv
    if model["model_type"] == "qwen3":
        attention += 2 * head_dim
    mlp = 3 * h * inter + ((2 * inter + h) if model.get("mlp_bias") else 0)
    embeddings = vocab * h * (1 if model.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp + 2 * h) + embeddings + h


GATED_MLP = {"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "olmo2", "granite", "cohere"}


def largest_layer(model: dict[str, Any]) -> int:
    """Parameters of the largest single module: the embedding for these families."""
    return model["vocab_size"] * model["hidden_size"]


def model_state_bytes(params: int, largest: int, stage: int, world: int,
                      offload_optimizer: bool = False, offload_params: bool = False) -> int:
    """Per-GPU bytes of weights, gradients and AdamW states in mixed precision, counted as DeepSpeed's own
    estimators count them (estimate_zero2/zero3_model_states_mem_needs, DeepSpeed 0.10-0.19): 16-bit params
    (2 bytes) and, partitioned over the ranks, 16-bit and fp32 gradients, fp32 master weights and Adam's two
    moments (2 + 4 + 4 + 8 = 18 bytes). ZeRO-3 also gathers the largest layer in fp32. Stage 0 is DDP with
    AMP: fp32 weights, gradients and moments (16 bytes), nothing partitioned."""
    if stage == 0:
        return params * 16
    if stage == 1:  # optimizer states partitioned; 16-bit weights and gradients whole
        return params * 4 + params * 16 // world
    if stage == 2:
        return params * 2 if offload_optimizer else params * 2 + params * 18 // world
    if offload_params:
        return 4 * largest
    return 4 * largest + (params * 2 // world if offload_optimizer else params * 18 // world)


@check("zero-stage", "the ZeRO stage vs the model's size and the GPUs' memory")
def zero_stage(run_config: dict[str, Any], model_config: dict[str, Any], gpus: dict[str, Any],
               deepspeed_config: dict[str, Any] | None = None):
    devices = gpus.get("devices") or []
    if not devices:
        raise NotApplicable("no NVIDIA GPU visible")
    params = parameter_count(model_config)
    if params is None:
        raise NotApplicable(f"parameter count of model type {model_config.get('model_type')!r} not known")
    ds = (deepspeed_config or {}).get("config") or resolve.deepspeed_config(run_config) or {}
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise NotApplicable(f"ZeRO stage {stage!r} is not one of 0-3")
    off_opt = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
    off_par = (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme")
    nproc, nnodes = resolve.world(run_config, gpus)
    world = nproc * nnodes
    memory = min(d.get("memory_total_mib") or 0 for d in devices) * 2**20
    largest = largest_layer(model_config)
    need = {s: model_state_bytes(params, largest, s, world) for s in range(4)}
    used = model_state_bytes(params, largest, stage, world, off_opt, off_par)
    gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
    evidence = {"parameters": params, "stage": stage, "world_size": world, "gpu_memory_bytes": memory,
                "model_states_bytes": used, "per_stage_bytes": need}
    table = ", ".join(f"ZeRO-{s} {gib(b)}" for s, b in need.items())
    head = f"{params / 1e9:.2f}B parameters on {world} GPUs of {gib(memory)}: model states need {gib(used)} per GPU at ZeRO-{stage}"
    if used > memory:
        fitting = [s for s in range(4) if need[s] <= memory * HEADROOM]
        return error(head + " — more than the GPU has",
                     detail=f"Weights, gradients and AdamW states under mixed precision: {table}. Activations come on top.",
                     fix=(f"[deepspeed] zero_stage = {fitting[0]}" if fitting else
                          "[deepspeed] zero_stage = 3 with offload_optimizer = true (and offload_params = true), or more GPUs"),
                     evidence=evidence)
    if used > memory * 0.6:
        return warning(head + f" ({used / memory:.0%} of it), leaving little for activations",
                       detail=table, fix=f"a higher ZeRO stage, or gradient checkpointing and a smaller micro-batch",
                       evidence=evidence)
    faster = [s for s in range(stage) if need[s] <= memory * HEADROOM]
    if stage == 3 and 2 in faster:
        return info(head + "; ZeRO-2 would fit too and communicates less",
                    detail=table, fix="[deepspeed] zero_stage = 2", evidence=evidence)
    return ok(head, detail=table, evidence=evidence)
