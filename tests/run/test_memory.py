"""The memory model (sftdoctor.run.memory) against what really happens, on this stack:

- model states and host RAM equal DeepSpeed's own estimators, on published config.json files;
- activations match what autograd saves (`torch.autograd.graph.saved_tensors_hooks`: every tensor the
  forward saves for the backward, each storage counted once, parameters left out), on tiny models;
- a whole step's predicted peak against the c10 CPU allocator's profiler events (forward, backward, AdamW);
- the candidate search: only settings that reach the global batch exactly, the fastest that fits first.
"""

import json
from dataclasses import replace

import pytest
import torch
import transformers
from torch.profiler import ProfilerActivity, profile

from conftest import FIXTURES, meta_shape
from sftdoctor.run.memory import (Run, Setting, activations, candidates, fit, host_memory, logits, model_states)
from sftdoctor.run.shape import Shape

TOLERANCE = 0.005  # the formula is exact on this stack; the slack is for a stray scalar
MODELS = FIXTURES / "model_config"


def config(name):
    return json.loads((MODELS / name).read_text())

TOLERANCE = 0.005  # the formula is exact on this stack; the slack is for a stray scalar


def saved_bytes(model, batch) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**batch)
    out.logits.sum().backward()  # the graph is real: it can be used
    return sum(seen.values())


def tiny(arch, h, inter, heads, kv, layers, dtype, checkpointing, head_dim=None, attention="sdpa"):
    config_class = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[arch]
    cfg = config_class(hidden_size=h, intermediate_size=inter, num_attention_heads=heads, num_key_value_heads=kv,
                       num_hidden_layers=layers, vocab_size=512, max_position_embeddings=1024,
                       head_dim=head_dim or h // heads)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attention).train()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    shape = Shape(arch, h, layers, inter, 512, heads, kv, head_dim or h // heads, 0, 0)
    return model, shape


@pytest.mark.parametrize("arch, h, inter, heads, kv, head_dim", [
    ("qwen2", 128, 352, 8, 2, 16), ("llama", 256, 704, 8, 8, 32), ("qwen2", 64, 128, 4, 4, 32),
    ("llama", 96, 200, 3, 1, 8)])
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
    run = Run(shape, 1, 1, seq, "sdpa", precision)
    one_layer = activations(run, Setting(0, False, False, micro, True))[0].bytes / 3
    assert abs(one_layer - (measured[1] - measured[0])) <= TOLERANCE * (measured[1] - measured[0])


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_checkpointed_layer_keeps_only_its_input(precision):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    seq, micro = 64, 2
    batch = {"input_ids": torch.randint(0, 512, (micro, seq))}
    measured = [saved_bytes(tiny("qwen2", 128, 352, 8, 2, layers, dtype, True)[0], batch) for layers in (2, 3)]
    shape = tiny("qwen2", 128, 352, 8, 2, 3, dtype, True)[1]
    run = Run(shape, 1, 1, seq, "sdpa", precision)
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
    measured = [saved_bytes(tiny("qwen2", 128, 352, heads, kv, layers, dtype, False, attention="eager")[0], batch)
                for layers in (2, 3)]
    shape = tiny("qwen2", 128, 352, heads, kv, 3, dtype, False)[1]
    predicted = activations(Run(shape, 1, 1, seq, "eager", precision), Setting(0, False, False, micro, True))[0].bytes / 3
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


@pytest.mark.parametrize("arch, h, inter, heads, kv, layers, vocab, checkpointing", [
    ("qwen2", 128, 352, 8, 2, 4, 512, False), ("llama", 256, 704, 8, 8, 4, 512, True),
    ("qwen2", 256, 704, 8, 2, 8, 4096, False)])
def test_predicted_peak_is_never_below_the_measured_one_and_at_most_15_percent_above(
        arch, h, inter, heads, kv, layers, vocab, checkpointing):
    model, shape = tiny(arch, h, inter, heads, kv, layers, torch.float32, checkpointing)
    if vocab != 512:
        model.resize_token_embeddings(vocab, mean_resizing=False)
    sizes = [p.numel() for p in model.parameters()]
    shape = replace(shape, layers=layers, vocab=vocab, parameters=sum(sizes), largest_layer=max(sizes))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 512, (2, 256))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW's states exist from the first step on, as in a real run
    measured = peak_bytes(step) + 12 * sum(sizes)  # the weights and AdamW's moments were alive before it
    run, setting = Run(shape, 1, 1, 256, "sdpa", "fp32"), Setting(0, False, checkpointing, 2, False)
    predicted = sum(t.bytes for t in model_states(shape, setting, 1) + activations(run, setting) + logits(run, setting))
    assert 1.0 <= predicted / measured <= 1.15, (predicted, measured)


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
    run = Run(shape, 8, 8, 4096, "sdpa", "bf16")
    found = candidates(run, 16, 80 * 2**30, liger_available=False)
    assert found and all(c.setting.micro_batch * c.accumulation * 8 == 16 for c in found)
    assert candidates(run, 100, 80 * 2**30, liger_available=False) == []  # 100 is not shared by 8 ranks
    current = fit(run, Setting(2, False, False, 8, False), 16, 80 * 2**30, False).current
    assert current.accumulation is None and "no whole accumulation" in current.describe()
