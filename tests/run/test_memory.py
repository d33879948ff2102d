"""The memory model (sftdoctor.run.memory) against what really happens, on this stack:

- model states and host RAM equal DeepSpeed's own estimators, on published config.json files;
- activations match what autograd saves (`torch.autograd.graph.saved_tensors_hooks`: every tensor the
  forward saves for the backward, each storage counted once, parameters left out), on tiny models;
- a whole step's predicted peak against the c10 CPU allocator's profiler events (forward, backward, AdamW);
- the candidate search: only settings that reach the global batch exactly, the fastest that fits first;
- LoRA and QLoRA (peft 0.21 on the same tiny models): a frozen base, adapters that train, the activations a
  frozen layer still saves, and the peak of a real step that trains only the adapters.
"""

import json
from dataclasses import replace

import pytest
import torch
import transformers
from conftest import FIXTURES, meta_shape
from torch.profiler import ProfilerActivity, profile

from sftdoctor.run import memory
from sftdoctor.run.memory import (
    GIB,
    Setting,
    Workload,
    activations,
    adapters,
    candidates,
    eager_attention_bytes,
    estimate,
    fit,
    host_memory,
    logits,
    lora_activation_bytes_per_token,
    model_states,
)
from sftdoctor.run.shape import Shape, closed_form

TOLERANCE = 0.005  # the formula is exact on this stack; the slack is for a stray scalar
MODELS = FIXTURES / "model_config"


def config(name):
    return json.loads((MODELS / name).read_text())


TOLERANCE = 0.005  # the formula is exact on this stack; the slack is for a stray scalar


def saved_bytes(model, batch, autocast: bool = False) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        out = model(**batch)
    out.logits.sum().backward()  # the graph is real: it can be used
    return sum(seen.values())


