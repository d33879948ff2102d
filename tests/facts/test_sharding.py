"""The facts beside an FSDP config (facts/sharding.py): the model's classes from a child process, and what the
installed accelerate and transformers do with FSDP2 gradients on several meshes."""

from conftest import FIXTURES

from sftdoctor.facts import Facts, Inputs

TRL_FSDP2 = FIXTURES / "fsdp" / "trl_fsdp2.yaml"


def test_the_models_classes_come_from_a_child_built_on_the_meta_device():
    facts = Facts(Inputs(fsdp=TRL_FSDP2, model_config=FIXTURES / "model_config" / "gpt2.json"))
    found = facts.get("model_classes")
    assert found["architecture"] == "GPT2LMHeadModel" and found["no_split_modules"] == ["GPT2Block"]
    assert {"GPT2Block", "GPT2Attention", "GPT2MLP"} <= set(found["classes"])
    assert found["parameters"] == 124439808  # gpt2's 124M, the head tied to the embeddings


def test_the_models_classes_are_built_only_for_an_fsdp_config():
    facts = Facts(Inputs(model_config=FIXTURES / "model_config" / "gpt2.json"))
    assert facts.get("model_classes") is None
    assert "no FSDP config" in facts.why_missing("model_classes")


def test_a_config_the_child_cannot_build_is_an_error_fact_not_a_crash(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "no-such-architecture", "hidden_size": 8}')
    found = Facts(Inputs(fsdp=TRL_FSDP2, model_config=config)).get("model_classes")
    assert set(found) == {"error"} and "no-such-architecture" in found["error"]


def test_the_installed_stack_clips_fsdp2_gradients_one_mesh_at_a_time():
    """accelerate 1.16 (Accelerator._clip_grad_norm_dtensor_aware) and transformers 5.25
    (Trainer._mixed_mesh_grad_norm), read from their source files."""
    found = Facts(Inputs()).get("fsdp_stack")
    assert found == {"accelerate_clips_per_mesh": True, "trainer_clips_per_mesh": True}
