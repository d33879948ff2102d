"""The unused_parameters probe: asked only for DDP runs, and what it answers for real configs on the installed
stack (the recorded answers in tests/fixtures/unused_parameters are what the checks' tests replay)."""

import json

import pytest
from conftest import FIXTURES, make_run

from sftdoctor.facts.unused_params import measure, probe_unused_parameters

RECORDED = FIXTURES / "unused_parameters"
GEMMA = RECORDED / "configs" / "gemma-3-4b-it" / "config.json"


class Given(dict):
    """Facts as a probe reads them (`.get(name)`)."""


def facts_for(tmp_path, **sections):
    model = {"path": str(GEMMA), "config": json.loads(GEMMA.read_text())}
    return Given(run=make_run(tmp_path, **sections), model_config=model)


@pytest.mark.parametrize(
    "sections",
    [{"launch": {"nproc_per_node": 1}}, {"launch": {"nproc_per_node": 2}, "deepspeed": {"zero_stage": 2}}],
    ids=["one process", "deepspeed"],
)
def test_not_asked_where_no_ddp_reducer_runs(tmp_path, sections):
    assert probe_unused_parameters(facts_for(tmp_path, **sections)) is None


def test_not_asked_without_a_model_config(tmp_path):
    assert probe_unused_parameters(Given(run=make_run(tmp_path, launch={"nproc_per_node": 2}))) is None


@pytest.mark.slow  # one training step of a shrunk model with the real stack, in this process
@pytest.mark.parametrize(
    "recorded, lora",
    [
        ("gemma-3-4b-it_full", None),
        (
            "gemma-3-4b-it_lora_q_v",
            {"r": 16, "target_modules": ["q_proj", "v_proj"], "modules_to_save": [], "use_dora": False},
        ),
    ],
)
def test_a_text_step_of_gemma_3_leaves_the_vision_tower_without_gradients(recorded, lora):
    found = measure({"config": str(GEMMA), "lora": lora})
    assert found == json.loads((RECORDED / f"{recorded}.json").read_text())
    assert found["model_class"] == "Gemma3ForConditionalGeneration"
    assert all("vision_tower" in e["pattern"] or "multi_modal_projector" in e["pattern"] for e in found["unused"])