def tiny(arch, h, inter, heads, kv, layers, dtype, checkpointing, head_dim=None, attention="sdpa"):
    """A random model of `arch` built from its Shape, and that shape (what the memory model is given)."""
    shape = Shape(arch, h, layers, inter, 512, heads, kv, head_dim or h // heads, 0, 0)
    config_class = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[arch]
    cfg = config_class(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        num_hidden_layers=shape.layers,
        vocab_size=shape.vocab,
        max_position_embeddings=1024,
        head_dim=shape.head_dim,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attention).train()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model, shape


@pytest.mark.parametrize(
    "arch, h, inter, heads, kv, head_dim",
    [
        ("qwen2", 128, 352, 8, 2, 16),
        ("llama", 256, 704, 8, 8, 32),
        ("qwen2", 64, 128, 4, 4, 32),
        ("llama", 96, 200, 3, 1, 8),
    ],
)
@pytest.mark.parametrize("seq, micro", [(64, 1), (128, 4)])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_layer_activations_match_what_autograd_saves(arch, h, inter, heads, kv, head_dim, seq, micro, precision):
    """Two models that differ by one layer: the difference is one layer's activations."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    batch = {"input_ids": torch.randint(0, 512, (micro, seq))}
    measured = []
    for layers in (2, 3):
        model, shape = tiny(arch, h, inter, heads, kv, layers, dtype, False, head_dim)
        measured.append(saved_bytes(model, batch))
    run = Workload(shape, 1, 1, seq, "sdpa", precision)
    one_layer = activations(run, Setting(0, False, False, micro, True))[0].bytes / 3
    assert abs(one_layer - (measured[1] - measured[0])) <= TOLERANCE * (measured[1] - measured[0])


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_checkpointed_layer_keeps_only_its_input(precision):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    seq, micro = 64, 2
    batch = {"input_ids": torch.randint(0, 512, (micro, seq))}
    measured = [saved_bytes(tiny("qwen2", 128, 352, 8, 2, layers, dtype, True)[0], batch) for layers in (2, 3)]
    shape = tiny("qwen2", 128, 352, 8, 2, 3, dtype, True)[1]
    run = Workload(shape, 1, 1, seq, "sdpa", precision)
    with_ckpt = activations(run, Setting(0, False, True, micro, True))[0].bytes
    without = activations(run, Setting(0, False, False, micro, True))[0].bytes
    per_layer_kept = (with_ckpt - without / 3) / 3  # one recomputed layer comes on top of the kept inputs
    assert per_layer_kept == measured[1] - measured[0]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("heads, kv", [(8, 2), (4, 4)])
def test_eager_attention_adds_the_scores_and_repeated_kv(precision, heads, kv):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    seq, micro = 96, 2
    batch = {"input_ids": torch.randint(0, 512, (micro, seq))}
    measured = [
        saved_bytes(tiny("qwen2", 128, 352, heads, kv, layers, dtype, False, attention="eager")[0], batch)
        for layers in (2, 3)
    ]
    shape = tiny("qwen2", 128, 352, heads, kv, 3, dtype, False)[1]
    predicted = (
        activations(Workload(shape, 1, 1, seq, "eager", precision), Setting(0, False, False, micro, True))[0].bytes / 3
    )
    assert abs(predicted - (measured[1] - measured[0])) <= TOLERANCE * (measured[1] - measured[0])


def peak_bytes(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


def trl_loss(model, ids):
    """The loss as TRL 1.16's SFTTrainer computes it (sft_trainer.compute_loss): the fused LM head's log-probs."""
    out = model(input_ids=ids, labels=ids, fused_lm_head=True)
    return -out.log_probs.sum() / out.label_mask.sum()


@pytest.fixture
def small_tiles(monkeypatch):
    """TRL's tiles shrunk, here and in the plan alike: on CPU its torch fallback holds several fp32 copies of a
    tile (Triton folds it in place on a GPU), which at full size would swamp a tiny model's step."""
    import trl.kernels.chunked_logprob as chunked
    import trl.trainer.utils as trl_utils

    monkeypatch.setattr(chunked, "TOKEN_CHUNK_SIZE", 64)
    monkeypatch.setattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", 128)
    monkeypatch.setattr(memory, "TOKEN_TILE", 64)
    monkeypatch.setattr(memory, "VOCAB_TILE", 128)


CPU_TILE_COPIES = 8 * 64 * 128 * 4  # at most, what TRL's torch fallback holds beside a small tile (fp32)


def trl_step(model, params):
    """One optimizer step as the trainer takes it: TRL's fused-head loss, two micro-batches accumulated (the second
    backward runs with every gradient alive), and the trainer's optimizer (transformers 5.24's default with
    torch >= 2.8, adamw_torch_fused; the foreach one would add a copy of every gradient at the step)."""
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    ids = torch.randint(0, 512, (2, 256))

    def step():
        trl_loss(model, ids).backward()
        trl_loss(model, ids).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def test_the_plans_lm_head_tiles_are_trls():
    import trl.kernels.chunked_logprob as chunked
    import trl.trainer.utils as trl_utils

    assert (memory.TOKEN_TILE, memory.VOCAB_TILE) == (chunked.TOKEN_CHUNK_SIZE, trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE)


@pytest.mark.parametrize(
    "arch, h, inter, heads, kv, layers, vocab, checkpointing",
    [
        ("qwen2", 128, 352, 8, 2, 4, 512, False),
        ("llama", 256, 704, 8, 8, 4, 512, True),
        ("qwen2", 256, 704, 8, 2, 8, 4096, False),
        ("qwen2", 128, 352, 8, 2, 2, 32000, False),
    ],
)
def test_predicted_peak_is_never_below_the_measured_one_and_at_most_15_percent_above(
    arch, h, inter, heads, kv, layers, vocab, checkpointing, small_tiles
):
    from trl.trainer.utils import add_fused_lm_head

    model, shape = tiny(arch, h, inter, heads, kv, layers, torch.float32, checkpointing)
    if vocab != 512:
        model.resize_token_embeddings(vocab, mean_resizing=False)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # what SFTTrainer.__init__ does
    sizes = [p.numel() for p in model.parameters()]
    shape = replace(shape, layers=layers, vocab=vocab, parameters=sum(sizes), largest_layer=max(sizes))
    step = trl_step(model, model.parameters())
    step()  # AdamW's states exist from the first step on, as in a real run
    measured = peak_bytes(step) - CPU_TILE_COPIES + 12 * sum(sizes)  # the weights and AdamW's moments lived before
    run, setting = Workload(shape, 1, 1, 256, "sdpa", "fp32"), Setting(0, False, checkpointing, 2, False)
    predicted = sum(t.bytes for t in model_states(shape, setting, 1) + activations(run, setting) + logits(run, setting))
    assert 1.0 <= predicted / measured <= 1.15, (predicted, measured)


def test_the_full_logits_never_exist_under_trls_fused_head():
    """Llama-3-8B, 8 rows of 4096 tokens: plain transformers' loss would hold 33k x 128k logits and their fp32
    copies (~40 GB); TRL's head holds one tile and the fp32 gradients of the head and of the hidden states."""
    shape = meta_shape(config("Meta-Llama-3-8B.json"))
    term = logits(Workload(shape, 8, 8, 4096, "flash_attention_2", "bf16"), Setting(2, False, True, 8, False))[0]
    assert term.bytes == 4096 * 32768 * 2 + 8 * 4096 * (4096 * 14 + 32) + 4 * 128256 * 4096
    assert round(term.bytes / GIB, 2) == 3.96


@pytest.fixture(scope="module", params=["Llama-2-7b-hf_resaved_float32.json", "Meta-Llama-3-8B.json"])
def shape(request):
    return meta_shape(config(request.param))


@pytest.mark.parametrize("gpus, nodes", [(8, 1), (4, 2), (2, 1)])
@pytest.mark.parametrize("offload", [False, True])
def test_gpu_and_host_figures_equal_deepspeeds_estimators(shape, gpus, nodes, offload):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    world = gpus * nodes
    p, largest = shape.parameters, shape.largest_layer
    for stage in (2, 3):
        s = Setting(stage, offload, True, 1, False)
        gpu = sum(t.bytes for t in model_states(shape, s, world))
        host = sum(t.bytes for t in host_memory(shape, s, world, gpus))
        if stage == 2:
            cpu_mem, gpu_mem = estimate_zero2_model_states_mem_needs(p, gpus, nodes, offload)
        else:
            cpu_mem, gpu_mem, _ = estimate_zero3_model_states_mem_needs(p, largest, gpus, nodes, offload, False, False)
        assert abs(gpu - gpu_mem) <= 2, (stage, offload)  # integer division of the split terms
        if stage == 2 or offload:  # fp32 weights, loaded whole by every rank: DeepSpeed's own count
            assert host == cpu_mem, (stage, offload)
        else:  # ZeRO-3 loads under zero.Init: each rank keeps its partition (DeepSpeed's estimator assumes none)
            assert host == int(p * 4 * gpus / world * 1.5) < cpu_mem


def test_host_ram_halves_when_deepspeed_holds_the_fp32_master_copy(shape):
    s = Setting(2, False, True, 1, False)
    fp32 = sum(t.bytes for t in host_memory(shape, s, 8, 8, "fp32"))
    assert sum(t.bytes for t in host_memory(shape, s, 8, 8, "bf16")) == fp32 // 2
    ddp = Setting(0, False, True, 1, False)  # DDP with AMP keeps fp32 weights
    assert sum(t.bytes for t in host_memory(shape, ddp, 8, 8, "bf16")) == fp32


def test_candidates_reach_the_global_batch_exactly_or_not_at_all(shape):
    run = Workload(shape, 8, 8, 4096, "sdpa", "bf16")
    found = candidates(run, 16, 80 * 2**30, liger_available=False)
    assert found and all(c.setting.micro_batch * c.accumulation * 8 == 16 for c in found)
    assert candidates(run, 100, 80 * 2**30, liger_available=False) == []  # 100 is not shared by 8 ranks
    current = fit(run, Setting(2, False, False, 8, False), 16, 80 * 2**30, False).current
    assert current.accumulation is None and "no whole accumulation" in current.describe()


# ---------------------------------------------------------------- LoRA and QLoRA

LLAMA2_7B = closed_form(config("Llama-2-7b-hf_resaved_float32.json"))
R16 = {
    "r": 16,
    "dropout": 0.05,
    "target_modules": "all-linear",
    "modules_to_save": [],
    "use_dora": False,
    "trainable_params": None,
}


def lora_run(shape=LLAMA2_7B, world=1, precision="bf16", **lora):
    """Llama-2-7B at 4,096 tokens per row on one node of `world` GPUs, with r = 16 adapters on every linear layer."""
    return Workload(shape, world, world, 4096, "sdpa", precision, adapters({**R16, **lora}, shape))


def terms(run, s):
    return {t.name: t.bytes for t in estimate(run, s).gpu}


def test_lora_on_llama2_7b_trains_40m_parameters_and_needs_a_sixth_of_the_full_fine_tune():
    run, s = lora_run(), Setting(0, False, True, 1, False, "none")
    assert run.lora.trainable == 39_976_960  # r x (in + out) over q, k, v, o, gate, up, down of 32 layers
    full = estimate(replace(run, lora=None), replace(s, quantize=None)).gpu_peak
    lora, qlora = estimate(run, s).gpu_peak, estimate(run, replace(s, quantize="4bit")).gpu_peak
    assert (round(full / GIB, 1), round(lora / GIB, 1), round(qlora / GIB, 1)) == (114.4, 18.2, 8.4)
    got = terms(run, s)
    assert got["frozen base"] == 2 * LLAMA2_7B.parameters  # 13.5 GB: no gradient, no optimizer state, no fp32 copy
    assert got["adapter weights"] + got["adapter gradients"] + got["adapter optimizer states"] == 16 * 39_976_960


def test_a_4bit_base_is_nf4_with_double_quantisation_and_the_rest_unquantized():
    s = Setting(2, False, True, 1, False, "4bit")
    got = terms(lora_run(), s)
    linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)  # the decoder layers' projections: what bitsandbytes quantizes
    assert got["frozen base, 4-bit"] == linear // 2 + linear // 64 + linear * 4 // (64 * 256) == 3_340_771_328
    assert got["frozen embeddings, norms"] == 2 * (LLAMA2_7B.parameters - linear)  # 16-bit under DeepSpeed
    assert got["frozen base, 4-bit"] + got["frozen embeddings, norms"] == 3_865_591_808  # ~3.9 GB of a 13.5 GB base
    # without DeepSpeed peft's prepare_model_for_kbit_training leaves the unquantized parameters in fp32
    assert terms(lora_run(), replace(s, zero_stage=0))["frozen embeddings, norms"] == 4 * (
        LLAMA2_7B.parameters - linear
    )


