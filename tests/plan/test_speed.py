"""sftdoctor.plan.speed: the GPUs' peak TFLOPS by name, model FLOPs per token, and seconds per step."""

import pytest
from conftest import recorded_gpus

from sftdoctor.plan.speed import DEFAULT_MFU, flops_per_token, peak_tflops, step_seconds

LLAMA3_8B = dict(parameters=8_030_261_248, layers=32, hidden=4096)


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H200", 989),
        ("NVIDIA H20", 148),
        ("NVIDIA L40S", 362),
        ("NVIDIA L40", 181),
        ("NVIDIA L4", 121),
        ("NVIDIA A10", 125),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA RTX A6000", 155),
        ("Tesla T4", 65),
    ],
)
def test_peak_tflops_matches_the_most_specific_name_first(name, tflops):
    assert peak_tflops(name) == tflops


@pytest.mark.parametrize(
    "fixture, tflops",
    [
        ("a100_80g_pcie_4x_driver525_princeton.txt", 312),
        ("h100_sxm_8x_driver550_modal_glossary.txt", 989),
        ("h800_8x_driver525_llm_action.txt", 989),
        ("b200_8x_driver580_cuda13_modal_glossary.txt", 2250),
        ("rtx3090_5x_driver535_fics_cluster.txt", 71),
        ("v100_pcie_4x_driver470_cuda114_princeton.txt", 125),
    ],
)
def test_peak_tflops_of_recorded_gpu_names(fixture, tflops):
    assert peak_tflops(recorded_gpus(fixture)["devices"][0]["name"]) == tflops


@pytest.mark.parametrize("name", ["Quadro RTX 8000", "Tesla P100-PCIE...", "", None])
def test_peak_tflops_is_unknown_for_other_gpus(name):
    assert peak_tflops(name) is None


@pytest.mark.parametrize("name, wrong", [("NVIDIA RTX A1000", 312), ("NVIDIA T400 4GB", 65)])
def test_peak_tflops_does_not_give_a_small_gpu_a_bigger_ones_peak(name, wrong):
    assert peak_tflops(name) != wrong


def test_flops_per_token_is_6_params_plus_12_layers_hidden_seq_len():
    assert flops_per_token(**LLAMA3_8B, seq_len=4096) == 6 * 8_030_261_248 + 12 * 32 * 4096 * 4096 == 54_624_018_432
    assert flops_per_token(1000, 2, 8, 0) == 6000


def test_step_seconds_is_tokens_times_flops_over_the_gpus_useful_flops():
    flops = flops_per_token(**LLAMA3_8B, seq_len=4096)
    seconds = step_seconds(64 * 4096, flops, 8, 989, DEFAULT_MFU, checkpointing=False)
    assert seconds == pytest.approx(64 * 4096 * 54_624_018_432 / (8 * 989e12 * 0.4))
    assert round(seconds, 2) == 4.52


def test_checkpointing_makes_a_step_four_thirds_longer():
    args = (262_144, 5.46e10, 8, 989.0, 0.4)
    assert step_seconds(*args, checkpointing=True) == pytest.approx(step_seconds(*args, checkpointing=False) * 4 / 3)


def test_twice_the_gpus_or_the_mfu_halves_a_step():
    base = step_seconds(262_144, 5.46e10, 8, 312.0, 0.4, False)
    assert step_seconds(262_144, 5.46e10, 16, 312.0, 0.4, False) == pytest.approx(base / 2)
    assert step_seconds(262_144, 5.46e10, 8, 312.0, 0.8, False) == pytest.approx(base / 2)
