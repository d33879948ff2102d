"""bf16-support and model-dtype on recorded GPUs and real model configs."""

import pytest
from conftest import FIXTURES, NO_GPU, index, plan_of, recorded_gpus, run_of, severities

from sftdoctor.checks import Skipped
from sftdoctor.facts.configs import read_json_object, summarize_model_config

V100 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
QUADRO_TURING = "quadro_rtx8000_10x_driver470_gengwg.txt"
A100 = "a100_80g_pcie_4x_driver525_princeton.txt"


def plan(precision, gpus=None):
    return plan_of(run_of(model={"precision": precision}), gpus=recorded_gpus(gpus) if gpus else {"devices": []})


def model(name):
    path = FIXTURES / "model_config" / name
    return summarize_model_config(path, read_json_object(path, "config.json"))


@pytest.mark.parametrize("gpus", [V100, QUADRO_TURING])
def test_bf16_asked_of_pre_ampere_gpus_is_an_error_with_the_fp16_alternative(run, gpus):
    findings = run("bf16-support", gpus=recorded_gpus(gpus), plan=plan("bf16", gpus))
    assert severities(findings) == ["error"]
    assert "fp16" in findings[0].fix and "65504" in findings[0].detail


def test_bf16_from_a_deepspeed_json_counts_as_asked(run):
    ds = {"path": "ds.json", "config": {"bf16": {"enabled": True}}}
    findings = run("bf16-support", gpus=recorded_gpus(V100), deepspeed_config=ds)
    assert severities(findings) == ["error"] and "ds.json" in findings[0].title


def test_pre_ampere_without_a_request_is_advice(run):
    assert severities(run("bf16-support", gpus=recorded_gpus(V100))) == ["info"]
    assert severities(run("bf16-support", gpus=recorded_gpus(V100), plan=plan("fp16", V100))) == ["ok"]


def test_auto_precision_picks_fp16_on_v100_so_nothing_is_wrong(run):
    assert severities(run("bf16-support", gpus=recorded_gpus(V100), plan=plan("auto", V100))) == ["ok"]


def test_ampere_supports_bf16(run):
    findings = run("bf16-support", gpus=recorded_gpus(A100), plan=plan("bf16", A100))
    assert severities(findings) == ["ok"] and "A100" in findings[0].title


def test_fp16_on_ampere_is_a_warning(run):
    assert severities(run("bf16-support", gpus=recorded_gpus(A100), plan=plan("fp16", A100))) == ["warning"]


def test_no_gpu_skips(run):
    assert isinstance(run("bf16-support", gpus=NO_GPU), Skipped)


BF16_MODELS = [e["file"] for e in index("model_config") if e["dtype"] == "bfloat16"]


@pytest.mark.parametrize("name", BF16_MODELS)
def test_bf16_pretrained_model_in_fp16_warns_of_overflow(run, name):
    findings = run("model-dtype", model_config=model(name), plan=plan("fp16"))
    assert severities(findings) == ["warning"] and "65504" in findings[0].detail


def test_bf16_model_in_bf16_is_ok(run):
    findings = run(
        "model-dtype", model_config=model("SmolLM2-135M_merged_transformers5_bfloat16.json"), plan=plan("bf16")
    )
    assert severities(findings) == ["ok"] and '"dtype"' in findings[0].title


def test_v4_configs_are_read_through_torch_dtype(run):
    findings = run("model-dtype", model_config=model("Meta-Llama-3-8B.json"), plan=plan("fp16"))
    assert severities(findings) == ["warning"] and '"torch_dtype"' in findings[0].title


def test_float32_weights_are_flagged_for_their_memory(run):
    findings = run("model-dtype", model_config=model("Llama-2-7b-hf_resaved_float32.json"), plan=plan("bf16"))
    assert severities(findings) == ["info"] and "28 GB" in findings[0].detail


def test_fp16_model_trained_in_bf16_is_fine(run):
    assert severities(run("model-dtype", model_config=model("Llama-2-7b-chat-hf.json"), plan=plan("bf16"))) == ["ok"]


def test_config_without_dtype_is_information(run):
    assert severities(run("model-dtype", model_config=model("gpt2-large.json"))) == ["info"]


def test_auto_precision_follows_the_gpus(run):
    bf16_model = model("Qwen2-0.5B.json")
    assert severities(
        run("model-dtype", model_config=bf16_model, plan=plan("auto", V100), gpus=recorded_gpus(V100))
    ) == ["warning"]
    assert severities(
        run("model-dtype", model_config=bf16_model, plan=plan("auto", A100), gpus=recorded_gpus(A100))
    ) == ["ok"]
