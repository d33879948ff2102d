"""ddp-unused-parameters, and the plan's find_unused_parameters decision it explains: verdicts on plans resolved
from recorded unused_parameters facts (tests/fixtures/unused_parameters: what the probe gave for Gemma 3 4B,
with and without adapters, the tiny Qwen2 and a tiny Qwen3-MoE on torch 2.13 / transformers 5.25)."""

import dataclasses
import json

import pytest
from conftest import FIXTURES, make_run, plan_of, severities

from sftdoctor.checks import Skipped

RECORDED = FIXTURES / "unused_parameters"


def probed(name: str) -> dict:
    return json.loads((RECORDED / f"{name}.json").read_text())


def ddp_run(tmp_path, **sections):
    return make_run(tmp_path, launch={"nproc_per_node": 2}, **sections)


def test_a_vision_tower_a_text_step_never_reaches_turns_find_unused_parameters_on(run, tmp_path):
    probe = probed("gemma-3-4b-it_full")
    plan = plan_of(ddp_run(tmp_path), unused_parameters=probe)
    assert plan.ddp_find_unused_parameters is True
    assert "39 trainable tensors (vision tower)" in plan.reasons["ddp_find_unused_parameters"]
    [unused] = run("ddp-unused-parameters", plan=plan, unused_parameters=probe)
    assert unused.severity.value == "ok"
    assert "39 of 67 trainable tensors get no gradient" in unused.title
    assert "vision tower: model.vision_tower, model.multi_modal_projector" in unused.title
    assert "find_unused_parameters=True" in unused.title


def test_adapters_that_q_proj_v_proj_put_in_the_vision_tower_are_named(run, tmp_path):
    probe = probed("gemma-3-4b-it_lora_q_v")
    plan = plan_of(ddp_run(tmp_path, lora={"target_modules": ["q_proj", "v_proj"]}), unused_parameters=probe)
    assert plan.ddp_find_unused_parameters is True
    [unused] = run("ddp-unused-parameters", plan=plan, unused_parameters=probe)
    assert "LoRA adapters in the vision tower: base_model.model.model.vision_tower" in unused.title
    assert "vision_tower.encoder.layers.*.self_attn.v_proj.lora_A.default.weight (x2)" in unused.detail


def test_a_dense_model_keeps_the_search_off(run, tmp_path):
    probe = probed("tiny_qwen2_full")
    plan = plan_of(ddp_run(tmp_path), unused_parameters=probe)
    assert plan.ddp_find_unused_parameters is False
    [unused] = run("ddp-unused-parameters", plan=plan, unused_parameters=probe)
    assert severities([unused]) == ["ok"]
    assert "every trainable tensor (26) of Qwen2ForCausalLM gets a gradient" in unused.title


def test_a_mixture_of_experts_model_keeps_it_on_whatever_one_step_routed(run, tmp_path):
    probe = probed("qwen3_moe_tiny_full")
    model = {"raw_keys": ["num_experts", "moe_intermediate_size"]}
    plan = plan_of(ddp_run(tmp_path), unused_parameters=probe, model_config=model)
    assert plan.moe and plan.ddp_find_unused_parameters is True
    assert "mixture-of-experts" in plan.reasons["ddp_find_unused_parameters"]
    [unused] = run("ddp-unused-parameters", plan=plan, unused_parameters=probe)
    assert severities([unused]) == ["ok"] and "a mixture-of-experts model" in unused.title


def test_without_the_probe_it_says_it_could_not_tell(run, tmp_path):
    plan = plan_of(ddp_run(tmp_path))
    [unused] = run("ddp-unused-parameters", plan=plan)
    assert unused.severity.value == "info" and unused.title.startswith("not proven")
    assert "rehearsal" in unused.detail


def test_a_plan_that_left_the_search_off_over_unused_tensors_is_an_error(run, tmp_path):
    """A plan decided without the probe (an older resolved.json) meets the probe's answer."""
    probe = probed("gemma-3-4b-it_lora_all-linear")
    plan = plan_of(ddp_run(tmp_path, lora={"target_modules": "all-linear"}))
    assert plan.ddp_find_unused_parameters is False
    [unused] = run("ddp-unused-parameters", plan=plan, unused_parameters=probe)
    assert unused.severity.value == "error"
    assert "24 of 52 trainable tensors" in unused.title and "DDP's second step will fail" in unused.title
    assert "Expected to have finished reduction" in unused.detail


@pytest.mark.parametrize(
    "launch, sharding, why",
    [
        ({"nproc_per_node": 1}, {}, "one process"),
        ({"nproc_per_node": 2}, {"deepspeed": {"zero_stage": 2}}, "DeepSpeed's engine"),
        ({"nproc_per_node": 2}, {"fsdp": {}}, "FSDP reduce-scatters"),
    ],
)
def test_no_ddp_reducer_no_verdict(run, tmp_path, launch, sharding, why):
    sections = {"launch": launch, **sharding}
    plan = plan_of(make_run(tmp_path, **sections), unused_parameters=probed("gemma-3-4b-it_full"))
    assert plan.ddp_find_unused_parameters is False
    skipped = run("ddp-unused-parameters", plan=plan)
    assert isinstance(skipped, Skipped) and why in skipped.reason


def test_checkpointing_under_ddp_stays_non_reentrant_and_reentrant_with_the_search_on_is_an_error(run, tmp_path):
    probe = probed("gemma-3-4b-it_full")
    plan = plan_of(ddp_run(tmp_path, training={"gradient_checkpointing": True}), unused_parameters=probe)
    assert plan.checkpointing and not plan.checkpointing_reentrant
    unused, checkpointing = run("ddp-unused-parameters", plan=plan, unused_parameters=probe)
    assert checkpointing.severity.value == "ok" and checkpointing.explain == "gradient-checkpointing"
    assert "non-reentrant with find_unused_parameters=True" in checkpointing.title
    reentrant = dataclasses.replace(plan, checkpointing_reentrant=True)
    _, clash = run("ddp-unused-parameters", plan=reentrant, unused_parameters=probe)
    assert clash.severity.value == "error" and clash.explain == "gradient-checkpointing"
    assert "reentrant activation checkpointing with find_unused_parameters=True" in clash.title


@pytest.mark.slow  # imports TRL (seconds)
def test_the_trainer_is_given_the_plans_decision(tmp_path):
    from sftdoctor.facts.trainer_inputs import sft_config

    for name, on in (("gemma-3-4b-it_full", True), ("tiny_qwen2_full", False)):
        cfg = ddp_run(tmp_path, training={"output_dir": str(tmp_path / "out")})
        plan = plan_of(cfg, unused_parameters=probed(name))
        assert sft_config(plan, has_eval=False).ddp_find_unused_parameters is on
