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
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

from sftdoctor.run.shape import Shape

GIB = 2**30
CUDA_CONTEXT = 1 * GIB  # CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers: ~0.5-1 GiB on A100/H100
FRAGMENTATION = 0.10  # the caching allocator's unusable share on top of what is live (PyTorch 2.x)
ADAM_BUFFER = 1.5  # DeepSpeed's additional_buffer_factor for host memory with offload


@dataclass(frozen=True)
class Setting:
    """One way to run: what the candidate table varies."""

    zero_stage: int
    offload_optimizer: bool
    checkpointing: bool
    micro_batch: int
    liger: bool


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
class Run:
    """What does not vary between candidates."""

    shape: Shape
    world: int  # ranks in all
    per_node: int  # ranks on one node
    seq_len: int  # tokens per row (max_length; packed rows are full)
    attention: str  # flash_attention_2 | sdpa | eager
    precision: str  # bf16 | fp16 | fp32


def model_states(shape: Shape, s: Setting, world: int) -> list[Term]:
    """Weights, gradients and optimizer states per GPU; the sum equals DeepSpeed's estimator."""
    p, largest = shape.parameters, shape.largest_layer
    if s.zero_stage == 0:  # DDP with autocast: fp32 weights, gradients, Adam moments; nothing partitioned
        return [Term("weights", 4 * p, "4 B x params (fp32)"), Term("gradients", 4 * p, "4 B x params (fp32)"),
                Term("optimizer states", 8 * p, "8 B x params (AdamW moments, fp32)")]
    if s.zero_stage == 1:
        return [Term("weights", 2 * p, "2 B x params (16-bit)"), Term("gradients", 2 * p, "2 B x params (16-bit)"),
                Term("optimizer states", 16 * p // world, "16 B x params / world (fp32 master, moments, fp32 grads)")]
    if s.zero_stage == 2:
        if s.offload_optimizer:
            return [Term("weights", 2 * p, "2 B x params (16-bit); gradients and optimizer on the host")]
        return [Term("weights", 2 * p, "2 B x params (16-bit)"),
                Term("gradients", 6 * p // world, "6 B x params / world (16-bit and fp32, partitioned)"),
                Term("optimizer states", 12 * p // world, "12 B x params / world (fp32 master and moments)")]
    gathered = Term("gathered layer", 4 * largest, "4 B x the largest layer (ZeRO-3 gathers it)")
    if s.offload_optimizer:
        return [gathered, Term("weights", 2 * p // world, "2 B x params / world (16-bit partition)")]
    return [gathered, Term("weights", 2 * p // world, "2 B x params / world (16-bit partition)"),
            Term("gradients", 4 * p // world, "4 B x params / world (partitioned)"),
            Term("optimizer states", 12 * p // world, "12 B x params / world (fp32 master and moments)")]


def load_bytes(s: Setting, precision: str) -> int:
    """Bytes per parameter as the weights load: 16-bit under DeepSpeed in bf16/fp16 (it holds the fp32 master
    copy), else fp32 (run.resolve.load_dtype decides the same for the run itself)."""
    return 2 if s.zero_stage > 0 and precision != "fp32" else 4


def host_memory(shape: Shape, s: Setting, world: int, per_node: int, precision: str = "fp32") -> list[Term]:
    """Host RAM per node, as DeepSpeed's estimators count it (`cpu_mem`, additional_buffer_factor 1.5): every
    rank loading the model (load_bytes x params x ranks per node: 4 for fp32, 2 when DeepSpeed holds the fp32
    master copy and 16-bit weights load in 16 bits), or the offloaded optimizer. ZeRO-3 loads under
    `zero.Init` (sftdoctor's recipe creates the DeepSpeed config before the model), so each rank keeps only
    its partition: load_bytes x params / world x ranks per node."""
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
    return per_score * shape.heads * seq_len * seq_len * micro_batch + (2 * b * (shape.q_size - shape.kv_size)
                                                                         - 4 * shape.heads) * tokens


def activations(run: Run, s: Setting) -> list[Term]:
    shape, tokens = run.shape, s.micro_batch * run.seq_len
    per_layer = activation_bytes_per_token(shape, run.precision) * tokens
    if run.attention == "eager":
        per_layer += eager_attention_bytes(shape, s.micro_batch, run.seq_len, run.precision)
    b = dtype_bytes(run.precision)
    if s.checkpointing:  # non-reentrant: each layer keeps its input (measured: b x h per token)
        kept = shape.layers * b * shape.hidden * tokens
        return [Term("activations", kept + per_layer,
                     f"checkpointed: layers x {b} B x hidden x tokens (each layer's input) + one layer recomputed "
                     f"({per_layer // tokens:,} B/token)")]
    return [Term("activations", shape.layers * per_layer,
                 f"layers x {per_layer // tokens:,} B/token x {tokens:,} tokens (micro-batch x sequence length)")]


def logits(run: Run, s: Setting) -> list[Term]:
    """The LM head's output and the loss, per token: the logits in the training dtype, their fp32 copy
    (transformers 5.24's loss calls `logits.float()`, a no-op in fp32) and the softmax cross-entropy keeps
    (4 B x vocab). liger's fused linear cross-entropy computes the loss in chunks instead. TRL 1.16's
    SFTTrainer tiles its LM head too (`add_fused_lm_head`), so for sftdoctor's own trainer this term is an
    upper bound; plain transformers builds the full logits as counted here."""
    tokens, vocab = s.micro_batch * run.seq_len, run.shape.vocab
    if s.liger:
        return [Term("logits and loss", 0, "liger fused linear cross-entropy: logits never materialised")]
    b = dtype_bytes(run.precision)
    per_token = b + (0 if b == 4 else 4) + 4
    return [Term("logits and loss", per_token * vocab * tokens,
                 f"{per_token} B x vocab x tokens: logits{'' if b == 4 else ', their fp32 copy'} and the loss's softmax")]


def estimate(run: Run, s: Setting) -> Estimate:
    gpu = model_states(run.shape, s, run.world) + activations(run, s) + logits(run, s)
    live = sum(t.bytes for t in gpu)
    gpu.append(Term("fragmentation", int(live * FRAGMENTATION), f"{FRAGMENTATION:.0%} of the above (caching allocator)"))
    gpu.append(Term("CUDA context and NCCL", CUDA_CONTEXT, "fixed allowance"))
    return Estimate(s, gpu, host_memory(run.shape, s, run.world, run.per_node, run.precision))


# ---------------------------------------------------------------- candidates: the fastest setting that fits

HEADROOM = 0.10  # a recommended setting leaves this share of GPU memory free
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
STAGES = ((0, False), (1, False), (2, False), (2, True), (3, False), (3, True))


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
        return (s.offload_optimizer, self.compute, self.communication, -s.micro_batch, not s.liger)

    def describe(self) -> str:
        s = self.setting
        accumulation = f"{self.accumulation} accumulation" if self.accumulation else "no whole accumulation"
        return (f"ZeRO-{s.zero_stage}{' + optimizer offload' if s.offload_optimizer else ''}, checkpointing "
                f"{'on' if s.checkpointing else 'off'}, micro-batch {s.micro_batch} x {accumulation}, "
                f"liger {'on' if s.liger else 'off'}")

    def to_json(self) -> dict[str, Any]:
        e = self.estimate
        return {"setting": asdict(self.setting), "gradient_accumulation_steps": self.accumulation,
                "gpu_peak_bytes": e.gpu_peak, "host_peak_bytes": e.host_peak, "fits": self.fits,
                "relative_compute": self.compute, "relative_communication": self.communication,
                "gpu_terms": [t.to_json() for t in e.gpu], "host_terms": [t.to_json() for t in e.host]}


def candidate(run: Run, s: Setting, global_batch: int, gpu_memory: int) -> Candidate:
    e = estimate(run, s)
    step = s.micro_batch * run.world
    accumulation = global_batch // step if global_batch % step == 0 else None
    return Candidate(e, accumulation, e.gpu_peak <= gpu_memory * (1 - HEADROOM),
                     4 / 3 if s.checkpointing else 1.0, 1.5 if s.zero_stage == 3 else 1.0)


def candidates(run: Run, global_batch: int, gpu_memory: int, liger_available: bool) -> list[Candidate]:
    """Every ZeRO stage (and optimizer offload for 2 and 3) x checkpointing x micro-batch x liger that reaches
    `global_batch` exactly, fastest first; none when the ranks cannot share it evenly."""
    micro = [m for m in MICRO_BATCHES if global_batch % (m * run.world) == 0]
    ligers = (True, False) if liger_available else (False,)
    out = [candidate(run, Setting(stage, offload, ckpt, m, liger), global_batch, gpu_memory)
           for (stage, offload), ckpt, m, liger in itertools.product(STAGES, (False, True), micro, ligers)]
    return sorted(out, key=Candidate.speed_key)


@dataclass
class Fit:
    """The run's own setting against the GPUs, and the fastest candidate that fits."""

    run: Run
    current: Candidate
    candidates: list[Candidate]
    recommended: Candidate | None
    gpu_memory: int
    global_batch: int


def fit(run: Run, current: Setting, global_batch: int, gpu_memory: int, liger_available: bool) -> Fit:
    found = candidates(run, global_batch, gpu_memory, liger_available)
    return Fit(run, candidate(run, current, global_batch, gpu_memory), found, next((c for c in found if c.fits), None),
               gpu_memory, global_batch)
