"""The memory model's PyTorch FSDP2 terms (sftdoctor.run.memory, fsdp_*) against DeepSpeed's ZeRO-3 formula and
against a real FSDP2 step: two gloo ranks on the CPU, each wrapped by accelerate 1.16's own fsdp2_prepare_model
(tests/run/fsdp_rank.py), each rank's peak read from the c10 CPU allocator's profiler events."""

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from conftest import FIXTURES

from sftdoctor.plan.render import render, timing
from sftdoctor.run import memory
from sftdoctor.run.memory import GIB, Setting, Workload, estimate, fit, fsdp_layer, model_states
from sftdoctor.run.shape import Shape, closed_form

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import fsdp_rank by name
import fsdp_rank  # noqa: E402

LLAMA2_7B = closed_form(json.loads((FIXTURES / "model_config" / "Llama-2-7b-hf_resaved_float32.json").read_text()))
FSDP = Setting(0, False, True, 1, False, fsdp=True)
OVERHEAD = ("fragmentation", "CUDA context and NCCL")


def terms(run, s, accumulation=1):
    return {t.name: t.bytes for t in estimate(run, s, accumulation).gpu}


def llama2(world=8, precision="bf16"):
    return Workload(LLAMA2_7B, world, world, 4096, "sdpa", precision)


def test_a_llama2_decoder_layer_is_fsdp2s_unit():
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096  # q, k, v, o, the gated MLP, two RMSNorms
    assert fsdp_layer(LLAMA2_7B) == layer
    assert LLAMA2_7B.parameters == 32 * layer + 2 * 32000 * 4096 + 4096  # untied embedding and head, final norm


