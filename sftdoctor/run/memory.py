"""Predicted peak memory of one training rank, term by term, each with its formula and source.

Model states follow DeepSpeed's own estimators (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`, DeepSpeed 0.10-0.19.8), split into the parts they add up:
mixed precision keeps 16-bit weights (2 bytes/param), 16-bit and fp32 gradients (2 + 4), an fp32
master copy (4) and AdamW's two fp32 moments (4 + 4) — ZeRO (Rajbhandari et al., 2020) partitions
the last ones over the ranks: stage 1 the optimizer states, stage 2 also the gradients, stage 3 also
the weights (and gathers one layer at a time in fp32: 4 bytes x the largest layer).

Activations count the bytes autograd saves for the backward pass, the accounting of Korthikanti et
al., 2022 ("Reducing Activation Recomputation in Large Transformer Models", section 4), redone for
the transformers 5.24 Llama/Qwen2 decoder layer as measured on the installed stack (see
activation_bytes_per_token); with non-reentrant checkpointing a layer keeps only its input, and
one layer's activations come back during its backward.

LoRA (peft) freezes the base: its weights have no gradient, no optimizer state and no fp32 master copy;
only the adapters (and modules_to_save) train (lora_states). The frozen base sits in the run's 16-bit dtype
or, with QLoRA, in bitsandbytes' 4-bit NF4 or 8-bit format (frozen_base), and its frozen layers save less for
the backward than trained ones (lora_activation_bytes_per_token).

PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`, torch 2.13, as accelerate 1.16's fsdp2_prepare_model wraps a
model) is the other sharding engine (fsdp_states): each rank keeps its shard of the parameters in their stored dtype
(fp32 for trained ones), of their gradients and of AdamW's moments, plus the units it has all-gathered in the compute
dtype (fsdp_in_flight); under the Trainer's gradient accumulation it keeps every unsharded gradient until the last
micro-batch (fsdp_gradients).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sftdoctor.run.lora import adapter_parameters, targeted
from sftdoctor.run.shape import Shape

GIB = 2**30
CUDA_CONTEXT = 1 * GIB  # CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers: ~0.5-1 GiB on A100/H100
FRAGMENTATION = 0.10  # the caching allocator's unusable share on top of what is live (PyTorch 2.x)
ADAM_BUFFER = 1.5  # DeepSpeed's additional_buffer_factor for host memory with offload


@dataclass(frozen=True)
class Setting:
    """One way to run: what the candidate table varies."""

    zero_stage: int
    offload_optimizer: bool  # DeepSpeed's offload_optimizer; under FSDP2 CPUOffloadPolicy (weights, gradients, moments)
    checkpointing: bool
    micro_batch: int
    liger: bool
    quantize: str | None = None  # LoRA's base: "none" (16-bit), "4bit" or "8bit"; None: a full fine-tune
    fsdp: bool = False  # PyTorch FSDP2 instead of DeepSpeed (zero_stage is then 0)
    reshard_after_forward: bool = True  # FSDP2: free each gathered unit after its forward (False: ZeRO-2-like)


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    formula: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Estimate:
    setting: Setting
    gpu: list[Term] = field(default_factory=list)  # per GPU
    host: list[Term] = field(default_factory=list)  # per node

    @property
    def gpu_peak(self) -> int:
        return sum(t.bytes for t in self.gpu)

    @property
    def host_peak(self) -> int:
        return sum(t.bytes for t in self.host)


@dataclass(frozen=True)
class Adapters:
    """LoRA's adapters, as far as memory goes (from Plan.lora)."""

    trainable: int  # adapter + modules_to_save parameters
    r: int
    dropout: float
    wrapped: tuple[str, ...]  # the decoder layer's linear layers the adapters wrap (Llama names: q_proj, ...)


@dataclass(frozen=True)
class Workload:
    """What does not vary between candidates."""

    shape: Shape
    world: int  # ranks in all
    per_node: int  # ranks on one node
    seq_len: int  # tokens per row (max_length; packed rows are full)
    attention: str  # flash_attention_2 | sdpa | eager
    precision: str  # bf16 | fp16 | fp32
    lora: Adapters | None = None  # None: a full fine-tune


def model_states(shape: Shape, s: Setting, world: int) -> list[Term]:
    """Weights, gradients and optimizer states per GPU; the sum equals DeepSpeed's estimator."""
    p = shape.parameters
    if s.zero_stage == 0:  # DDP with autocast: fp32 weights, gradients, Adam moments; nothing partitioned
        return [
            Term("weights", 4 * p, "4 B x params (fp32)"),
            Term("gradients", 4 * p, "4 B x params (fp32)"),
            Term("optimizer states", 8 * p, "8 B x params (AdamW moments, fp32)"),
        ]
    return gathered_layer(shape, s) + deepspeed_states(p, s, world)


def gathered_layer(shape: Shape, s: Setting) -> list[Term]:
    if s.zero_stage != 3:
        return []
    return [Term("gathered layer", 4 * shape.largest_layer, "4 B x the largest layer (ZeRO-3 gathers it)")]