@pytest.mark.parametrize("stage, offload", memory.STAGES)
@pytest.mark.parametrize("world", [1, 8])
def test_a_4bit_base_needs_less_than_a_16bit_one_which_needs_less_than_a_full_fine_tune(stage, offload, world):
    run, s = lora_run(world=world), Setting(stage, offload, True, 1, False)
    peaks = [estimate(run, replace(s, quantize=q)).gpu_peak for q in ("4bit", "8bit", "none")]
    assert peaks[0] < peaks[1] < peaks[2]
    # with the optimizer offloaded a full fine-tune keeps just 16-bit weights on the GPU too, as LoRA's frozen base
    if not offload:
        assert peaks[2] < estimate(replace(run, lora=None), s).gpu_peak / 1.5


def test_zero_partitions_the_adapters_states_by_stage_and_the_frozen_base_only_at_stage_3():
    def on(world, stage):
        return terms(lora_run(world=world), Setting(stage, False, True, 1, False, "none"))

    halves = {
        stage: {name for name, b in on(4, stage).items() if b > 2 and abs(b - 2 * on(8, stage)[name]) <= 1}
        for stage in (1, 2, 3)
    }
    assert halves[1] == {"adapter optimizer states"}
    assert halves[2] == {"adapter gradients", "adapter optimizer states"}
    assert halves[3] == {"frozen base", "adapter weights", "adapter gradients", "adapter optimizer states"}
    assert on(8, 2)["frozen base"] == on(1, 2)["frozen base"] == 2 * LLAMA2_7B.parameters  # never partitioned below 3
    # the adapters' states follow DeepSpeed's own accounting over the trainable parameters alone
    assert sum(b for n, b in on(8, 2).items() if n.startswith("adapter ")) == 2 * 39_976_960 + 18 * 39_976_960 // 8