@pytest.mark.parametrize("world", [2, 8, 64])
def test_fsdp2_shards_what_zero3_partitions_less_its_16bit_weight_copy(world):
    """ZeRO-3 keeps 16-bit weights, fp32 gradients, an fp32 master copy and AdamW's moments, all / world (2 + 4 + 12
    B); FSDP2's fp32 shards are the weights and the master copy at once (4 + 4 + 8 B): 2 B x params / world less."""
    p = LLAMA2_7B.parameters
    zero3 = model_states(LLAMA2_7B, Setting(3, False, True, 1, False), world)
    partitioned = sum(t.bytes for t in zero3 if t.name != "gathered layer")
    got = terms(llama2(world), FSDP)
    sharded = got["weights, sharded"] + got["gradients, sharded"] + got["optimizer states"]
    assert sharded == 16 * p // world
    assert abs(sharded - (partitioned - 2 * p // world)) <= 2  # integer division of the split terms
    # what each gathers: ZeRO-3 its largest tensor in fp32 (DeepSpeed's estimator), FSDP2 whole units in bf16
    layer, head = fsdp_layer(LLAMA2_7B), 32000 * 4096 + 4096
    assert got["gathered units"] == 2 * (3 * layer + max(layer, head))


def test_without_reshard_after_forward_every_unit_stays_gathered():
    run = llama2()
    resharded = terms(run, FSDP)["gathered units"]
    kept = terms(run, replace(FSDP, reshard_after_forward=False))["gathered units"]
    assert kept - resharded == 2 * (LLAMA2_7B.parameters - 2 * fsdp_layer(LLAMA2_7B))  # bf16: all but two layers
    assert round(kept / GIB, 1) == 13.3  # ZeRO-2-like: a whole bf16 copy of Llama-2-7B on every GPU


def test_gradient_accumulation_keeps_fsdp2s_gradients_unsharded():
    """The Trainer's no_sync (set_requires_gradient_sync(False)) leaves each micro-batch's gradient unsharded."""
    once, accumulated = terms(llama2(), FSDP), terms(llama2(), FSDP, accumulation=4)
    assert "gradients, unsharded" not in once and "gradients, sharded" not in accumulated
    assert accumulated["gradients, unsharded"] == 2 * LLAMA2_7B.parameters  # bf16, whole: 12.6 GiB
    assert accumulated["gradients, unsharded"] == 4 * once["gradients, sharded"]  # 8 ranks' fp32 shards: 4 B / 8


def test_fsdp2_offload_keeps_only_the_gathered_units_on_the_gpu():
    got = terms(llama2(), replace(FSDP, offload_optimizer=True))
    assert set(got) - set(OVERHEAD) == {"gradients, sharded", "gathered units", "activations", "logits and loss"}
    assert got["gradients, sharded"] == 0


def test_fsdp2_host_ram_is_a_copy_per_rank_or_the_offloaded_shards():
    """transformers 5.25 loads the checkpoint on every rank, cpu_ram_efficient_loading or not."""
    assert estimate(llama2(), FSDP).host_peak == 4 * LLAMA2_7B.parameters * 8
    offloaded = estimate(llama2(world=4), replace(FSDP, offload_optimizer=True)).host_peak
    assert offloaded == int(16 * LLAMA2_7B.parameters / 4 * 4 * memory.ADAM_BUFFER)  # more than the 4 fp32 loads


def test_lora_under_fsdp2_shards_the_16bit_base_and_fp32_adapters():
    lora = memory.adapters(
        {"r": 16, "dropout": 0.05, "target_modules": "all-linear", "modules_to_save": [], "trainable_params": None},
        LLAMA2_7B,
    )
    run = replace(llama2(), lora=lora)
    got = terms(run, replace(FSDP, quantize="none"))
    assert got["frozen base, sharded"] == 2 * LLAMA2_7B.parameters // 8
    assert got["adapter weights, sharded"] == 4 * lora.trainable // 8  # accelerate upcasts the trainable ones
    assert "adapter casts" not in got  # FSDP2 casts them for compute: no autocast copies


def fsdp_fit(world=8, memory_gib=80.0):
    return fit(llama2(world), FSDP, 64, int(memory_gib * GIB), False)


def test_an_fsdp2_run_is_offered_fsdp2_rows_beside_the_zero_stages():
    found = fsdp_fit()
    engines = {memory.engine(c.setting) for c in found.candidates}
    assert engines == {
        "FSDP2",
        "FSDP2 no-reshard",
        "FSDP2 offload",
        "FSDP2 no-reshard offload",
        "ZeRO-0",
        "ZeRO-1",
        "ZeRO-2",
        "ZeRO-3",
    }
    plain = fit(llama2(), Setting(3, False, True, 1, False), 64, 80 * GIB, False)
    assert not any(c.setting.fsdp for c in plain.candidates)
    assert found.current.describe().startswith("FSDP2, checkpointing on, micro-batch 1 x 8 accumulation")


def test_a_deepspeed_plans_json_names_no_fsdp_field():
    plain = fit(llama2(), Setting(3, False, True, 1, False), 64, 80 * GIB, False)
    assert set(plain.current.to_json()["setting"]) == {
        "zero_stage",
        "offload_optimizer",
        "checkpointing",
        "micro_batch",
        "liger",
        "quantize",
    }
    fsdp = fsdp_fit().current.to_json()["setting"]
    assert fsdp["fsdp"] is True and fsdp["reshard_after_forward"] is True


def test_the_plan_table_names_each_rows_engine():
    from sftdoctor.plan.render import ENGINE, HEADER

    found = fsdp_fit()
    text = render(found, timing(found, {"tokens_per_step": 64 * 4096, "steps": 10, "token_basis": "rows"}, None))
    lines = text.splitlines()
    header = "  " + "engine".ljust(ENGINE) + HEADER[len("  ZeRO") :]
    rows = lines[lines.index(header) + 1 :]
    rows = rows[: rows.index("")]
    fitting = [c for c in found.candidates if c.fits][: len(rows)]
    assert [row[2 : 2 + ENGINE].rstrip() for row in rows] == [memory.engine(c.setting) for c in fitting]
    assert all(row[2 + ENGINE :].split()[0] in ("yes", "no") for row in rows)  # the offload column, aligned
    assert "this run's setting: FSDP2, checkpointing on" in text


# ---------------------------------------------------------------- a real FSDP2 step on two CPU ranks

SPEC = dict(arch="qwen2", h=256, inter=704, heads=8, kv=2, layers=4, vocab=4096, seq=64, micro=2)


def measured_ranks(spec: dict, world: int = 2) -> list[dict]:
    out = tempfile.mkdtemp(prefix="sftdoctor-fsdp-")
    mp.spawn(fsdp_rank.run, args=(world, f"{out}/init", out, spec), nprocs=world)
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def predicted_peak(spec: dict, world: int = 2) -> int:
    model = fsdp_rank.build(spec)
    sizes = [p.numel() for p in model.parameters()]
    h, heads = spec["h"], spec["heads"]
    shape = Shape(spec["arch"], h, spec["layers"], spec["inter"], spec["vocab"], heads, spec["kv"], h // heads, 0, 0)
    shape = replace(shape, parameters=sum(sizes), largest_layer=max(sizes))
    run = Workload(shape, world, world, spec["seq"], "sdpa", "fp32")
    s = replace(FSDP, checkpointing=spec["checkpointing"], micro_batch=spec["micro"])
    s = replace(s, reshard_after_forward=spec["reshard"])
    return sum(t.bytes for t in estimate(run, s, spec["accumulation"]).gpu if t.name not in OVERHEAD)


# (case, bound): the Trainer's usual step (two micro-batches, the first under no_sync) within 10%. The memory model sums
# each term's own maximum, and two pairs of terms peak at different moments of the backward: with checkpointing the
# recomputed layer's activations and the loss's tensors (gone before the first layer's backward starts); with one
# micro-batch per step the gradient shards and the activations (the shards appear as the backward frees them). On
# this tiny model those are a large share of the peak, so those cases are bounded at 20%.
CASES = [
    ({"reshard": True, "checkpointing": False, "accumulation": 2}, 1.10),
    ({"reshard": False, "checkpointing": False, "accumulation": 2}, 1.10),
    ({"reshard": True, "checkpointing": False, "accumulation": 2, "arch": "llama", "kv": 8, "vocab": 512}, 1.10),
    ({"reshard": True, "checkpointing": True, "accumulation": 2}, 1.20),
    ({"reshard": True, "checkpointing": False, "accumulation": 1, "micro": 4}, 1.20),
]


NOISE = 0.98  # the lower bound: the measurement's own run-to-run spread on two CPU ranks, not the model's error


@pytest.mark.slow  # two spawned ranks each build, shard and train a tiny model: ~30 s a case on two cores
@pytest.mark.parametrize("case, bound", CASES)
def test_fsdp2s_predicted_peak_is_never_below_a_real_ranks(monkeypatch, case, bound):
    monkeypatch.setattr(memory, "TOKEN_TILE", fsdp_rank.TOKEN_TILE)  # the ranks shrink TRL's tiles alike
    monkeypatch.setattr(memory, "VOCAB_TILE", fsdp_rank.VOCAB_TILE)
    spec = {**SPEC, **case}
    predicted = predicted_peak(spec)
    for rank in measured_ranks(spec):
        # gloo's worker threads make a rank's measured peak vary by 2-3% from run to run on CPU; the full suite
        # once measured 0.9986 of the prediction under load: within that noise, never further below
        assert NOISE <= predicted / rank["peak"] <= bound, (predicted, rank)