def deepspeed_states(p: int, s: Setting, world: int, prefix: str = "", what: str = "params") -> list[Term]:
    """DeepSpeed's mixed precision over the `p` parameters it trains: 16-bit weights and gradients, fp32
    gradients, master copy and AdamW moments, partitioned by the ZeRO stage (1 to 3)."""

    def term(name: str, per_param: int, formula: str, partitioned: bool) -> Term:
        share, per = (world, " / world") if partitioned else (1, "")
        return Term(prefix + name, per_param * p // share, f"{per_param} B x {what}{per} {formula}")

    if s.zero_stage == 1:
        return [
            term("weights", 2, "(16-bit)", False),
            term("gradients", 2, "(16-bit)", False),
            term("optimizer states", 16, "(fp32 master, moments, fp32 grads)", True),
        ]
    if s.zero_stage == 2:
        if s.offload_optimizer:
            return [term("weights", 2, "(16-bit); gradients and optimizer on the host", False)]
        return [
            term("weights", 2, "(16-bit)", False),
            term("gradients", 6, "(16-bit and fp32, partitioned)", True),
            term("optimizer states", 12, "(fp32 master and moments)", True),
        ]
    weights = term("weights", 2, "(16-bit partition)", True)
    if s.offload_optimizer:
        return [weights]
    return [
        weights,
        term("gradients", 4, "(partitioned)", True),
        term("optimizer states", 12, "(fp32 master and moments)", True),
    ]


# ---------------------------------------------------------------- LoRA and QLoRA

# A Llama-like decoder layer's linear layers: name -> (block, the Shape's input width, its output width).
LLAMA_LINEAR = {
    "q_proj": ("self_attn", "hidden", "q_size"),
    "k_proj": ("self_attn", "hidden", "kv_size"),
    "v_proj": ("self_attn", "hidden", "kv_size"),
    "o_proj": ("self_attn", "q_size", "hidden"),
    "gate_proj": ("mlp", "hidden", "intermediate"),
    "up_proj": ("mlp", "hidden", "intermediate"),
    "down_proj": ("mlp", "intermediate", "hidden"),
}
# bitsandbytes NF4 with double quantisation, per weight: a 4-bit code, an 8-bit absmax per block of 64, and an
# fp32 constant per 256 of those absmax (QLoRA, Dettmers et al. 2023, section 3: 0.127 bit of constants).
NF4_BYTES = 1 / 2 + 1 / 64 + 4 / (64 * 256)
DROPOUT_MASK = 1  # bytes per element CUDA's fused dropout keeps for the backward (a bool mask)


def quantized(s: Setting) -> bool:
    """A LoRA base in 4 or 8 bits (a quantized base also dequantizes its weights for every matmul: slower)."""
    return s.quantize not in (None, "none")


def llama_linear(shape: Shape) -> dict[str, Any]:
    """The model's linear layers in the lora_modules fact's form, for Llama/Qwen2/Mistral-named decoders: what
    peft's target_modules match when the fact (the meta-device listing) is not there."""
    linear = [
        {
            "pattern": f"model.layers.*.{block}.{name}",
            "count": shape.layers,
            "in": getattr(shape, a),
            "out": getattr(shape, b),
            "output": False,
        }
        for name, (block, a, b) in LLAMA_LINEAR.items()
    ]
    linear.append({"pattern": "lm_head", "count": 1, "in": shape.hidden, "out": shape.vocab, "output": True})
    embedding = shape.vocab * shape.hidden
    return {"linear": linear, "modules": {"embed_tokens": embedding, "lm_head": embedding}}


def adapters(lora: dict[str, Any], shape: Shape) -> Adapters:
    """Plan.lora as the memory model reads it: the exact trainable count decide() made from the model's own
    layers, or else the count on the Shape's Llama-named layers."""
    listing = llama_linear(shape)
    trainable = lora.get("trainable_params")
    if trainable is None:
        trainable = adapter_parameters(listing, lora)
    wrapped = tuple(e["pattern"].rsplit(".", 1)[-1] for e in targeted(listing, lora["target_modules"]))
    return Adapters(trainable, lora["r"], lora["dropout"], wrapped)


def quantizable(shape: Shape) -> int:
    """Weights of the decoder layers' linear layers: what bitsandbytes quantizes (transformers leaves the LM head,
    the embeddings, the norms and the biases in the load dtype). Exact for Llama-like shapes; at most all but
    the embeddings for others."""
    linear = sum(e["count"] * e["in"] * e["out"] for e in llama_linear(shape)["linear"] if not e["output"])
    return max(0, min(linear, shape.parameters - shape.vocab * shape.hidden))


def quantized_rows(shape: Shape) -> int:
    """Output rows of the decoder layers' linear layers: LLM.int8() keeps an fp32 scale for each."""
    return shape.layers * sum(getattr(shape, b) for _, _, b in LLAMA_LINEAR.values())


def frozen_base(run: Workload, s: Setting) -> list[Term]:
    """The base's weights: no gradient, no optimizer state, no fp32 master copy. ZeRO-3 partitions them too."""
    shape, p = run.shape, run.shape.parameters
    share, per = (run.world, " / world") if s.zero_stage == 3 else (1, "")
    if not quantized(s):
        b = dtype_bytes(run.precision)
        return [Term("frozen base", b * p // share, f"{b} B x base params{per} (the run's dtype; frozen)")]
    linear = quantizable(shape)
    if s.quantize == "4bit":
        base = Term(
            "frozen base, 4-bit",
            int(linear * NF4_BYTES) // share,
            f"(1/2 + 1/64 + 4/(64 x 256)) B x linear weights{per}: bitsandbytes NF4 with double quantisation "
            "(4-bit codes; absmax per 64-weight block in 8 bits, fp32 absmax per 256 such blocks: QLoRA, "
            "Dettmers et al. 2023, section 3, 0.127 bit/param of constants)",
        )
    else:
        base = Term(
            "frozen base, 8-bit",
            (linear + 4 * quantized_rows(shape)) // share,
            f"(1 B x linear weights + 4 B x their output rows){per}: LLM.int8() weights and fp32 row scales "
            "(approximate: outlier columns are split off in 16 bits while each layer runs)",
        )
    # peft's prepare_model_for_kbit_training (sftdoctor's QLoRA load) casts every 16-bit parameter left to fp32;
    # DeepSpeed casts them back to the 16-bit dtype it trains in.
    b = 4 if s.zero_stage == 0 else 2
    why = "fp32: prepare_model_for_kbit_training" if b == 4 else "16-bit: DeepSpeed's cast"
    rest = Term(
        "frozen embeddings, norms",
        b * (p - linear) // share,
        f"{b} B x the other base params{per} ({why}; not quantized)",
    )
    return [base, rest]


def adapter_states(run: Workload, s: Setting) -> list[Term]:
    """The trained parameters' weights, gradients and AdamW moments. Without DeepSpeed, peft keeps LoRA's
    adapters in fp32 (autocast_adapter_dtype, peft 0.12+): 4 + 4 + 8 B; for QLoRA TRL 1.16 casts them to bf16
    (the QLoRA paper's recipe), and AdamW's moments follow: 2 + 2 + 4 B. DeepSpeed casts them to its 16-bit dtype
    and keeps their fp32 master copy: its accounting over the trainable params alone."""
    t = run.lora.trainable
    if s.zero_stage > 0:
        return deepspeed_states(t, s, run.world, "adapter ", "trainable params")
    b, why = (2, "bf16: TRL casts QLoRA's adapters") if quantized(s) else (4, "fp32: peft's autocast_adapter_dtype")
    return [
        Term("adapter weights", b * t, f"{b} B x trainable params ({why})"),
        Term("adapter gradients", b * t, f"{b} B x trainable params"),
        Term("adapter optimizer states", 2 * b * t, f"{2 * b} B x trainable params (AdamW moments)"),
    ]


def lora_states(run: Workload, s: Setting) -> list[Term]:
    return gathered_layer(run.shape, s) + frozen_base(run, s) + adapter_states(run, s)


def fp32_adapters_under_autocast(run: Workload, s: Setting) -> bool:
    """Without DeepSpeed a 16-bit run is autocast over peft's fp32 adapters (QLoRA's are cast to bf16 by TRL,
    DeepSpeed casts every adapter to its 16-bit dtype; FSDP2 casts them with the rest of their unit for compute)."""
    return s.zero_stage == 0 and not s.fsdp and run.precision != "fp32" and not quantized(s)


def load_bytes(s: Setting, precision: str) -> int:
    """Bytes per parameter as the weights load: 16-bit under DeepSpeed in bf16/fp16 (it holds the fp32 master
    copy), else fp32 (run.resolve.load_dtype decides the same for the run itself)."""
    return 2 if s.zero_stage > 0 and precision != "fp32" else 4


def host_memory(
    shape: Shape, s: Setting, world: int, per_node: int, precision: str = "fp32", lora: Adapters | None = None
) -> list[Term]:
    """Host RAM per node, as DeepSpeed's estimators count it (`cpu_mem`, additional_buffer_factor 1.5): every
    rank loading the model (load_bytes x params x ranks per node: 4 for fp32, 2 when DeepSpeed holds the fp32
    master copy and 16-bit weights load in 16 bits), or the offloaded optimizer. ZeRO-3 loads under
    `zero.Init` (sftdoctor's recipe creates the DeepSpeed config before the model), so each rank keeps only
    its partition: load_bytes x params / world x ranks per node."""
    if lora is not None:
        return lora_host_memory(shape, s, world, per_node, precision, lora)
    p, nodes, b = shape.parameters, max(world // per_node, 1), load_bytes(s, precision)
    if s.offload_optimizer and s.zero_stage == 2:
        factor, formula = max(4 * world, 16), "max(4 x world, 16) B x params"
    elif s.offload_optimizer and s.zero_stage == 3:
        factor, formula = max(4 * per_node, 16 / nodes), "max(4 x ranks per node, 16 / nodes) B x params"
    elif s.zero_stage == 3:
        factor = b * per_node / world
        formula = f"{b} B x params / world x ranks per node (partitioned at load by zero.Init)"
    else:
        factor, formula = b * per_node, f"{b} B x params x ranks per node (each rank loads the model)"
    return [Term("host RAM", int(p * factor * ADAM_BUFFER), f"{formula} x {ADAM_BUFFER}")]


def lora_host_memory(shape: Shape, s: Setting, world: int, per_node: int, precision: str, lora: Adapters) -> list[Term]:
    """With LoRA every rank loads the base in the run's dtype (resolve.load_dtype: 16 bits in bf16/fp16; ZeRO-3
    partitions it at load), or holds its share of the adapters' offloaded optimizer (16 B per trainable param,
    as DeepSpeed counts an offloaded optimizer), whichever is more, as DeepSpeed's estimators take the larger."""
    b, nodes = dtype_bytes(precision), max(world // per_node, 1)
    if s.zero_stage == 3:
        load, formula = (
            b * shape.parameters * per_node / world,
            f"{b} B x base params / world x ranks per node (zero.Init)",
        )
    else:
        load, formula = (
            b * shape.parameters * per_node,
            f"{b} B x base params x ranks per node (each rank loads the base)",
        )
    if s.offload_optimizer:
        load, formula = max(load, 16 * lora.trainable / nodes), f"max({formula}, 16 B x trainable params / nodes)"
    return [Term("host RAM", int(load * ADAM_BUFFER), f"{formula} x {ADAM_BUFFER}")]


# ---------------------------------------------------------------- PyTorch FSDP2
# accelerate 1.16's fsdp2_prepare_model (accelerate/utils/fsdp_utils.py:740-935) calls torch 2.13's `fully_shard` on
# every decoder layer (transformer auto-wrap on _no_split_modules), on the input embedding (when untied), on a tail of
# the final norm and the LM head (with the embedding when tied) with reshard_after_forward=False, then on the root. A
# unit's parameters are all-gathered whole in MixedPrecisionPolicy's param_dtype, which accelerate sets to the run's
# 16-bit dtype with reduce_dtype the same (accelerate/utils/dataclasses.py:2008-2013; fp32 runs keep fp32).


def fsdp_layer(shape: Shape) -> int:
    """Parameters of one decoder layer, FSDP2's usual unit: exact for Llama/Qwen2-like shapes (the projections, the
    two norms, Qwen2's q/k/v biases), checked against the count; else the non-embedding parameters per layer."""
    linear = sum(getattr(shape, a) * getattr(shape, b) for _, a, b in LLAMA_LINEAR.values())
    layer = linear + 2 * shape.hidden + (shape.q_size + 2 * shape.kv_size if shape.model_type == "qwen2" else 0)
    rest = shape.parameters - shape.layers * layer - shape.hidden - shape.vocab * shape.hidden
    if rest in (0, shape.vocab * shape.hidden):  # tied or untied LM head
        return layer
    return max(shape.parameters - shape.vocab * shape.hidden, 0) // max(shape.layers, 1)


def fsdp_tail(shape: Shape) -> int:
    """The tail unit: the final norm and the LM head (vocab x hidden, the embedding's weight when tied)."""
    return shape.vocab * shape.hidden + shape.hidden


def fsdp_trained(run: Workload) -> int:
    return run.shape.parameters if run.lora is None else run.lora.trainable


def fsdp_in_flight(run: Workload, s: Setting) -> list[Term]:
    """What FSDP2 holds unsharded beside the shards, in the compute dtype b, at the backward's worst moment:

    reshard_after_forward: the layer being computed, the next one gathered ahead (FSDP2's default explicit backward
    prefetch, _fsdp_param_group.py `_backward_prefetch`), the reduce-scatter input of the unit before it (kept until
    the next unit's reduce-scatter: reduce_scatter_max_input_buffers = 1), which may be the tail, and the layer's fresh
    unsharded gradients before they are reduce-scattered (or added to the accumulated ones). The tail's own backward
    holds less beyond what logits counts (its gradient is the head's fp32 one there); forward holds less too: the
    current unit, its all-gather output and the previous one's (`AllGatherState`, freed after the next copy-out).
    Without reshard_after_forward every unit stays gathered from its forward to its backward (b x params), with a
    layer's fresh gradients and the reduce-scatter input on top. CPU offload changes none of this: the all-gather and
    the reduce-scatter run on the GPU. Measured on two CPU ranks in tests/run/test_memory_fsdp.py."""
    b, layer = dtype_bytes(run.precision), fsdp_layer(run.shape)
    if run.lora is not None:  # the adapters travel with their layer, cast to the compute dtype as well
        layer += run.lora.trainable // max(run.shape.layers, 1)
    unit = max(layer, fsdp_tail(run.shape))
    if s.reshard_after_forward:
        return [
            Term(
                "gathered units",
                b * (3 * layer + unit),
                f"{b} B x (3 x decoder layer + largest unit): the layer computing, its fresh unsharded gradients, the "
                "next one gathered ahead (backward prefetch), the previous unit's reduce-scatter input",
            )
        ]
    p = run.shape.parameters if run.lora is None else run.shape.parameters + run.lora.trainable
    return [
        Term(
            "gathered units",
            b * (p + layer + unit),
            f"{b} B x (params + decoder layer + largest unit): no reshard after forward, every unit stays gathered "
            "until its backward; a layer's fresh unsharded gradients, the previous unit's reduce-scatter input",
        )
    ]


def fsdp_gradients(run: Workload, s: Setting, accumulating: bool) -> list[Term]:
    """FSDP2 reduce-scatters each unit's gradients in reduce_dtype and keeps the shard in the parameter's own dtype
    (`_to_dtype_if_needed(reduce_output, orig_dtype)` in _fsdp_collectives.py foreach_reduce): 4 B x trained params /
    world for fp32 parameters, on the host under CPU offload. Under gradient accumulation the Trainer runs every
    micro-batch but the last in accelerate's no_sync (transformers 5.25 trainer.py:1941-1952), which for FSDP2 is
    set_requires_gradient_sync(False): no reduce-scatter, each unsharded gradient stays on the GPU in the compute dtype
    (b x trained params) until the last micro-batch's backward reduce-scatters it unit by unit into the shards."""
    t, world, b = fsdp_trained(run), run.world, dtype_bytes(run.precision)
    g = 2 if run.lora is not None and quantized(s) else 4  # QLoRA's adapters stay bf16 (no fp32 upcast with Params4bit)
    what = "params" if run.lora is None else "trainable params"
    sharded = 0 if s.offload_optimizer else g * t // world
    if accumulating and b * t >= sharded:
        return [
            Term(
                "gradients, unsharded",
                b * t,
                f"{b} B x {what}: accumulated unsharded under no_sync until the last micro-batch reduce-scatters them "
                "(the shards replace them unit by unit)",
            )
        ]
    where = "on the host (CPU offload)" if s.offload_optimizer else f"{g} B x {what} / world"
    return [Term("gradients, sharded", sharded, f"{where} (reduced, kept in the parameters' dtype)")]


def fsdp_states(run: Workload, s: Setting, accumulating: bool) -> list[Term]:
    """Per rank: the parameter shards in their stored dtype, the gradient shards, AdamW's moments (8 B, fp32 DTensors
    like the shards), and what is gathered. A full fine-tune loads fp32 weights (resolve.load_dtype) and accelerate
    upcasts every trainable parameter to fp32 before sharding (fsdp_utils.py:799-806): 4 B. LoRA's frozen base stays in
    its 16-bit load dtype (only trainable parameters are upcast), its adapters become fp32; QLoRA's 4-bit weights are
    not sharded (fsdp_utils.py:777-783: non-floating Params4bit are ignored; sftdoctor sets bnb_4bit_quant_storage only
    for ZeRO-3) nor upcast. With CPU offload (CPUOffloadPolicy) the shards, gradients and moments live on the host.
    FSDP2 pads each tensor's first dimension to a multiple of the world size (not counted: under world x 4 B a row)."""
    t, world = fsdp_trained(run), run.world
    terms: list[Term] = []
    if run.lora is None:
        w, what = 4, "params"
        if not s.offload_optimizer:
            terms.append(Term("weights, sharded", 4 * t // world, "4 B x params / world (fp32 shards)"))
    else:
        terms += fsdp_frozen_base(run, s)
        w, what = (2, "trainable params") if quantized(s) else (4, "trainable params")
        if not s.offload_optimizer:
            terms.append(Term("adapter weights, sharded", w * t // world, f"{w} B x {what} / world"))
    terms += fsdp_gradients(run, s, accumulating)
    if not s.offload_optimizer:
        terms.append(Term("optimizer states", 2 * w * t // world, f"{2 * w} B x {what} / world (AdamW moments)"))
    return terms + fsdp_in_flight(run, s)


def fsdp_frozen_base(run: Workload, s: Setting) -> list[Term]:
    """LoRA's frozen base under FSDP2: sharded in its 16-bit dtype (on the host under CPU offload); a 4- or 8-bit
    one whole on every rank, the rest (embeddings, norms, fp32 from prepare_model_for_kbit_training) sharded."""
    p, world, where = run.shape.parameters, run.world, " on the host" if s.offload_optimizer else ""
    if not quantized(s):
        b = dtype_bytes(run.precision)
        return [] if where else [Term("frozen base, sharded", b * p // world, f"{b} B x base params / world")]
    base = frozen_base(replace(run, world=1), replace(s, zero_stage=0))
    linear = quantizable(run.shape)
    rest = Term("frozen embeddings, norms", 4 * (p - linear) // world, "4 B x the other base params / world (fp32)")
    return [base[0]] + ([] if where else [rest])


def fsdp_host_memory(run: Workload, s: Setting) -> list[Term]:
    """Host RAM per node under FSDP2: the load, then (CPU offload) the shards. Every rank loads the whole model (4 B x
    params for a full fine-tune, the base in its 16-bit dtype for LoRA), cpu_ram_efficient_loading or not: transformers
    5.25's from_pretrained reads the checkpoint on every rank (modeling_utils.py:4930-4966 special-cases only the
    non-persistent buffers of the other ranks); accelerate 1.16 then moves the non-main ranks' copies to the meta
    device before its fp32 upcast (fsdp_utils.py:793-797) and broadcasts rank 0's (fsdp2_load_full_state_dict), which
    saves the upcast copies, not the load. With CPU offload each rank keeps its shards of weights, gradients and
    moments there in pinned memory (16 B x params / world per rank; under LoRA those of the adapters and the frozen
    base's 16-bit shards), x 1.5: CUDA's caching host allocator rounds each pinned tensor up to a power of two.
    Whichever is more: the load is over before the optimizer's states exist."""
    p, per_node = run.shape.parameters, run.per_node
    b = 4 if run.lora is None else dtype_bytes(run.precision)
    load = Term("host RAM", b * p * per_node, f"{b} B x params x ranks per node (each rank loads the model)")
    if not s.offload_optimizer:
        return [load]
    t = fsdp_trained(run)
    states = 16 * t + (0 if run.lora is None else dtype_bytes(run.precision) * p)
    formula = "16 B x params" if run.lora is None else f"(16 B x trainable + {dtype_bytes(run.precision)} B x base)"
    offloaded = int(states / run.world * per_node * ADAM_BUFFER)
    if offloaded >= load.bytes:
        return [
            Term("host RAM", offloaded, f"{formula} / world x ranks per node (CPU offload, pinned) x {ADAM_BUFFER}")
        ]
    return [load]


# The dtypes a checkpoint may be saved in (config.json's "dtype"/"torch_dtype") that a plan can price: the run
# loads them cast to its own precision (resolve.load_dtype), so each weight costs dtype_bytes(precision) whatever
# the file holds. Not an 8-bit float (float8_e4m3fn, float8_e5m2...): those weights mean nothing without the
# scales beside them, so an fp8 checkpoint declares them in quantization_config and keeps a 16-bit dtype here
# (DeepSeek-V3's config.json: "torch_dtype": "bfloat16", quantization_config {"quant_method": "fp8", ...}).
SAVED_DTYPES = ("bfloat16", "float16", "float32", "float64")


def dtype_bytes(precision: str) -> int:
    """Bytes per element of the training dtype: fp32, or 16-bit (bf16/fp16)."""
    return 4 if precision == "fp32" else 2


def activation_bytes_per_token(shape: Shape, precision: str) -> int:
    """Bytes autograd saves in one decoder layer per token, with b the training dtype's size:

        8 h + b (4 h + 2 q + 2 kv + 4 I) + 4 heads + 8

    8 h + 8: the two RMSNorms upcast to fp32 (their fp32 input and 1/rms); b x 4 h: the normalised
    outputs into the projections and the residual inputs; 2 q + 2 kv: RoPE and sdpa's q, k, v (k and v
    are not repeated for GQA); 4 heads: sdpa's fp32 logsumexp; 4 I: the gated MLP (SiLU's input, its
    output, up and the product). Exact (fitted with zero residual) for transformers 5.24 Llama and Qwen2
    layers with sdpa on torch 2.13, measured with saved-tensor hooks in tests/plan/test_activations.py.
    Korthikanti et al.'s 34 h per token is the same accounting for a GPT-2 layer. Batches with padding
    masks cost more (k/v repeated, a float mask of b x s^2 per layer); the padding-free packing of
    sftdoctor's trainer passes no mask."""
    b = dtype_bytes(precision)
    h, q, kv, inter = shape.hidden, shape.q_size, shape.kv_size, shape.intermediate
    return 8 * h + b * (4 * h + 2 * q + 2 * kv + 4 * inter) + 4 * shape.heads + 8


def eager_attention_bytes(shape: Shape, micro_batch: int, seq_len: int, precision: str) -> int:
    """What eager attention keeps beyond sdpa, per layer: the softmax in fp32 plus the probabilities in the
    training dtype (b x heads x s^2 per sequence), k and v repeated to every head, no logsumexp."""
    b = dtype_bytes(precision)
    per_score = 4 + (0 if b == 4 else b)
    tokens = micro_batch * seq_len
    return (
        per_score * shape.heads * seq_len * seq_len * micro_batch
        + (2 * b * (shape.q_size - shape.kv_size) - 4 * shape.heads) * tokens
    )


def lora_input_groups(shape: Shape, attention: str) -> list[tuple[tuple[str, ...], int]]:
    """The tensors a trained decoder layer saves only as the input of its projections (for their weights'
    gradients), with the layers that read each: the two norms' outputs and the MLP's product. sdpa and flash
    attention save their output themselves, so the o_proj input is kept by them whatever LoRA wraps."""
    groups = [
        (("q_proj", "k_proj", "v_proj"), shape.hidden),
        (("gate_proj", "up_proj"), shape.hidden),
        (("down_proj",), shape.intermediate),
    ]
    return groups + ([(("o_proj",), shape.q_size)] if attention == "eager" else [])


def lora_activation_bytes_per_token(
    shape: Shape, precision: str, lora: Adapters, separate: bool, attention: str = "sdpa", mask_bytes: int | None = None
) -> int:
    """What one decoder layer under LoRA saves per token, against the trained layer of
    activation_bytes_per_token (b the training dtype's size, in the width of a wrapped layer's input):

        trained layer - 2 b h - b x (each input group no adapter keeps) + per adapter: b r [+ b in] [+ mask in]

    A frozen weight needs no gradient, so autograd keeps nothing for it: the norms' weight products save
    nothing (2 b h) and a projection's input is kept only by an adapter reading that very tensor. With dropout,
    or with fp32 adapters under autocast (which reads a 16-bit cast), each adapter keeps its own copy of its
    input (b in) and the shared input is kept by none; dropout adds its mask (1 B on CUDA's fused kernel; the CPU
    kernel keeps its noise in the input's dtype). Every adapter keeps its r-wide A output for B's gradient.
    Exact on transformers 5.24 Llama and Qwen2 layers with peft 0.21 (fp32, bf16 and bf16 under autocast),
    measured with saved-tensor hooks in tests/run/test_memory.py. DoRA's weight norm is not counted."""
    b, mask = dtype_bytes(precision), DROPOUT_MASK if mask_bytes is None else mask_bytes
    separate = separate or lora.dropout > 0
    out = activation_bytes_per_token(shape, precision) - 2 * b * shape.hidden
    for readers, width in lora_input_groups(shape, attention):
        if separate or not set(readers) & set(lora.wrapped):
            out -= b * width
    for name in lora.wrapped:
        width = getattr(shape, LLAMA_LINEAR[name][1])
        out += b * lora.r + (b * width if separate else 0) + (mask * width if lora.dropout > 0 else 0)
    return out


def layer_bytes_per_token(run: Workload, s: Setting) -> int:
    if run.lora is None:
        return activation_bytes_per_token(run.shape, run.precision)
    return lora_activation_bytes_per_token(
        run.shape, run.precision, run.lora, fp32_adapters_under_autocast(run, s), run.attention
    )


def adapter_casts(run: Workload, s: Setting) -> list[Term]:
    """Autocast casts each fp32 adapter to 16 bits once per forward and the backward keeps the copy."""
    if run.lora is None or not fp32_adapters_under_autocast(run, s):
        return []
    return [
        Term(
            "adapter casts",
            2 * run.lora.trainable,
            "2 B x trainable params (autocast's 16-bit copies of the fp32 adapters, kept for the backward)",
        )
    ]


def activations(run: Workload, s: Setting) -> list[Term]:
    shape, tokens = run.shape, s.micro_batch * run.seq_len
    per_layer = layer_bytes_per_token(run, s) * tokens
    lora = "" if run.lora is None else " (LoRA: frozen layers save less, each adapter its r-wide output)"
    if run.attention == "eager":
        per_layer += eager_attention_bytes(shape, s.micro_batch, run.seq_len, run.precision)
    b = dtype_bytes(run.precision)
    if s.checkpointing:  # non-reentrant: each layer keeps its input (measured: b x h per token)
        kept = shape.layers * b * shape.hidden * tokens
        return [
            Term(
                "activations",
                kept + per_layer,
                f"checkpointed: layers x {b} B x hidden x tokens (each layer's input) + one layer recomputed "
                f"({per_layer // tokens:,} B/token){lora}",
            )
        ] + adapter_casts(run, s)
    return [
        Term(
            "activations",
            shape.layers * per_layer,
            f"layers x {per_layer // tokens:,} B/token x {tokens:,} tokens (micro-batch x sequence length){lora}",
        )
    ] + adapter_casts(run, s)


# TRL's chunked log-probabilities (trl/kernels/chunked_logprob.py, TRL 1.16): the LM head is projected in tiles of
# this many tokens x this many vocabulary entries; pinned against the installed TRL by a test.
TOKEN_TILE, VOCAB_TILE = 4096, 32768


def logits(run: Workload, s: Setting) -> list[Term]:
    """The LM head and the loss. TRL 1.16's SFTTrainer (sftdoctor's trainer, with or without liger, whose fused
    cross-entropy it refuses) patches the model with `add_fused_lm_head`: the full (tokens x vocab) logits never
    exist. What does: one tile of the projection, the positions with a label copied for it (Triton devices), and
    in the backward the fp32 accumulators of the hidden states' gradient and, when the head trains (not under
    LoRA), of the head's weight gradient (vocab x hidden x 4 B)."""
    tokens, vocab, hidden, b = (
        s.micro_batch * run.seq_len,
        run.shape.vocab,
        run.shape.hidden,
        dtype_bytes(run.precision),
    )
    tile = min(tokens, TOKEN_TILE) * min(vocab, VOCAB_TILE) * b
    # Per token x hidden: the labelled positions' copy (b), their fp32 gradient (4) and its cast back (b), the
    # backward of the slice that puts it back at full shape (b), the final RMSNorm's fp32 backward (4); 20 B in
    # fp32 as measured on this stack.
    inputs = tokens * hidden * (3 * b + 8) + tokens * 32  # and the kernel's fp32 per-token statistics
    head = 0 if run.lora is not None else 4 * vocab * hidden
    formula = (
        f"TRL's fused LM head: a {min(tokens, TOKEN_TILE)} x {min(vocab, VOCAB_TILE)} tile, {3 * b + 8} B x "
        f"hidden + 32 B per token"
        + ("" if run.lora is not None else ", the head's fp32 gradient (4 B x vocab x hidden)")
    )
    return [Term("logits and loss", tile + inputs + head, formula)]


def layer_backward(run: Workload, s: Setting) -> list[Term]:
    """With LoRA nothing of a layer's weight gradients is allocated before its backward, so what that backward
    holds at once can set the peak: the MLP's gradients (of its product and both factors, b x 3 I per token),
    beyond the loss's backward (the logits term), which is over by then. A full fine-tune's weight gradients,
    counted whole, cover it. No term where the loss's backward holds more."""
    if run.lora is None:
        return []
    tokens, b = s.micro_batch * run.seq_len, dtype_bytes(run.precision)
    beyond = 3 * b * run.shape.intermediate * tokens - logits(run, s)[0].bytes
    if beyond <= 0:
        return []
    return [
        Term(
            "layer backward",
            beyond,
            f"3 x {b} B x intermediate x tokens - logits and loss: the MLP's gradients in one layer's backward",
        )
    ]


def estimate(run: Workload, s: Setting, accumulation: int | None = 1) -> Estimate:
    """The setting's terms; `accumulation` (micro-batches per step, None when unknown) matters only to FSDP2."""
    if s.fsdp:
        states = fsdp_states(run, s, accumulating=accumulation != 1)
    else:
        states = model_states(run.shape, s, run.world) if run.lora is None else lora_states(run, s)
    gpu = states + activations(run, s) + logits(run, s) + layer_backward(run, s)
    live = sum(t.bytes for t in gpu)
    gpu.append(
        Term("fragmentation", int(live * FRAGMENTATION), f"{FRAGMENTATION:.0%} of the above (caching allocator)")
    )
    gpu.append(Term("CUDA context and NCCL", CUDA_CONTEXT, "fixed allowance"))
    host = (
        fsdp_host_memory(run, s)
        if s.fsdp
        else host_memory(run.shape, s, run.world, run.per_node, run.precision, run.lora)
    )
    return Estimate(s, gpu, host)


# ---------------------------------------------------------------- candidates: the fastest setting that fits

HEADROOM = 0.10  # a recommended setting leaves this share of GPU memory free
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
STAGES = ((0, False), (1, False), (2, False), (2, True), (3, False), (3, True))
FSDP_MODES = ((True, False), (False, False), (True, True), (False, True))  # (reshard_after_forward, CPU offload)
KINDS = {
    None: "",
    "none": "LoRA, ",
    "4bit": "QLoRA 4-bit base, ",
    "8bit": "LoRA on an 8-bit base, ",
}  # by Setting.quantize


@dataclass
class Candidate:
    estimate: Estimate
    accumulation: int | None  # None: this micro-batch cannot reach the global batch exactly
    fits: bool
    compute: float  # relative compute per step: 4/3 with recomputation
    communication: float  # relative to DDP's all-reduce: 1.5 for ZeRO-3's extra all-gather

    @property
    def setting(self) -> Setting:
        return self.estimate.setting

    def speed_key(self) -> tuple:
        """Fastest first: no CPU optimizer step, no recomputation, less communication, bigger micro-batches
        (bigger matmuls, fewer accumulation steps), liger's fused kernels."""
        s = self.setting
        return (s.offload_optimizer, quantized(s), self.compute, self.communication, -s.micro_batch, not s.liger)

    def describe(self) -> str:
        s = self.setting
        accumulation = f"{self.accumulation} accumulation" if self.accumulation else "no whole accumulation"
        offload = " + optimizer offload" if s.offload_optimizer else ""
        return (
            f"{KINDS[s.quantize]}{engine(s)}{'' if s.fsdp else offload}, checkpointing "
            f"{'on' if s.checkpointing else 'off'}, micro-batch {s.micro_batch} x {accumulation}, "
            f"liger {'on' if s.liger else 'off'}"
        )

    def to_json(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "setting": setting_json(self.setting),
            "gradient_accumulation_steps": self.accumulation,
            "gpu_peak_bytes": e.gpu_peak,
            "host_peak_bytes": e.host_peak,
            "fits": self.fits,
            "relative_compute": self.compute,
            "relative_communication": self.communication,
            "gpu_terms": [t.to_json() for t in e.gpu],
            "host_terms": [t.to_json() for t in e.host],
        }


FSDP_FIELDS = ("fsdp", "reshard_after_forward")


def setting_json(s: Setting) -> dict[str, Any]:
    """The setting's fields; FSDP2's only on FSDP2 rows, so that a DeepSpeed plan's JSON is as it was."""
    out = asdict(s)
    return out if s.fsdp else {k: v for k, v in out.items() if k not in FSDP_FIELDS}


def engine(s: Setting) -> str:
    """The sharding as the plan's table labels it: ZeRO-n, or FSDP2 (no-reshard: reshard_after_forward=False;
    offload: CPUOffloadPolicy)."""
    if not s.fsdp:
        return f"ZeRO-{s.zero_stage}"
    return "FSDP2" + ("" if s.reshard_after_forward else " no-reshard") + (" offload" if s.offload_optimizer else "")


def candidate(run: Workload, s: Setting, global_batch: int, gpu_memory: int) -> Candidate:
    step = s.micro_batch * run.world
    accumulation = global_batch // step if global_batch % step == 0 else None
    e = estimate(run, s, accumulation)
    return Candidate(
        e,
        accumulation,
        e.gpu_peak <= gpu_memory * (1 - HEADROOM),
        4 / 3 if s.checkpointing else 1.0,
        1.5 if s.zero_stage == 3 or (s.fsdp and s.reshard_after_forward) else 1.0,
    )


def candidates(
    run: Workload,
    global_batch: int,
    gpu_memory: int,
    liger_available: bool,
    quantize: str | None = None,
    fsdp: bool = False,
) -> list[Candidate]:
    """Every ZeRO stage (and optimizer offload for 2 and 3) x checkpointing x micro-batch (liger on where
    available) that reaches `global_batch` exactly, fastest first; none when the ranks cannot share it evenly.
    A LoRA run keeps its base (`quantize`); a 16-bit one that fits nowhere is also tried on a 4-bit base: QLoRA
    changes the weights the adapters train over, so it is offered only where no 16-bit base fits. An FSDP2 run
    (`fsdp`) gets FSDP2's rows (reshard after forward or not, CPU offload or not) before the ZeRO
    stages', so that FSDP2 wins a tie."""
    out = _grid(run, global_batch, gpu_memory, liger_available, quantize, fsdp)
    if run.lora is not None and quantize in (None, "none") and not any(c.fits for c in out):
        out += _grid(run, global_batch, gpu_memory, liger_available, "4bit", fsdp)
    return sorted(out, key=Candidate.speed_key)


def _grid(
    run: Workload,
    global_batch: int,
    gpu_memory: int,
    liger_available: bool,
    quantize: str | None,
    fsdp: bool = False,
) -> list[Candidate]:
    micro = [m for m in MICRO_BATCHES if global_batch % (m * run.world) == 0]
    # liger changes no term (the loss is TRL's fused head either way), only speed: on wherever it can run.
    settings = [
        Setting(0, offload, ckpt, m, liger_available, quantize, True, reshard)
        for (reshard, offload), ckpt, m in itertools.product(FSDP_MODES if fsdp else (), (False, True), micro)
    ] + [
        Setting(stage, offload, ckpt, m, liger_available, quantize)
        for (stage, offload), ckpt, m in itertools.product(STAGES, (False, True), micro)
    ]
    return [candidate(run, s, global_batch, gpu_memory) for s in settings]


@dataclass
class Fit:
    """The run's own setting against the GPUs, and the fastest candidate that fits."""

    run: Workload
    current: Candidate
    candidates: list[Candidate]
    recommended: Candidate | None
    gpu_memory: int
    global_batch: int


def fit(run: Workload, current: Setting, global_batch: int, gpu_memory: int, liger_available: bool) -> Fit:
    """The current setting and the fastest that fits; a run that chose FSDP2 is recommended an FSDP2 setting (the
    ZeRO rows stand beside it in the table, for comparison), one that did not a DeepSpeed one."""
    found = candidates(run, global_batch, gpu_memory, liger_available, current.quantize, current.fsdp)
    return Fit(
        run,
        candidate(run, current, global_batch, gpu_memory),
        found,
        next((c for c in found if c.fits and c.setting.fsdp == current.fsdp), None),
        gpu_memory,
        global_batch,
    )