def test_lora_host_ram_loads_the_base_in_16_bits():
    s = Setting(0, False, True, 1, False, "none")
    lora = sum(t.bytes for t in host_memory(LLAMA2_7B, s, 8, 8, "bf16", lora_run(world=8).lora))
    assert lora == int(2 * LLAMA2_7B.parameters * 8 * 1.5)  # every rank loads 13.5 GB
    assert lora * 2 == sum(t.bytes for t in host_memory(LLAMA2_7B, replace(s, quantize=None), 8, 8, "bf16"))
    zero3 = sum(t.bytes for t in host_memory(LLAMA2_7B, replace(s, zero_stage=3), 8, 8, "bf16", lora_run(world=8).lora))
    assert zero3 == int(2 * LLAMA2_7B.parameters * 1.5)  # zero.Init: each rank keeps its eighth


def test_lora_candidates_keep_the_base_and_offer_4_bits_only_where_no_16bit_base_fits():
    run = lora_run(world=1)
    roomy = fit(run, Setting(0, False, True, 1, False, "none"), 8, 80 * GIB, False)
    assert roomy.recommended.setting.quantize == "none" and {c.setting.quantize for c in roomy.candidates} == {"none"}
    assert roomy.recommended.describe().startswith("LoRA, ZeRO-0")
    small = fit(run, Setting(0, False, True, 1, False, "none"), 8, 16 * GIB, False)  # 13.5 GB of base on 16 GB
    assert not any(c.fits for c in small.candidates if c.setting.quantize == "none")
    assert small.recommended.setting.quantize == "4bit" and small.recommended.describe().startswith("QLoRA 4-bit base")
    asked_8bit = fit(run, Setting(0, False, True, 1, False, "8bit"), 8, 16 * GIB, False)
    assert {c.setting.quantize for c in asked_8bit.candidates} == {"8bit"}  # a quantized base is the user's choice


