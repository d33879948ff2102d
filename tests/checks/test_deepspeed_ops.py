"""deepspeed-ops: the ops a DeepSpeed JSON makes DeepSpeed 0.19.8 compile at run time, against nvcc and the ops
prebuilt at install (the installed DeepSpeed's own git_version_info_installed.py for the latter)."""

import pytest
from conftest import recorded_gpus, severities

from sftdoctor.checks import Skipped
from sftdoctor.checks.deepspeed_ops import jit_ops
from sftdoctor.facts.packages import installed_ops, module_file

H100x8 = recorded_gpus("h100_sxm_8x_driver550_modal_glossary.txt")
NO_NVCC = {"cuda_home": None, "found_by": None, "nvcc": None, "nvcc_version": None}
NVCC_124 = {
    "cuda_home": "/usr/local/cuda-12.4",
    "found_by": "CUDA_HOME",
    "nvcc": "/usr/local/cuda-12.4/bin/nvcc",
    "nvcc_version": "12.4",
}
ADAMW = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}


def ds(optimizer=None, offload=None):
    cfg = {"zero_optimization": {"stage": 2}}
    if optimizer:
        cfg["optimizer"] = optimizer
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": offload}
    return {"path": "ds.json", "config": cfg}


def test_which_ops_each_optimizer_block_builds_and_with_what():
    assert jit_ops(ds()["config"]) == []  # the Trainer's torch AdamW
    assert jit_ops(ds(ADAMW)["config"]) == [("fused_adam", "nvcc")]
    assert jit_ops(ds(ADAMW, offload="cpu")["config"]) == [("cpu_adam", "g++")]
    assert jit_ops(ds({"type": "AdamW", "params": {"torch_adam": True}})["config"]) == []
    assert jit_ops(ds({"type": "Lamb"})["config"]) == [("fused_lamb", "nvcc")]
    assert jit_ops(ds({"type": "Lion"}, offload="cpu")["config"]) == [("cpu_lion", "g++")]


def test_fused_adam_without_nvcc_is_an_error_naming_the_op_and_the_ways_out(run):
    [f] = run(
        "deepspeed-ops",
        deepspeed_config=ds(ADAMW),
        toolkit=NO_NVCC,
        gpus=H100x8,
        deepspeed_defaults={"version": "0.19.8", "installed_ops": {"fused_adam": False}},
    )
    assert f.severity.value == "error" and "fused_adam" in f.title and "no CUDA toolkit" in f.title
    assert "optimizer" in f.fix and "CUDA_HOME" in f.fix and "DS_BUILD_FUSED_ADAM=1" in f.fix


@pytest.mark.parametrize(
    "facts",
    [
        {"toolkit": NVCC_124},  # nvcc is there to build it
        {"toolkit": NO_NVCC, "deepspeed_defaults": {"version": "0.19.8", "installed_ops": {"fused_adam": True}}},
    ],
)
def test_an_op_that_can_be_built_or_was_prebuilt_is_fine(run, facts):
    assert severities(run("deepspeed-ops", deepspeed_config=ds(ADAMW), gpus=H100x8, **facts)) == ["ok"]


def test_offload_builds_cpu_adam_with_g_plus_plus_and_no_block_builds_nothing(run):
    for config in (ds(ADAMW, offload="cpu"), ds()):
        assert severities(run("deepspeed-ops", deepspeed_config=config, toolkit=NO_NVCC, gpus=H100x8)) == ["ok"]


def test_without_the_toolkit_fact_it_says_it_cannot_judge(run):
    assert severities(run("deepspeed-ops", deepspeed_config=ds(ADAMW), gpus=H100x8)) == ["info"]


def test_without_gpus_it_does_not_apply(run):
    found = run(
        "deepspeed-ops",
        deepspeed_config=ds(ADAMW),
        toolkit=NO_NVCC,
        gpus={"devices": [], "driver_version": None, "cuda_version": None},
    )
    assert isinstance(found, Skipped)


def test_the_installed_deepspeed_records_which_ops_it_prebuilt():
    """The pip wheel prebuilds nothing: every op is False, fused_adam among them (DeepSpeed 0.19.8)."""
    ops = installed_ops(module_file("deepspeed", "git_version_info_installed.py"))
    assert ops.get("fused_adam") is False and ops.get("cpu_adam") is False
    assert installed_ops(None) == {}


def test_the_deepspeed_defaults_fact_carries_the_prebuilt_ops():
    from sftdoctor.facts.packages import probe_deepspeed_defaults

    assert probe_deepspeed_defaults(None)["installed_ops"]["fused_adam"] is False
