"""memory-fit on real GPUs' recorded facts and published model configs: the one memory model judges the
ZeRO stage, the micro-batch and checkpointing together, and names the change that fits."""

import json
from dataclasses import asdict

import pytest
from conftest import FIXTURES, make_run, plan_of, recorded_gpus, severities

from sftdoctor.checks import Skipped
from sftdoctor.run.resolve import memory_fit
from sftdoctor.run.shape import closed_form

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"  # 8 x 80 GB
V100x4 = "v100_pcie_4x_driver470_cuda114_princeton.txt"  # 4 x 32 GB
LLAMA8B = FIXTURES / "model_config" / "Meta-Llama-3-8B.json"


@pytest.fixture(scope="module")
def llama8b():
    return closed_form(json.loads(LLAMA8B.read_text()))


def llama_run(tmp_path, **sections):
    sections = {"data": {"max_length": 4096}, **sections}
    sections["training"] = {"global_batch_size": 64, **sections.get("training", {})}
    return make_run(tmp_path, **sections)


def check(run, tmp_path, shape, gpus, **sections):
    return run(
        "memory-fit",
        plan=plan_of(llama_run(tmp_path, **sections), gpus=recorded_gpus(gpus)),
        model_shape=asdict(shape),
        gpus=recorded_gpus(gpus),
    )


def test_the_recommended_setting_is_the_fastest_that_fits_and_keeps_the_global_batch(tmp_path, llama8b):
    plan = plan_of(
        llama_run(
            tmp_path,
            training={"per_device_batch_size": 8, "gradient_checkpointing": False},
            deepspeed={"zero_stage": 2},
        ),
        gpus=recorded_gpus(H100x8),
        packages={"liger-kernel": "0.8.5"},
    )
    found = memory_fit(plan, llama8b, 80 * 2**30)
    assert not found.current.fits  # 8 x 4,096 tokens of activations without checkpointing
    best = found.recommended
    assert best.fits and best.estimate.gpu_peak <= 0.9 * found.gpu_memory
    assert best.setting.micro_batch * best.accumulation * found.run.world == 64
    faster = [c for c in found.candidates if c.speed_key() < best.speed_key()]
    assert faster and not any(c.fits for c in faster)


def test_more_gpus_partition_more_and_checkpointing_cuts_activations(tmp_path, llama8b):
    zero3 = llama_run(tmp_path, deepspeed={"zero_stage": 3})
    eight = memory_fit(plan_of(zero3, gpus=recorded_gpus(H100x8)), llama8b, 80 * 2**30)
    four = memory_fit(plan_of(zero3, gpus=recorded_gpus(V100x4)), llama8b, 32 * 2**30)
    terms = lambda c: {t.name: t.bytes for t in c.estimate.gpu}  # noqa: E731
    assert terms(four.current)["optimizer states"] == 2 * terms(eight.current)["optimizer states"]
    off = memory_fit(
        plan_of(llama_run(tmp_path, training={"gradient_checkpointing": False}), gpus=recorded_gpus(H100x8)),
        llama8b,
        80 * 2**30,
    )
    assert terms(off.current)["activations"] > 10 * terms(eight.current)["activations"]


def test_memory_fit_errs_with_the_change_that_fits(run, tmp_path, llama8b):
    [big] = check(
        run,
        tmp_path,
        llama8b,
        H100x8,
        training={"per_device_batch_size": 8, "gradient_checkpointing": False},
        deepspeed={"zero_stage": 2},
    )
    assert big.severity.value == "error" and "more than the GPU has" in big.title
    assert "per_device_batch_size = 1" in big.fix or "gradient_checkpointing = true" in big.fix
    ok = check(run, tmp_path, llama8b, H100x8, deepspeed={"zero_stage": 2})
    assert severities(ok) == ["ok"] and "8.03B parameters on 8 GPUs" in ok[0].title
    # DDP keeps 16 bytes per parameter on every V100: 128 GB of states on 32 GB GPUs
    [ddp] = check(run, tmp_path, llama8b, V100x4)
    assert ddp.severity.value == "error" and "zero_stage" in ddp.fix


def test_zero3_where_zero2_fits_is_information_with_the_change(run, tmp_path, llama8b):
    [slow] = check(run, tmp_path, llama8b, H100x8, deepspeed={"zero_stage": 3})
    assert slow.severity.value == "info" and "ZeRO-2 would fit too" in slow.title and "zero_stage = 2" in slow.fix


def test_a_machine_without_gpus_or_a_model_of_unknown_size_is_skipped(run, tmp_path, llama8b):
    plan = plan_of(llama_run(tmp_path))
    assert isinstance(run("memory-fit", plan=plan, model_shape=asdict(llama8b), gpus={"devices": []}), Skipped)
    unknown = run("memory-fit", plan=plan, model_shape={"error": "no model_type"}, gpus=recorded_gpus(H100x8))
    assert isinstance(unknown, Skipped) and "no model_type" in unknown.reason


P100x4 = "p100_pcie_4x_driver418_princeton_tiger.txt"  # 4 x 16 GB
LLAMA2_7B = FIXTURES / "model_config" / "Llama-2-7b-hf_resaved_float32.json"


@pytest.fixture(scope="module")
def llama2_7b():
    return closed_form(json.loads(LLAMA2_7B.read_text()))


def test_a_lora_plan_is_judged_on_its_adapters_and_keeps_them_in_every_candidate(run, tmp_path, llama8b):
    sections = {"deepspeed": {"zero_stage": 2}}
    full = memory_fit(plan_of(llama_run(tmp_path, **sections), gpus=recorded_gpus(H100x8)), llama8b, 80 * 2**30)
    lora = memory_fit(
        plan_of(llama_run(tmp_path, lora={"r": 16}, **sections), gpus=recorded_gpus(H100x8)), llama8b, 80 * 2**30
    )
    names = {t.name for t in lora.current.estimate.gpu}
    assert {"frozen base", "adapter weights", "adapter optimizer states"} <= names and "weights" not in names
    assert lora.run.lora.trainable == 41_943_040  # r 16 on Llama-3-8B's 7 projections x 32 layers
    assert lora.current.estimate.gpu_peak < 0.7 * full.current.estimate.gpu_peak  # 26.3 against 43.3 GiB
    assert {c.setting.quantize for c in lora.candidates} == {"none"}  # the 16-bit base fits: no QLoRA offered
    [found] = check(run, tmp_path, llama8b, H100x8, lora={"r": 16}, **sections)
    assert found.severity.value == "ok" and "8.03B parameters (41,943,040 trainable) on 8 GPUs" in found.title
    assert "LoRA, ZeRO-2" in found.title and found.evidence["trainable_parameters"] == 41_943_040


def test_memory_fit_offers_a_4bit_base_where_no_16bit_one_fits(run, tmp_path, llama2_7b):
    one_gpu = {"launch": {"nproc_per_node": 1}}
    [big] = check(run, tmp_path, llama2_7b, P100x4, lora={"r": 16}, **one_gpu)  # 13.5 GB of 16-bit base on 16 GB
    assert big.severity.value == "error" and "more than the GPU has" in big.title
    assert '[lora] quantize = "4bit"' in big.fix and big.evidence["recommended"]["quantize"] == "4bit"
    [qlora] = check(run, tmp_path, llama2_7b, P100x4, lora={"r": 16, "quantize": "4bit"}, **one_gpu)
    assert qlora.severity.value == "ok" and "QLoRA 4-bit base" in qlora.title and "8.4 GiB" in qlora.title