@pytest.mark.slow  # builds Llama-2-7B and Qwen2-0.5B on the meta device
@pytest.mark.parametrize("name", ["Llama-2-7b-hf_resaved_float32.json", "Qwen2-0.5B.json"])
@pytest.mark.parametrize(
    "lora",
    [
        {"target_modules": "all-linear"},
        {"target_modules": ["q_proj", "v_proj"], "r": 8},
        {"target_modules": ["self_attn.o_proj", "down_proj"], "modules_to_save": ["lm_head"]},
    ],
)
def test_the_trainable_count_without_the_fact_equals_what_peft_trains(name, lora):
    from peft import LoraConfig, get_peft_model

    settings, fields = {**R16, **lora}, {k: v for k, v in config(name).items() if not k.startswith("_")}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**fields))
    model = get_peft_model(
        model,
        LoraConfig(
            r=settings["r"],
            target_modules=settings["target_modules"],
            modules_to_save=settings["modules_to_save"] or None,
        ),
    )
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert adapters(settings, meta_shape(config(name))).trainable == trained


def lora_tiny(
    arch,
    h,
    inter,
    heads,
    kv,
    layers,
    dtype,
    checkpointing,
    head_dim=None,
    attention="sdpa",
    autocast=False,
    vocab=512,
    **lora,
):
    """The tiny model of `tiny`, wrapped by peft as SFTTrainer does (fp32 adapters over a 16-bit base with
    autocast; else in the model's dtype, as DeepSpeed casts them)."""
    from peft import LoraConfig, get_peft_model

    model, shape = tiny(arch, h, inter, heads, kv, layers, dtype, checkpointing, head_dim, attention)
    if vocab != 512:
        model.resize_token_embeddings(vocab, mean_resizing=False)
    sizes = [p.numel() for p in model.parameters()]
    shape = replace(shape, vocab=vocab, parameters=sum(sizes), largest_layer=max(sizes))
    settings = {**R16, **lora}
    config_ = LoraConfig(
        r=settings["r"], lora_alpha=16, lora_dropout=settings["dropout"], target_modules=settings["target_modules"]
    )
    model = get_peft_model(model, config_, autocast_adapter_dtype=autocast)
    if checkpointing:
        model.enable_input_require_grads()  # as TRL does for PEFT models with checkpointing
    return model, adapters(settings, shape), shape


