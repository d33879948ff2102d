"""sftdoctor.checks._common: what a DeepSpeed JSON says about precision, and the precision a run will use."""

import pytest
from conftest import FIXTURES, plan_of, recorded_gpus, run_of

from sftdoctor.checks._common import ds_flag, ds_precision_flags, requested_precision
from sftdoctor.facts.configs import read_json_object

A100 = "a100_80g_pcie_4x_driver525_princeton.txt"
V100 = "v100_pcie_4x_driver470_cuda114_princeton.txt"


def deepspeed(name: str) -> dict:
    """The deepspeed_config fact of a recorded DeepSpeed JSON."""
    path = FIXTURES / "deepspeed" / name
    return {"path": str(path), "config": read_json_object(path, "DeepSpeed config")}


@pytest.mark.parametrize(
    "config, flag",
    [
        ({"bf16": {"enabled": True}}, (True, "bf16")),
        ({"bf16": {"enabled": "auto"}}, ("auto", "bf16")),
        ({"bf16": {"enabled": False}}, (False, "bf16")),
        ({"bf16": {}}, (False, "bf16")),
        ({"bf16": True}, (None, None)),
        ({}, (None, None)),
    ],
)
def test_ds_flag_reads_enabled_and_a_section_without_it_is_disabled(config, flag):
    assert ds_flag(config, "bf16") == flag


def test_ds_flag_takes_the_first_section_present():
    assert ds_flag({"bfloat16": {"enabled": True}}, "bf16", "bfloat16") == (True, "bfloat16")
    assert ds_flag({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}}, "bf16", "bfloat16") == (False, "bf16")


@pytest.mark.parametrize(
    "name, flags",
    [
        ("axolotl_zero3_bf16.json", {"fp16": None, "bf16": True, "bf16_key": "bf16"}),
        ("DeepSpeedExamples_ds_config_fp16_z3.json", {"fp16": True, "bf16": None, "bf16_key": None}),
        ("LLaMA-Factory_ds_z3_config.json", {"fp16": "auto", "bf16": "auto", "bf16_key": "bf16"}),
        ("openfold_deepspeed_config.json", {"fp16": False, "bf16": True, "bf16_key": "bfloat16"}),
        ("transformers_ds_config_zero3_bf16.json", {"fp16": None, "bf16": "auto", "bf16_key": "bfloat16"}),
    ],
)
def test_ds_precision_flags_of_recorded_configs_read_the_legacy_bfloat16_key(name, flags):
    assert ds_precision_flags(deepspeed(name)["config"]) == flags


def test_the_plans_precision_and_reason_win():
    plan = plan_of(run_of(model={"precision": "bf16"}), gpus=recorded_gpus(A100))
    assert requested_precision(plan, deepspeed("DeepSpeedExamples_ds_config_fp16_z3.json")) == (
        "bf16",
        "[model].precision in the run config",
    )


def test_an_auto_plan_says_it_decided_for_these_gpus():
    assert requested_precision(plan_of(run_of(), gpus=recorded_gpus(A100)), None) == (
        "bf16",
        '[model].precision = "auto" on these GPUs',
    )
    assert requested_precision(plan_of(run_of(), gpus=recorded_gpus(V100)), None) == (
        "fp16",
        '[model].precision = "auto" on GPUs without bf16',
    )


@pytest.mark.parametrize(
    "name, key", [("axolotl_zero3_bf16.json", "bf16"), ("openfold_deepspeed_config.json", "bfloat16")]
)
def test_without_a_plan_a_hard_coded_bf16_in_the_deepspeed_json_decides(name, key):
    ds = deepspeed(name)
    assert requested_precision(None, ds) == ("bf16", f"{key}.enabled in {ds['path']}")


def test_without_a_plan_a_hard_coded_fp16_in_the_deepspeed_json_decides():
    ds = deepspeed("DeepSpeedExamples_ds_config_fp16_z3.json")
    assert requested_precision(None, ds) == ("fp16", f"fp16.enabled in {ds['path']}")


@pytest.mark.parametrize("ds", [None, {}, {"path": "ds.json", "config": {"bf16": {}}}])
def test_nothing_requested_without_a_plan_or_a_hard_coded_flag(ds):
    assert requested_precision(None, ds) == (None, "")


@pytest.mark.parametrize("name", ["LLaMA-Factory_ds_z3_config.json", "transformers_ds_config_zero3_bf16.json"])
def test_auto_flags_leave_the_precision_undecided_without_a_plan(name):
    assert requested_precision(None, deepspeed(name)) == (None, "")
