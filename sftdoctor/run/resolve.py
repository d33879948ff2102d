"""decide(run config, facts) -> Plan: the one place where every setting of a run is decided.

`sftdoctor check`, `plan`, the gate and launcher of `sftdoctor train`, the recipe every worker runs and
the watchers all read this Plan; resolved.json in the run directory is `Plan.to_json()`. Pure and cheap
(no torch): the facts it reads (GPUs, installed packages, the DeepSpeed JSON, the data's shape, the
chat template, the rendezvous port) were collected by probes, and any object with `.get(name)` serves.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sftdoctor.run import TORCHRUN_DEFAULT_PORT, layout
from sftdoctor.run.config import RunConfig
from sftdoctor.run.embeddings import repair_ids
from sftdoctor.run.fsdp import flag, trainer_config
from sftdoctor.run.gpus import FLASH_MIN_CC, bf16_capable, devices, lacking, smallest_memory
from sftdoctor.run.memory import Fit, Setting, Workload, fit
from sftdoctor.run.schedule import trainer_warmup
from sftdoctor.run.shape import Shape
from sftdoctor.run.smem import TRITON_MIN_CC

PLAN_VERSION = 11  # 2: chat_template; 3: lora, checkpointing_reentrant; 4: evaluation; 5: join_timeout_s;
# 6: stop_grace_s; 7: length_grouping; 8: repair_token_ids; 9: ddp_find_unused_parameters; 10: fsdp;
# 11: data_source, streaming
SLURM_PORTS = (20000, 30000)  # inside an allocation: 20000 + job id mod 10000, below the ephemeral range
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
DISTRIBUTED_CHECK_MAX_S = 120.0
REHEARSAL_STEPS, REHEARSAL_SAVE_AT, REHEARSAL_ROWS = 4, 2, 64
LOAD_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class Plan:
    """Everything a run does, decided. `reasons` says where the non-obvious choices came from."""

    # world
    nproc_per_node: int
    nnodes: int
    node_rank: int
    join_timeout_s: int
    stop_grace_s: int  # after SIGTERM: save a checkpoint if one can be done by then, then stop
    world_size: int
    cuda: bool
    # batch: global = per_device x accumulation x world size
    per_device_batch_size: int
    global_batch_size: int
    gradient_accumulation_steps: int | None  # None: no whole accumulation reaches the global batch
    nearest_global_batch_sizes: tuple[int, ...]
    # model and numerics
    model_path: str
    tokenizer_path: str
    weights: str
    trust_remote_code: bool
    precision: str  # bf16 | fp16 | fp32
    load_dtype: str  # the dtype the weights are loaded in
    attn_implementation: str
    liger_kernel: bool
    liger_available: bool
    moe: bool
    ddp_find_unused_parameters: bool  # DDP's reducer looks for parameters a step leaves without a gradient
    # data
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    eval_fraction: float
    data_shape: str | None  # messages | prompt_completion | text: what the trainer gets
    data_format: str | None  # the files' own: messages, sharegpt, alpaca, prompt_completion, text
    data_rows: int | None
    data_source: dict[str, Any] | None  # a hub dataset (kind, name, subset, split, eval_split, revision); None: files
    streaming: bool  # the training rows an IterableDataset read as training goes ([data] streaming)
    max_length: int
    packing: bool
    length_grouping: dict[
        str, Any
    ]  # unpacked: the TrainingArguments key that batches rows of like length, and its value
    assistant_only_loss: bool
    chat_template: str | None  # the template file the tokenizer trains with; None: the tokenizer's own
    repair_token_ids: tuple[int, ...]  # untrained embedding rows set to the mean of the trained ones at load
    # optimisation
    learning_rate: float
    lr_scheduler: str
    lr_scheduler_kwargs: dict[str, float]
    warmup: dict[str, float]  # the TrainingArguments key the installed transformers reads, and its value
    warmup_steps: int | None  # what that comes to, when the run's length is known
    epochs: float
    max_steps: int | None
    total_steps: int | None
    weight_decay: float
    max_grad_norm: float
    checkpointing: bool
    checkpointing_arg: str  # activation_checkpointing (transformers 5.x) | gradient_checkpointing
    checkpointing_reentrant: bool  # TRL 1.16 forces reentrant checkpointing for PEFT under ZeRO-3
    # adapters: None = full fine-tune; else r, alpha, dropout, target_modules, modules_to_save, use_rslora,
    # use_dora, quantize, merge, compute_dtype, quant_storage, trainable_params, base_params (see lora_settings)
    lora: dict[str, Any] | None
    # [eval]: tasks, include, limit, num_fewshot, base (also evaluate base_path()), every_n_checkpoints
    evaluation: dict[str, Any] | None
    seed: int
    logging_steps: int
    save_steps: int
    save_total_limit: int
    eval_steps: int
    # DeepSpeed
    deepspeed: dict[str, Any] | None  # the effective JSON
    deepspeed_source: str | None  # the given file, or "generated for [deepspeed] zero_stage"
    zero_stage: int  # 0 without DeepSpeed
    offload_optimizer: bool
    offload_params: bool
    # FSDP2 (fully_shard)
    fsdp: dict[str, Any] | None  # the fsdp_config TrainingArguments gets (transformers' keys), None without FSDP
    fsdp_source: str | None  # the given accelerate config, or "generated for [fsdp]"
    fsdp_replicate: int  # hybrid sharding: replicas (nodes) of a group sharded within a node; 1 = full sharding
    # launch and timeouts
    master_addr: str
    master_port: int
    max_restarts: int
    distributed_check: bool
    distributed_check_bound_s: float
    rehearse: bool  # rehearse before launching: several processes or DeepSpeed, where failures hide
    hang_timeout_s: float
    ddp_timeout_s: int
    # watch
    on_nan: str
    max_skips: int
    loss_spike_factor: float
    report_to: str
    output_dir: str
    # how this launch runs
    plugins: bool = True
    rehearsal: bool = False
    data_limit: int | None = None
    drill: dict[str, Any] | None = None
    silenced: tuple[str, ...] = ()  # the ids the gate silenced: [checks] disable and --disable
    reasons: dict[str, str] = field(default_factory=dict)
    version: int = PLAN_VERSION

    @property
    def tokens_per_step_max(self) -> int:
        return self.global_batch_size * self.max_length

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in doc.items()}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Plan:
        if not isinstance(doc, dict) or doc.get("version") != PLAN_VERSION:
            found = doc.get("version") if isinstance(doc, dict) else None
            raise ValueError(f"a plan of version {found!r}; this sftdoctor reads version {PLAN_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in doc.items() if k in names}
        return cls(**values)


# ---------------------------------------------------------------- one function per decision


def world(run: RunConfig, gpus: dict[str, Any] | None, slurm: dict[str, Any] | None = None) -> tuple[int, int]:
    """(processes per node, nodes); nproc_per_node = "auto" is Slurm's GPUs per node inside an allocation, else
    every visible GPU, or 1 without GPUs; nnodes not given is the allocation's node count."""
    nproc, slurm = run.launch.nproc_per_node, slurm or {}
    if nproc == "auto":
        nproc = slurm.get("gpus_on_node") or max(1, len(devices(gpus)))
    nnodes = run.launch.nnodes if run.launch.is_given("nnodes") or not slurm.get("nnodes") else slurm["nnodes"]
    return int(nproc), int(nnodes)