@pytest.mark.parametrize(
    "arch, h, inter, heads, kv, head_dim", [("qwen2", 128, 352, 8, 2, 16), ("llama", 96, 200, 3, 1, 8)]
)
@pytest.mark.parametrize("mode", ["fp32", "bf16", "bf16 autocast over fp32 adapters"])
@pytest.mark.parametrize(
    "lora, attention",
    [
        ({"r": 8, "dropout": 0.05}, "sdpa"),
        ({"r": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}, "sdpa"),
        ({"r": 4, "dropout": 0.1, "target_modules": ["o_proj", "down_proj"]}, "eager"),
        ({"r": 8, "dropout": 0.0, "target_modules": ["gate_proj"]}, "eager"),
    ],
)
def test_a_lora_layer_saves_what_autograd_saves(arch, h, inter, heads, kv, head_dim, mode, lora, attention):
    """Two models that differ by one layer, wrapped by peft: the difference is one LoRA layer's activations."""
    autocast = mode.endswith("adapters")
    dtype = torch.float32 if mode == "fp32" else torch.bfloat16
    seq, micro = 64, 2
    batch = {"input_ids": torch.randint(0, 512, (micro, seq))}
    measured, trainable = [], 0
    for layers in (2, 3):
        model, found, shape = lora_tiny(
            arch, h, inter, heads, kv, layers, dtype, False, head_dim, attention, autocast, **lora
        )
        measured.append(saved_bytes(model, batch, autocast))
        trainable = found.trainable // layers
    precision, b = ("fp32", 4) if mode == "fp32" else ("bf16", 2)
    # CPU's dropout keeps its noise in the dtype it drops (fp32 under autocast); CUDA's fused kernel a 1-byte mask
    per_token = lora_activation_bytes_per_token(shape, precision, found, autocast, attention, 4 if autocast else b)
    predicted = per_token * micro * seq + (
        2 * trainable if autocast else 0
    )  # + autocast's copies of one layer's adapters
    if attention == "eager":
        predicted += eager_attention_bytes(shape, micro, seq, precision)
    assert predicted == measured[1] - measured[0]


@pytest.mark.slow  # trains: forward, backward and AdamW on three tiny models
@pytest.mark.parametrize(
    "arch, h, inter, heads, kv, layers, vocab, checkpointing",
    [
        ("qwen2", 128, 352, 8, 2, 4, 512, False),
        ("llama", 256, 704, 8, 8, 4, 512, True),
        ("qwen2", 256, 704, 8, 2, 8, 4096, False),
    ],
)
@pytest.mark.parametrize(
    "lora",
    [
        {"r": 16, "dropout": 0.0},
        {"r": 8, "dropout": 0.05},
        {"r": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    ],
)
def test_a_lora_steps_predicted_peak_is_never_below_the_measured_one_and_at_most_15_percent_above(
    monkeypatch, small_tiles, arch, h, inter, heads, kv, layers, vocab, checkpointing, lora
):
    """As the full model's test above, with peft's adapters the only parameters AdamW trains."""
    model, found, shape = lora_tiny(
        arch, h, inter, heads, kv, layers, torch.float32, checkpointing, vocab=vocab, **lora
    )
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does
    trained = [p for p in model.parameters() if p.requires_grad]
    step = trl_step(model, trained)
    step()
    trainable = sum(p.numel() for p in trained)
    # the base, the adapters and AdamW's moments lived before the step
    measured = peak_bytes(step) - CPU_TILE_COPIES + 4 * shape.parameters + 12 * trainable
    monkeypatch.setattr(memory, "DROPOUT_MASK", 4)  # CPU's dropout keeps fp32 noise where CUDA's keeps a 1-byte mask
    run, setting = Workload(shape, 1, 1, 256, "sdpa", "fp32", found), Setting(0, False, checkpointing, 2, False, "none")
    assert found.trainable == trainable
    predicted = sum(
        t.bytes for t in estimate(run, setting).gpu if t.name not in ("fragmentation", "CUDA context and NCCL")
    )
    assert 1.0 <= predicted / measured <= 1.15, (predicted, measured)
