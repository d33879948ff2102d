"""Predicted activation memory against what autograd really saves, on tiny models built from configs.

Measured with `torch.autograd.graph.saved_tensors_hooks`: every tensor the forward saves for the
backward, each storage counted once, parameters left out. This is the activation memory a GPU
holds at the end of the forward, independent of the device's allocator.
"""

import pytest
import torch
import transformers

from sftdoctor.plan.memory import Run, Setting, activations, logits
from sftdoctor.plan.shape import Shape

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