def master_addr(run: RunConfig, slurm: dict[str, Any] | None) -> tuple[str, str]:
    """The rendezvous host, and why: the run config's, else the allocation's first node."""
    if run.launch.is_given("master_addr"):
        return run.launch.master_addr, "[launch].master_addr"
    if not (slurm or {}).get("hosts"):
        # inside an allocation whose node list could not be read, say so: the default is then a guess
        return run.launch.master_addr, f"the default ({slurm['hosts_from']})" if slurm else "the default"
    return slurm["hosts"][0], f"the first node of Slurm job {slurm['job_id']} ({slurm['hosts_from']})"


def accumulation(global_batch: int, per_device: int, world_size: int) -> int | None:
    """global = per_device x accumulation x world size; None when no whole accumulation hits it."""
    step = per_device * world_size
    return global_batch // step if global_batch % step == 0 else None


def nearest_global_batches(global_batch: int, per_device: int, world_size: int) -> tuple[int, ...]:
    step = per_device * world_size
    below = (global_batch // step) * step
    return tuple(b for b in (below, below + step) if b > 0)


def precision(run: RunConfig, gpus: dict[str, Any] | None) -> tuple[str, str]:
    """(precision, why). auto: bf16 unless a GPU is known to lack it (then fp16); fp32 without GPUs."""
    asked = run.model.precision
    if asked != "auto":
        return asked, "[model].precision in the run config"
    if not devices(gpus):
        return "fp32", '[model].precision = "auto" without a GPU: full precision on the CPU'
    capable = bf16_capable(gpus)
    if capable is False:
        return "fp16", '[model].precision = "auto" on GPUs without bf16'
    if capable is None:
        return "bf16", '[model].precision = "auto": bf16 assumed for GPUs of unknown compute capability'
    return "bf16", '[model].precision = "auto" on these GPUs'


def load_dtype(precision_: str, deepspeed: dict[str, Any] | None, lora: bool = False) -> str:
    """DeepSpeed keeps fp32 master weights itself (ZeRO 1-3 in bf16/fp16), so 16-bit weights load in 16 bits,
    at half the host memory. Without it, bf16/fp16 are AMP over fp32 weights: AdamW in pure bf16 would round
    small updates away. With LoRA the base is frozen (never updated), so it loads in 16 bits; peft keeps the
    adapters in fp32 (autocast_adapter_dtype, peft 0.12+)."""
    return LOAD_DTYPES[precision_] if deepspeed is not None or lora else "float32"


def lora_settings(
    run: RunConfig, precision_: str, zero_stage: int, modules: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The adapters as peft will build them, or None for a full fine-tune. QLoRA computes in the run's
    precision; under ZeRO-3 (and FSDP, passed as stage 3) its 4-bit weights are stored in that dtype too
    (bnb_4bit_quant_storage), the only way DeepSpeed or FSDP can shard them (transformers' DeepSpeed + QLoRA
    guide, peft's FSDP + QLoRA guide, bitsandbytes 0.43+)."""
    from sftdoctor.run.lora import adapter_parameters

    lora = run.lora
    if lora is None:
        return None
    compute = LOAD_DTYPES[precision_]
    out = {
        "r": lora.r,
        "alpha": lora.alpha,
        "dropout": lora.dropout,
        "target_modules": lora.target_modules if lora.target_modules == "all-linear" else list(lora.target_modules),
        "modules_to_save": list(lora.modules_to_save),
        "use_rslora": lora.use_rslora,
        "use_dora": lora.use_dora,
        "quantize": lora.quantize,
        "merge": lora.merge,
        "compute_dtype": compute,
        "quant_storage": compute if lora.quantize == "4bit" and zero_stage == 3 else "uint8",
    }
    known = modules and "error" not in modules
    out["trainable_params"] = adapter_parameters(modules, out) if known else None
    out["base_params"] = modules.get("parameters") if known else None
    return out


def attn_implementation(run: RunConfig, gpus: dict[str, Any] | None, packages: dict[str, Any]) -> str:
    asked = run.model.attn_implementation
    if asked != "auto":
        return asked
    found = devices(gpus)
    if found and packages.get("flash-attn") and not lacking(found, FLASH_MIN_CC):
        return "flash_attention_2"
    return "sdpa"


def liger_kernel(run: RunConfig, gpus: dict[str, Any] | None, packages: dict[str, Any]) -> bool:
    """Liger's Triton kernels need a CUDA GPU that Triton supports (compute capability 7.0 or newer)."""
    asked = run.training.liger_kernel
    if asked == "auto":
        found = devices(gpus)
        return bool(found) and bool(packages.get("liger-kernel")) and not lacking(found, TRITON_MIN_CC)
    return bool(asked)


def generated_deepspeed(run: RunConfig) -> dict[str, Any]:
    """A DeepSpeed JSON for [deepspeed] zero_stage, with the "auto" values transformers fills from the run
    (integrations/deepspeed.py, 4.x-5.x)."""
    section = run.deepspeed
    stage = section.zero_stage
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if stage == 3:
        zero.update(
            stage3_prefetch_bucket_size="auto",
            stage3_param_persistence_threshold="auto",
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if section.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if section.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "bf16": {"enabled": "auto"},
        "fp16": {
            "enabled": "auto",
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        "zero_optimization": zero,
        "gradient_clipping": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
    }


def deepspeed_json(run: RunConfig, given: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the DeepSpeed JSON the run uses, where it came from). `given` is the deepspeed_config fact."""
    if run.deepspeed.config is not None:
        return (given or {}).get("config"), run.deepspeed.config
    if run.deepspeed.zero_stage is None:
        return None, None
    return generated_deepspeed(run), "generated for [deepspeed] zero_stage"


def zero_settings(ds: dict[str, Any] | None) -> tuple[int, bool, bool]:
    """(stage, optimizer offloaded, parameters offloaded) of a DeepSpeed JSON; (0, False, False) without one."""
    zero = (ds or {}).get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    stage = zero.get("stage", 0)
    stage = stage if isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= 3 else 0

    def offloaded(block: Any) -> bool:
        return isinstance(block, dict) and block.get("device") in ("cpu", "nvme")

    return stage, offloaded(zero.get("offload_optimizer")), offloaded(zero.get("offload_param"))


def lr_scheduler_kwargs(run: RunConfig, features: dict[str, Any] | None) -> dict[str, float]:
    """The cosine_with_min_lr floor as the installed stack takes it. transformers wants exactly one of min_lr /
    min_lr_rate (both or neither raise when the scheduler is built, at train start); an absolute min_lr
    reads `optimizer.defaults`, which DeepSpeed's ZeRO optimizer lacks (AttributeError at train start,
    transformers 5.24 x DeepSpeed 0.19). The floor is known before the run, so it is passed as the rate."""
    t = run.training
    if t.lr_scheduler != "cosine_with_min_lr":
        return {}
    rate = t.min_lr / t.learning_rate if t.min_lr is not None else t.min_lr_rate
    if features and features.get("min_lr_rate") is False:  # older transformers knew only min_lr
        return {"min_lr": rate * t.learning_rate}
    return {"min_lr_rate": rate}


def total_steps(run: RunConfig, rows: int | None, global_batch: int) -> int | None:
    if run.training.max_steps:
        return run.training.max_steps
    if not rows:
        return None
    return max(1, math.ceil(run.training.epochs * rows * (1 - run.data.eval_fraction) / global_batch))


def warmup(run: RunConfig, features: dict[str, Any] | None, steps: int | None) -> tuple[dict[str, float], int | None]:
    """({TrainingArguments key: value}, warmup steps when the run's length is known). transformers 4.x took
    warmup_ratio; 5.x removed it and reads a warmup_steps below 1 as the ratio."""
    t = run.training
    if t.warmup_steps is not None:
        return {"warmup_steps": int(t.warmup_steps)}, t.warmup_steps
    args = {"warmup_ratio" if features and features.get("warmup_ratio") else "warmup_steps": t.warmup_ratio}
    return args, trainer_warmup(args, steps) if steps else None


def assistant_only_loss(shape: str | None, template: dict[str, Any] | None) -> bool:
    """Loss on assistant turns needs {% generation %} markers in the chat template: present, patched in by
    TRL (its bundled training templates, TRL 1.16), or in the drop-in chat_template() chooses."""
    return (
        shape == "messages"
        and bool(template)
        and bool(
            template.get("generation_markers") or template.get("trl_patchable") or template.get("marked_equivalent")
        )
    )


def chat_template(run: RunConfig, shape: str | None, template: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(the template file the tokenizer trains with, why), or (None, None) for the tokenizer's own: the one the
    run config gives, or, for chat rows whose template has no generation markers, a marked template that renders
    every probed conversation exactly as the tokenizer's own (facts/tokenizer.py), so only the loss mask changes
    and the model saved in final/ formats prompts as before."""
    if run.model.chat_template:
        return run.model.chat_template, "[model].chat_template in the run config"
    found = (template or {}).get("marked_equivalent")
    if shape != "messages" or not found:
        return None, None
    return found["path"], (
        f"{found['source']}'s {found['name']}.jinja: the tokenizer's template with {{% generation %}} "
        "markers (renders the same text), so the loss covers the assistant turns only"
    )


def eval_interval(run: RunConfig) -> int:
    """Optimizer steps between evaluations: eval_steps, else save_steps (one at each checkpoint)."""
    return run.training.eval_steps or run.training.save_steps


def evaluation(run: RunConfig) -> dict[str, Any] | None:
    e = run.eval
    if e is None:
        return None
    return {
        "tasks": list(e.tasks),
        "include": e.include,
        "limit": e.limit,
        "num_fewshot": e.num_fewshot,
        "base": e.base,
        "every_n_checkpoints": e.every_n_checkpoints,
    }


def base_path(plan: Plan) -> str:
    """Where the weights a run starts from are: the model folder or hub id, or RUN_DIR/base for a base
    initialised at random (it exists nowhere else; the recipe saves it there when an adapter or an
    evaluation needs it)."""
    if plan.weights == "random" or plan.rehearsal:
        return str((Path(plan.output_dir) / "base").absolute())  # named in adapter_config.json: loadable from anywhere
    local = Path(plan.model_path)
    return str(local.absolute()) if local.is_dir() else plan.model_path


def master_port(
    run: RunConfig, rendezvous: dict[str, Any] | None, slurm: dict[str, Any] | None = None
) -> tuple[int, str]:
    """The rendezvous port, and why. A port the user set is kept (a busy one is the nccl-env check's error);
    on one node the default 29500, when taken, and "auto" become a free port; inside a Slurm allocation, a port
    of the job's own (two jobs may share a first node)."""
    launch, seen = run.launch, rendezvous or {}
    if slurm and not launch.is_given("master_port") and str(slurm.get("job_id", "")).isdecimal():
        return SLURM_PORTS[0] + int(slurm["job_id"]) % (
            SLURM_PORTS[1] - SLURM_PORTS[0]
        ), f"Slurm job {slurm['job_id']}'s own port"
    free = seen.get("free_port")
    if launch.master_port == "auto":
        return int(free or TORCHRUN_DEFAULT_PORT), '[launch].master_port = "auto": a free port'
    if launch.is_given("master_port"):
        return int(launch.master_port), "[launch].master_port in the run config"
    busy = seen.get("master_port") == launch.master_port and seen.get("in_use")
    if busy and launch.nnodes == 1 and free:
        return int(free), f"the default {launch.master_port} is taken here: a free port"
    return int(launch.master_port), "torchrun's default"


STOP_GRACE_S = 30  # outside Slurm: what torchrun, Kubernetes and most schedulers give after SIGTERM


def stop_grace(run: RunConfig, slurm: dict[str, Any] | None) -> tuple[int, str]:
    """How long the ranks have after SIGTERM, and why. In a Slurm job the signal comes [slurm] signal_s before
    the time limit (the batch script's --signal; an `scancel` gives only KillWait, 30 s by default)."""
    if run.launch.stop_grace_s != "auto":
        return run.launch.stop_grace_s, "[launch].stop_grace_s in the run config"
    if slurm:
        return (
            run.slurm.signal_s,
            f"[slurm].signal_s: Slurm job {slurm.get('job_id')} is signalled that long before its limit",
        )
    return STOP_GRACE_S, "the usual grace after SIGTERM (torchrun's, Kubernetes')"


def node_rank(
    run: RunConfig, rendezvous: dict[str, Any] | None, slurm: dict[str, Any] | None = None, nnodes: int = 1
) -> tuple[int, str]:
    """This node's rank, and why. With the c10d rendezvous only node 0 matters: it hosts the store (torchrun
    ignores --node-rank and assigns the other nodes' ranks as they join), so "auto" asks whether master_addr
    is this host."""
    launch = run.launch
    if launch.node_rank != "auto":
        return launch.node_rank, "[launch].node_rank in the run config"
    if nnodes == 1:
        return 0, "one node"
    if slurm and slurm.get("node_id") is not None:
        return slurm["node_id"], f"SLURM_NODEID of job {slurm['job_id']}"
    if (rendezvous or {}).get("local"):
        return 0, f"master_addr {launch.master_addr} is this host: it hosts the rendezvous"
    return (
        1,
        f"master_addr {launch.master_addr} is another host: this node joins its rendezvous (torchrun assigns its rank)",
    )


def find_unused_parameters(ddp: bool, moe: bool, unused: dict[str, Any] | None) -> tuple[bool, str]:
    """DDP's find_unused_parameters, and why. Off where every trainable parameter gets a gradient at every step
    (it costs a traversal of the autograd graph per step); on where a step can leave one without: trainable
    parameters a text-only step never reaches (the unused_parameters probe: a multimodal model's vision tower,
    multi-token prediction layers, adapters or modules_to_save copies of modules the forward skips), or a
    mixture-of-experts model (experts no token is routed to). Left off, the reducer waits for those gradients and
    the next step fails ("Expected to have finished reduction in the prior iteration"). TRL 1.16 turns it on
    itself only for a model given with a processor; transformers 5.25 turns it off whenever checkpointing is on.
    Checkpointing stays non-reentrant under DDP (with_checkpointing), which find_unused_parameters supports."""
    if not ddp:
        return False, "no DDP: one process, or DeepSpeed's engine reduces the gradients"
    found = (unused or {}).get("unused_tensors") if "error" not in (unused or {}) else None
    if found:
        what = ", ".join((unused.get("kinds") or ["parameters"])[:3])
        return True, f"{found} trainable tensors ({what}) get no gradient on a text-only step (unused_parameters probe)"
    if moe:
        return True, "a mixture-of-experts model: experts no token is routed to get no gradient in that step"
    if unused is None or "error" in unused:
        return False, "a dense model (not probed: no model config.json, or the probe failed)"
    return False, "every trainable parameter gets a gradient on a text-only step (unused_parameters probe)"


def ddp_timeout(hang_timeout_s: float) -> int:
    """The process group gives up only after our watchdog has named the rank behind, even while a checkpoint
    saves (the watchdog then allows 4x hang_timeout_s)."""
    return int(4 * hang_timeout_s + 120)


# ---------------------------------------------------------------- the plan


def decide(run: RunConfig, facts: Any) -> Plan:
    """Decide every setting of `run` on the machine `facts` describe (anything with `.get(fact name)`). The facts
    are read in this order, so that of two inputs a probe refuses, the same one is reported first."""
    gpus, packages = facts.get("gpus"), facts.get("packages") or {}
    features = facts.get("transformers_features")
    data = facts.get("data") or {}
    slurm = facts.get("slurm")
    scale = _scale(run, gpus, slurm)
    chosen, why_precision = precision(run, gpus)
    zero = _zero(run, facts)
    sharded, why_sharded = fsdp_settings(run, facts, scale)
    schedule = _schedule(run, features, (data.get("train") or {}).get("rows"), scale["global_batch_size"])
    attn = attn_implementation(run, gpus, packages)
    packed, why_packing = packing(run, attn, facts.get("packing_probe") if run.training.packing == "auto" else None)
    meeting, why_meeting = _meeting(run, facts.get("rendezvous"), slurm, scale["nnodes"])
    moe = any(k in ((facts.get("model_config") or {}).get("raw_keys") or ()) for k in MOE_KEYS)
    template, why_template = chat_template(run, (data.get("train") or {}).get("shape"), facts.get("chat_template"))
    ddp = scale["world_size"] > 1 and zero["deepspeed"] is None and sharded["fsdp"] is None
    model, why_unused = _model(run, facts, chosen, zero, ddp, moe, sharded["fsdp"] is not None)
    plan = Plan(
        **scale,
        **zero,
        **sharded,
        **schedule,
        **meeting,
        **model,
        **_text(run, facts, data, packed, features, template),
        **_watch(run, scale["world_size"], zero["deepspeed"]),
        precision=chosen,
        attn_implementation=attn,
        liger_kernel=liger_kernel(run, gpus, packages),
        liger_available=bool(packages.get("liger-kernel")),
        moe=moe,
        reasons={
            "precision": why_precision,
            **why_meeting,
            "packing": why_packing,
            "ddp_find_unused_parameters": why_unused,
            **why_sharded,
            **({"chat_template": why_template} if why_template else {}),
        },
    )
    return with_checkpointing(plan, run, gpus, facts)


def _scale(run: RunConfig, gpus: dict[str, Any] | None, slurm: dict[str, Any] | None) -> dict[str, Any]:
    """How many processes on how many nodes, and the batch they share."""
    nproc, nnodes = world(run, gpus, slurm)
    world_size = nproc * nnodes
    per_device = run.training.per_device_batch_size
    global_batch = run.training.global_batch_size or per_device * world_size
    accum = accumulation(global_batch, per_device, world_size)
    return {
        "nproc_per_node": nproc,
        "nnodes": nnodes,
        "world_size": world_size,
        "cuda": bool(devices(gpus)),
        "per_device_batch_size": per_device,
        "global_batch_size": global_batch,
        "gradient_accumulation_steps": accum,
        "nearest_global_batch_sizes": () if accum else nearest_global_batches(global_batch, per_device, world_size),
    }


def _zero(run: RunConfig, facts: Any) -> dict[str, Any]:
    """The DeepSpeed JSON the run trains with, if any, and its ZeRO stage and offloads."""
    ds, ds_source = deepspeed_json(run, facts.get("deepspeed_config") if run.deepspeed.config else None)
    stage, offload_optimizer, offload_params = zero_settings(ds)
    return {
        "deepspeed": ds,
        "deepspeed_source": ds_source,
        "zero_stage": stage,
        "offload_optimizer": offload_optimizer,
        "offload_params": offload_params,
    }


FSDP_GENERATED = "generated for [fsdp]"


def fsdp_settings(run: RunConfig, facts: Any, scale: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """FSDP2's settings as TrainingArguments' fsdp_config (transformers 5.x `_process_fsdp_args` reads these keys
    and builds accelerate's FullyShardedDataParallelPlugin from them), and the reasons of the non-obvious ones.
    The wrap class is left to accelerate, which takes the model's own `_no_split_modules` (its decoder layer)
    when none is named; activation checkpointing is set by `with_checkpointing` (FSDP's, never the trainer's
    too: transformers refuses both)."""
    section = run.fsdp
    if section is None:
        return {"fsdp": None, "fsdp_source": None, "fsdp_replicate": 1}, {}
    if section.config is not None:  # as `accelerate launch --config_file` reads it (its version absent: 1, not 2)
        given = facts.get("fsdp_config") or {}
        config = trainer_config(given.get("version", 1), given.get("fsdp") or {})
        return {"fsdp": config, "fsdp_source": section.config, "fsdp_replicate": 1}, {}
    nproc, nnodes = scale["nproc_per_node"], scale["nnodes"]
    replicate = nnodes if section.sharding == "hybrid" and nnodes > 1 else 1
    loading = run.model.weights == "pretrained" and nproc > 1 and not (run.lora and run.lora.quantize != "none")
    config = {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "reshard_after_forward": section.reshard_after_forward,
        "cpu_offload": section.offload,
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_ram_efficient_loading": loading,
        "activation_checkpointing": False,
    }
    reasons = {
        "fsdp_sharding": (
            f"hybrid: sharded within each node's {nproc} ranks, replicated over {nnodes} nodes"
            if replicate > 1
            else "full: every rank holds 1/world of the states"
            + (" (hybrid on one node is full sharding)" if section.sharding == "hybrid" else "")
        ),
        "fsdp_state_dict": "checkpoints sharded (each rank writes its shard: resumable, no gather on rank 0); "
        "the final model gathered whole, so from_pretrained loads it",
        "fsdp_cpu_ram_efficient_loading": (
            "on: each rank's shards are filled from rank 0's weights when accelerate shards the model (the others are "
            "moved to the meta device); transformers 5.25 still reads the checkpoint on every rank at load"
            if loading
            else "off: "
            + (
                "random weights are built from the seed on each rank"
                if run.model.weights != "pretrained"
                else "one rank per node"
                if nproc <= 1
                else "bitsandbytes' quantized weights load on every rank"
            )
        ),
    }
    return {"fsdp": config, "fsdp_source": FSDP_GENERATED, "fsdp_replicate": replicate}, reasons


def _schedule(run: RunConfig, features: dict[str, Any] | None, rows: int | None, global_batch: int) -> dict[str, Any]:
    """The optimizer's schedule, how long it runs, and when it logs, saves and evaluates."""
    t = run.training
    steps = total_steps(run, rows, global_batch)
    warmup_args, warmup_steps = warmup(run, features, steps)
    return {
        "learning_rate": t.learning_rate,
        "lr_scheduler": t.lr_scheduler,
        "lr_scheduler_kwargs": lr_scheduler_kwargs(run, features),
        "warmup": warmup_args,
        "warmup_steps": warmup_steps,
        "epochs": t.epochs,
        "max_steps": t.max_steps,
        "total_steps": steps,
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        "checkpointing": t.gradient_checkpointing is True,
        "checkpointing_arg": (features or {}).get("checkpointing_arg") or "gradient_checkpointing",
        "checkpointing_reentrant": False,
        "evaluation": evaluation(run),
        "seed": t.seed,
        "logging_steps": t.logging_steps,
        "save_steps": t.save_steps,
        "save_total_limit": t.save_total_limit,
        "eval_steps": eval_interval(run),
    }


def _meeting(
    run: RunConfig, rendezvous: dict[str, Any] | None, slurm: dict[str, Any] | None, nnodes: int
) -> tuple[dict[str, Any], dict[str, str]]:
    """Where the nodes meet and this node's rank there, how long they wait, and how a stop is given its grace;
    with the reason of each decision."""
    port, why_port = master_port(run, rendezvous, slurm)
    rank, why_rank = node_rank(run, rendezvous, slurm, nnodes)
    addr, why_addr = master_addr(run, slurm)
    grace, why_grace = stop_grace(run, slurm)
    fields = {
        "node_rank": rank,
        "master_addr": addr,
        "master_port": port,
        "join_timeout_s": run.launch.join_timeout_s,
        "stop_grace_s": grace,
        "max_restarts": run.launch.max_restarts,
    }
    reasons = {"master_port": why_port, "node_rank": why_rank, "master_addr": why_addr, "stop_grace_s": why_grace}
    return fields, reasons


def _model(
    run: RunConfig, facts: Any, chosen: str, zero: dict[str, Any], ddp: bool, moe: bool, fsdp: bool
) -> tuple[dict[str, Any], str]:
    """The model loaded, its dtype and adapters, and whether DDP looks for parameters a step leaves unused (with
    why)."""
    lora = lora_settings(run, chosen, 3 if fsdp else zero["zero_stage"], facts.get("lora_modules"))
    find_unused, why_unused = find_unused_parameters(ddp, moe, facts.get("unused_parameters") if ddp else None)
    fields = {
        "model_path": run.model.path,
        "tokenizer_path": run.model.tokenizer or run.model.path,
        "weights": run.model.weights,
        "trust_remote_code": run.model.trust_remote_code,
        "load_dtype": load_dtype(chosen, zero["deepspeed"], lora is not None),
        "lora": lora,
        "ddp_find_unused_parameters": find_unused,
    }
    return fields, why_unused


def _text(
    run: RunConfig, facts: Any, data: dict[str, Any], packed: bool, features: dict[str, Any] | None, template
) -> dict[str, Any]:
    """The data trained on: its files, shape and rows, how they are packed or grouped, the chat template and the
    loss's tokens."""
    train = data.get("train") or {}
    found = facts.get("data_source") or {}
    return {
        "train_files": tuple(found.get("train") or run.data.train),
        "eval_files": tuple(found.get("eval") or run.data.eval),
        "data_source": hub_source(found),
        "streaming": run.data.streaming,
        "eval_fraction": run.data.eval_fraction,
        "data_shape": train.get("shape"),
        "data_format": train.get("format"),
        "data_rows": train.get("rows"),
        "max_length": run.data.max_length,
        "packing": packed,
        # an IterableDataset has no sampler to group by length (transformers 5.x: group_by_length needs a length)
        "length_grouping": {} if packed or run.data.streaming else length_grouping(features),
        "assistant_only_loss": assistant_only_loss(train.get("shape"), facts.get("chat_template")),
        "chat_template": template,
        "repair_token_ids": repair_ids(facts.get("token_rows")) if run.model.repair_untrained_tokens else (),
    }


def hub_source(found: dict[str, Any]) -> dict[str, Any] | None:
    """What a hub dataset is (None: data files): the folder or id, subset, split, evaluation split and revision
    the files were resolved from (facts.hub_data), which the run records and `diff` compares."""
    if found.get("kind", "files") == "files":
        return None
    return {k: found.get(k) for k in ("kind", "name", "subset", "split", "eval_split", "revision")}


def _watch(run: RunConfig, world_size: int, ds: dict[str, Any] | None) -> dict[str, Any]:
    """What checks the launch and watches the run, and where it records."""
    return {
        "distributed_check": run.launch.distributed_check and world_size > 1,
        "rehearse": run.launch.rehearse and (world_size > 1 or ds is not None or run.fsdp is not None),
        "distributed_check_bound_s": min(float(run.watch.hang_timeout_s), DISTRIBUTED_CHECK_MAX_S),
        "hang_timeout_s": float(run.watch.hang_timeout_s),
        "ddp_timeout_s": ddp_timeout(run.watch.hang_timeout_s),
        "on_nan": run.watch.on_nan,
        "max_skips": run.watch.max_skips,
        "loss_spike_factor": run.watch.loss_spike_factor,
        "report_to": run.report.to,
        "output_dir": run.training.output_dir,
    }


def with_checkpointing(plan: Plan, run: RunConfig, gpus: dict[str, Any] | None, facts: Any) -> Plan:
    """Activation checkpointing as asked, or "auto": off where the memory plan fits without it (recomputing the
    forward costs a third more compute), on where it does not or the fit cannot be told. Without GPUs there
    is no device memory to size for: off."""
    asked = run.training.gradient_checkpointing
    if asked != "auto":
        on, why = bool(asked), "[training].gradient_checkpointing in the run config"
    elif not devices(gpus):
        on, why = False, "auto: no GPU to size it for, off"
    elif not (model_shape := facts.get("model_shape")) or "error" in model_shape:
        on, why = True, "auto: the model's size is unknown, on to be safe"
    else:
        memory = smallest_memory(gpus)
        without = memory_fit(dataclasses.replace(plan, checkpointing=False), Shape(**model_shape), memory).current
        peak = f"{without.estimate.gpu_peak / 2**30:.1f} GiB of {memory / 2**30:.0f}"
        on, why = (
            (False, f"auto: off, the plan fits without it ({peak})")
            if without.fits
            else (True, f"auto: on, without it the plan needs {peak}")
        )
    fsdp = {**plan.fsdp, "activation_checkpointing": on} if plan.fsdp_source == FSDP_GENERATED else plan.fsdp
    return dataclasses.replace(
        plan,
        fsdp=fsdp,
        checkpointing=on,
        checkpointing_reentrant=plan.lora is not None and plan.zero_stage == 3 and on,
        reasons={**plan.reasons, "checkpointing": why},
    )


def packing(run: RunConfig, attn: str, probe: dict[str, Any] | None) -> tuple[bool, str]:
    """Packing as asked, or "auto": on only where a varlen kernel (flash-attn) attends within each packed sample
    and the probe proved them isolated. sdpa and eager keep packed samples apart with a block-diagonal mask
    over the whole packed row, so a row costs max_length squared whatever it holds: measured on the CPU, TRL's
    packing ran at 0.9x its unpacked defaults at 256 tokens and 0.39x at 1024. Unpacked rows are batched by
    length instead (length_grouping), which removes most of the padding."""
    asked = run.training.packing
    if asked != "auto":
        return bool(asked), "[training].packing in the run config"
    if not attn.startswith("flash"):
        return False, f"auto: {attn} has no varlen kernel, so one sample per row, batched by length"
    if not (probe or {}).get("isolated"):
        return False, f"auto: packed samples were not proven isolated with {attn}"
    return True, f"auto: {attn}'s varlen kernels keep packed samples apart (proven by the probe)"


def length_grouping(features: dict[str, Any] | None) -> dict[str, Any]:
    """Batches of rows of like length (transformers' LengthGroupedSampler), as the installed version asks it."""
    if (features or {}).get("length_grouping_arg", "train_sampling_strategy") == "train_sampling_strategy":
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True}  # transformers 4.x


def for_launch(
    plan: Plan,
    rehearsal: bool = False,
    drill: dict[str, Any] | None = None,
    plugins: bool = True,
    forced: bool = False,
    rehearse: bool = True,
) -> Plan:
    """The plan one launch follows: as resolved, or its rehearsal (`--smoke`): the same launcher, DeepSpeed
    config, data path and scheduler for a few steps, in a run directory of its own, with a save and a resume.
    Forced past an unreachable global batch (`--force`), the run takes the nearest reachable one below it.
    A drill runs in a directory of its own (RUN_DIR/drill-KIND), so it never mixes with the run's checkpoints."""
    plan = dataclasses.replace(
        plan, drill=drill, plugins=plugins, rehearse=plan.rehearse and rehearse and not rehearsal and drill is None
    )
    if drill is not None:
        plan = dataclasses.replace(plan, output_dir=str(Path(plan.output_dir) / f"drill-{drill['kind']}"))
    if forced and plan.gradient_accumulation_steps is None:
        step = plan.per_device_batch_size * plan.world_size
        accum = max(1, plan.global_batch_size // step)
        plan = dataclasses.replace(
            plan,
            gradient_accumulation_steps=accum,
            global_batch_size=accum * step,
            nearest_global_batch_sizes=(),
            reasons={
                **plan.reasons,
                "global_batch_size": f"forced: {accum * step}, the nearest reachable global batch "
                f"to the {plan.global_batch_size} asked",
            },
        )
    if not rehearsal:
        return plan
    return dataclasses.replace(
        plan,
        rehearsal=True,
        rehearse=False,
        max_steps=REHEARSAL_STEPS,
        total_steps=REHEARSAL_STEPS,
        save_steps=REHEARSAL_SAVE_AT,
        logging_steps=1,
        data_limit=REHEARSAL_ROWS,
        gradient_accumulation_steps=1,
        global_batch_size=plan.per_device_batch_size * plan.world_size,
        output_dir=str(Path(plan.output_dir) / layout.REHEARSAL),
    )


def memory_fit(plan: Plan, shape: Shape, gpu_memory: int) -> Fit:
    """The plan's setting term by term against GPUs of `gpu_memory` bytes, and the fastest that fits."""
    from sftdoctor.run.memory import adapters

    lora = adapters(plan.lora, shape) if plan.lora is not None else None
    run = Workload(
        shape, plan.world_size, plan.nproc_per_node, plan.max_length, plan.attn_implementation, plan.precision, lora
    )
    fsdp = plan.fsdp or {}
    current = Setting(
        plan.zero_stage,
        plan.offload_optimizer or bool(flag(fsdp, "cpu_offload")),
        plan.checkpointing,
        plan.per_device_batch_size,
        plan.liger_kernel,
        plan.lora["quantize"] if plan.lora is not None else None,
        fsdp=plan.fsdp is not None,
        reshard_after_forward=flag(fsdp, "reshard_after_forward", True) is not False,
    )
    return fit(run, current, plan.global_batch_size, gpu_memory, plan.liger_available)
