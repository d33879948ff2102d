"""fsdp-config on real accelerate FSDP configs from public repositories (tests/fixtures/fsdp/index.json), each rule
also on one of them changed in the one place the rule reads."""

import functools
from pathlib import Path

import pytest
from conftest import FIXTURES, index, plan_of, recorded_gpus, run_of, severities

from sftdoctor.facts.configs import read_yaml_mapping, summarize_fsdp_config

FSDP = index("fsdp")
A100 = "a100_80g_pcie_4x_driver525_princeton.txt"
V100 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
STACK = {"torch": "2.13.0", "accelerate": "1.16.0", "transformers": "5.25.0"}  # the versions the rules were read from
CLIPS = {"accelerate_clips_per_mesh": True, "trainer_clips_per_mesh": True}  # accelerate 1.16 and transformers 5.25
LLAMA3_8B = {"path": "Meta-Llama-3-8B.json", "dtype": "bfloat16"}
LLAMA3_8B_SHAPE = {"parameters": 8030261248}  # counted on the meta device from its config.json (Meta-Llama-3-8B.json)

# Each real config judged alone (no model config, no GPU, no run config), under torch 2.13 and accelerate 1.16:
# the message ids it raises. "fsdp-config" is the ok finding; not-judged names what these facts leave open.
VERDICTS = {
    "LLaMA-Factory_fsdp2_config.yaml": {"fsdp-config", "not-judged"},
    "LLaMA-Factory_fsdp2_config_qwen35.yaml": {"fsdp-config", "not-judged"},
    "LLaMA-Factory_fsdp_config.yaml": {"fsdp-config", "not-judged"},
    "LLaMA-Factory_fsdp_config_multiple_nodes.yaml": {"fsdp-config", "not-judged"},
    "LLaMA-Factory_fsdp_config_offload.yaml": {"fsdp-config", "not-judged"},
    "accelerate-issue1943_fsdp_gpt2block.yaml": {"unknown-key", "not-judged"},
    "accelerate_config_yaml_templates_fsdp.yaml": {"state-dict-saves-no-model", "not-judged"},
    "accelerate_latest_fsdp.yaml": {"state-dict-saves-no-model", "not-judged"},
    "accelerate_tp_hsdp.yaml": {"ram-efficient-loading-off", "state-dict-saves-no-model", "not-judged"},
    "alignment-handbook_fsdp.yaml": {"state-dict-saves-no-model", "not-judged"},
    "alpaca_farm_rlhf_ppo_fsdp_llama_8gpu.yaml": {"unknown-key", "not-judged"},
    "diffusers_README_flux2_fsdp.yaml": {"invalid-value", "fsdp1-keys", "hybrid-shard-fsdp2", "not-judged"},
    "diffusers_README_z_image_fsdp.yaml": {"fsdp1-keys", "hybrid-shard-fsdp2", "not-judged"},
    "fms-hf-tuning_docs_training_cp_fsdp2.yaml": {
        "unknown-key",
        "unknown-top-key",
        "fsdp1-keys",
        "state-dict-saves-no-model",
        "not-judged",
    },
    "open-r1_fsdp.yaml": {"fsdp-config", "not-judged"},
    "peft_fsdp_config.yaml": {"state-dict-saves-no-model", "not-judged"},
    "peft_fsdp_config_qlora.yaml": {"state-dict-saves-no-model", "not-judged"},
    "peft_tests_fsdp2_config.yaml": {"ram-efficient-loading-off", "state-dict-saves-no-model", "not-judged"},
    "trl_context_parallel_2gpu.yaml": {"fsdp-config", "not-judged"},
    "trl_fsdp1.yaml": {"fsdp-config", "not-judged"},
    "trl_fsdp2.yaml": {"fsdp-config", "not-judged"},
    "trl_tests_fsdp2_minimal.yaml": {"state-dict-saves-no-model", "no-wrap", "not-judged"},
}


def config(name: str, replace: tuple[str, str] | None = None, tmp_path: Path | None = None) -> dict:
    """The fsdp_config fact of a fixture, or of its text with one `replace` made (written under tmp_path)."""
    path = FIXTURES / "fsdp" / name
    if replace:
        text = path.read_text(encoding="utf-8")
        assert replace[0] in text, replace
        path = tmp_path / name
        path.write_text(text.replace(replace[0], replace[1]), encoding="utf-8")
    return summarize_fsdp_config(path, read_yaml_mapping(path, "accelerate FSDP config"))


@functools.cache
def classes(model: str) -> dict:
    """The model_classes fact of a real model config, built on the meta device here (as the probe's child does)."""
    from sftdoctor.facts.sharding import list_classes

    return list_classes(str(FIXTURES / "model_config" / model), False)


@pytest.fixture
def judge(run):
    """fsdp-config on a fixture (a name, or an fsdp_config fact) under the installed stack's versions; `facts` add
    to or replace what the check is given."""

    def findings(fsdp, **facts):
        given = {"fsdp_config": config(fsdp) if isinstance(fsdp, str) else fsdp, "packages": STACK, "fsdp_stack": CLIPS}
        return run("fsdp-config", **{**given, **facts})

    return findings


def ids(findings) -> set[str]:
    return {f.id.removeprefix("fsdp-config/") for f in findings}


def said(findings, slug: str):
    [found] = [f for f in findings if f.id == f"fsdp-config/{slug}"]
    return found


def test_every_real_config_has_its_verdict():
    assert {e["file"] for e in FSDP} == set(VERDICTS)


@pytest.mark.parametrize("entry", FSDP, ids=[e["file"] for e in FSDP])
def test_each_real_config_gets_its_verdict(judge, entry):
    findings = judge(entry["file"])
    assert ids(findings) == VERDICTS[entry["file"]], [f.title for f in findings]
    assert config(entry["file"])["version"] == entry["fsdp_version"]


def test_a_clean_fsdp2_config_on_a100s_for_llama_is_ok_and_judges_every_rule(judge):
    findings = judge(
        "trl_fsdp2.yaml",
        gpus=recorded_gpus(A100),
        model_config=LLAMA3_8B,
        model_classes=classes("Meta-Llama-3-8B.json"),
    )
    assert severities(findings) == ["ok"], [f.title for f in findings]
    assert "FSDP2, mixed_precision bf16, FULL_STATE_DICT, TRANSFORMER_BASED_WRAP" in findings[0].title
    assert "17 of 17 rules judged" in findings[0].title


# ---------------------------------------------------------------- keys and values


def test_a_key_accelerate_never_reads_is_named_with_the_one_meant(judge):
    found = said(judge("accelerate-issue1943_fsdp_gpt2block.yaml"), "unknown-key")
    assert found.severity.value == "warning"
    assert "fsdp_backward_prefetch_policy (did you mean 'fsdp_backward_prefetch'?)" in found.title


def test_flat_parallelism_keys_at_the_top_are_refused_as_accelerate_refuses_the_file(judge):
    found = said(judge("fms-hf-tuning_docs_training_cp_fsdp2.yaml"), "unknown-top-key")
    assert found.severity.value == "error" and "use_parallelism_config" in found.title
    assert "parallelism_config_cp_size" in found.evidence["unknown"]


def test_a_misspelt_wrap_policy_is_the_value_accelerate_refuses(judge):
    found = said(judge("diffusers_README_flux2_fsdp.yaml"), "invalid-value")
    assert found.severity.value == "error" and "TRANSFOMER_BASED_WRAP" in found.title


def test_an_unquoted_no_is_read_as_false_and_named(judge, tmp_path):
    cfg = config("accelerate_latest_fsdp.yaml", ("mixed_precision: 'no'", "mixed_precision: no"), tmp_path)
    assert "write 'no'" in said(judge(cfg), "invalid-value").title


# ---------------------------------------------------------------- FSDP1 settings under FSDP2


def test_fsdp1_settings_under_fsdp2_are_named_as_dropped(judge):
    found = said(judge("diffusers_README_z_image_fsdp.yaml"), "fsdp1-keys")
    assert found.severity.value == "warning"
    assert "fsdp_forward_prefetch, fsdp_use_orig_params, fsdp_sync_module_states" in found.title
    assert "accelerate to-fsdp2" in found.fix


def test_flipping_only_the_version_of_an_fsdp1_config_drops_its_fsdp1_settings(judge, tmp_path):
    cfg = config("LLaMA-Factory_fsdp_config.yaml", ("fsdp_config:\n", "fsdp_config:\n  fsdp_version: 2\n"), tmp_path)
    found = said(judge(cfg), "fsdp1-keys")
    for key in ("sharding_strategy", "forward_prefetch", "backward_prefetch", "use_orig_params", "sync_module_states"):
        assert f"fsdp_{key}" in found.title


def test_a_strategy_name_in_fsdp2_reshard_after_forward_is_the_truth_value_error(judge, tmp_path):
    cfg = config("trl_fsdp1.yaml", ("fsdp_version: 1", "fsdp_version: 2"), tmp_path)
    found = said(judge(cfg), "reshard-strategy-string")
    assert found.severity.value == "error" and 'invalid truth value full_shard"' in found.title
    assert found.fix == "fsdp_reshard_after_forward: true"


def test_fsdp1_reshard_after_forward_without_a_strategy_is_not_used(judge, tmp_path):
    assert "reshard-ignored-fsdp1" not in ids(judge("trl_fsdp1.yaml"))  # FULL_SHARD: what the launcher uses anyway
    cfg = config(
        "trl_fsdp1.yaml", ("reshard_after_forward: FULL_SHARD", "reshard_after_forward: SHARD_GRAD_OP"), tmp_path
    )
    found = said(judge(cfg), "reshard-ignored-fsdp1")
    assert "FULL_SHARD is" in found.title and "fsdp_sharding_strategy: SHARD_GRAD_OP" in found.fix


def test_hybrid_shard_under_fsdp2_says_what_accelerate_does_and_how_to_get_replicas(judge, tmp_path):
    found = said(judge("diffusers_README_z_image_fsdp.yaml"), "hybrid-shard-fsdp2")
    assert "sharded over all ranks of all nodes" in found.title
    cfg = config(
        "diffusers_README_z_image_fsdp.yaml",
        ("distributed_type: FSDP\n", "distributed_type: FSDP\nnum_machines: 2\nnum_processes: 16\n"),
        tmp_path,
    )
    assert "dp_replicate_size 2 x dp_shard_size 8" in said(judge(cfg), "hybrid-shard-fsdp2").fix


# ---------------------------------------------------------------- the stack, the GPUs, the model, the run


@pytest.mark.parametrize(
    "packages,severity,phrase",
    [
        ({**STACK, "torch": "2.5.1"}, "error", "older than FSDP2's 2.6"),
        ({**STACK, "accelerate": "1.5.2"}, "error", "has no FSDP2"),
    ],
)
def test_fsdp2_on_a_stack_too_old_for_it(judge, packages, severity, phrase):
    found = said(judge("trl_fsdp2.yaml", packages=packages), "fsdp2-too-old")
    assert found.severity.value == severity and phrase in found.title


def test_ignored_modules_before_torch_2_7_are_dropped(judge, tmp_path):
    cfg = config("trl_fsdp2.yaml", ("fsdp_version: 2", "fsdp_version: 2\n  fsdp_ignored_modules: visual"), tmp_path)
    found = said(judge(cfg, packages={**STACK, "torch": "2.6.0"}), "fsdp2-too-old")
    assert found.severity.value == "warning" and "fsdp_ignored_modules is dropped" in found.title
    assert "fsdp2-too-old" not in ids(judge(cfg))


def test_without_torch_the_fsdp2_stack_is_said_not_judged(judge):
    found = said(judge("trl_fsdp2.yaml", packages={"accelerate": "1.16.0"}), "not-judged")
    assert "the stack FSDP2 needs (torch not installed here" in found.title


def test_bf16_on_v100s_is_an_error_and_on_a100s_is_fine(judge):
    found = said(judge("trl_fsdp2.yaml", gpus=recorded_gpus(V100)), "bf16-unsupported")
    assert found.severity.value == "error" and "V100" in found.title
    assert "bf16-unsupported" not in ids(judge("trl_fsdp2.yaml", gpus=recorded_gpus(A100)))
    assert "bf16 on these GPUs (no NVIDIA GPU visible here" in said(judge("trl_fsdp2.yaml"), "not-judged").title


def test_fp16_for_a_bf16_model_warns_and_no_mixed_precision_is_said(judge, tmp_path):
    cfg = config("trl_fsdp2.yaml", ("mixed_precision: bf16", "mixed_precision: fp16"), tmp_path)
    found = said(judge(cfg, model_config=LLAMA3_8B), "mixed-precision")
    assert found.severity.value == "warning" and "fp16 for a model whose weights are bfloat16" in found.title
    pure = said(judge("peft_fsdp_config_qlora.yaml", model_config=LLAMA3_8B), "mixed-precision")
    assert pure.severity.value == "info" and "no fp32 master weights" in pure.title


def test_the_yaml_precision_against_the_runs(judge):
    found = said(judge("trl_fsdp2.yaml", plan=plan_of(run_of(model={"precision": "fp16"}))), "precision-mismatch")
    assert "mixed_precision bf16 but the run's precision is fp16" in found.title
    assert "precision-mismatch" not in ids(judge("trl_fsdp2.yaml", plan=plan_of(run_of(model={"precision": "bf16"}))))


def test_ram_efficient_loading_off_says_how_much_host_ram_the_ranks_take(judge):
    findings = judge("peft_tests_fsdp2_config.yaml", model_config=LLAMA3_8B, model_shape=LLAMA3_8B_SHAPE)
    found = said(findings, "ram-efficient-loading-off")
    assert "2 x 15.0 GiB = 30 GiB in bfloat16" in found.title
    random = judge("peft_tests_fsdp2_config.yaml", run=run_of(model={"weights": "random"}))
    assert "ram-efficient-loading-off" not in ids(random)


def test_ram_efficient_loading_with_sync_module_states_false_is_the_launchers_refusal(judge, tmp_path):
    assert "ram-loading-without-sync" not in ids(judge("diffusers_README_z_image_fsdp.yaml"))  # both false
    cfg = config(
        "diffusers_README_z_image_fsdp.yaml",
        ("fsdp_cpu_ram_efficient_loading: false", "fsdp_cpu_ram_efficient_loading: true"),
        tmp_path,
    )
    found = said(judge(cfg), "ram-loading-without-sync")
    assert found.severity.value == "error" and "set `--fsdp_sync_module_states` to `True`" in found.title


def test_fsdp_activation_checkpointing_with_the_runs_is_refused(judge):
    on = plan_of(run_of(training={"gradient_checkpointing": True}))
    found = said(judge("trl_context_parallel_2gpu.yaml", plan=on), "checkpointing-twice")
    assert found.severity.value == "error" and "transformers refuses the pair" in found.title
    off = plan_of(run_of(training={"gradient_checkpointing": False}))
    assert "checkpointing-twice" not in ids(judge("trl_context_parallel_2gpu.yaml", plan=off))
    unknown = said(judge("trl_context_parallel_2gpu.yaml"), "not-judged")
    assert "activation checkpointing twice (no run config given" in unknown.title


def test_a_run_that_trains_with_the_config_checkpoints_once_and_is_not_refused(judge):
    """`[fsdp] config` = this YAML (FSDP's checkpointing on) with the run's gradient checkpointing on: the plan
    hands the Trainer only FSDP's (run/fsdp.py trainer_checkpointing), so transformers has no pair to refuse."""
    path = str(FIXTURES / "fsdp" / "trl_context_parallel_2gpu.yaml")
    run = run_of(training={"gradient_checkpointing": True}, fsdp={"config": path}, launch={"nproc_per_node": 2})
    plan = plan_of(run, fsdp_config=config("trl_context_parallel_2gpu.yaml"))
    assert plan.checkpointing and plan.fsdp["activation_checkpointing"] is True
    assert "checkpointing-twice" not in ids(judge("trl_context_parallel_2gpu.yaml", plan=plan, run=run))


def test_a_sharded_state_dict_saves_no_model_and_says_how_to_merge(judge):
    found = said(judge("peft_tests_fsdp2_config.yaml"), "state-dict-saves-no-model")
    assert "Trainer.save_model writes no model" in found.title and "accelerate merge-weights" in found.fix
    default = said(judge("trl_tests_fsdp2_minimal.yaml"), "state-dict-saves-no-model")
    assert "fsdp_state_dict_type absent: FSDP2's default" in default.title
    assert "state-dict-saves-no-model" not in ids(judge("trl_fsdp2.yaml"))


def test_local_state_dict_is_refused_by_fsdp2(judge, tmp_path):
    cfg = config("trl_fsdp2.yaml", ("FULL_STATE_DICT", "LOCAL_STATE_DICT"), tmp_path)
    assert said(judge(cfg), "local-state-dict").severity.value == "error"


# ---------------------------------------------------------------- wrapping


def test_a_wrap_class_of_another_model_is_named_with_the_models_own(judge):
    findings = judge("LLaMA-Factory_fsdp2_config_qwen35.yaml", model_classes=classes("Qwen2-0.5B.json"))
    found = said(findings, "wrap-class-missing")
    assert found.severity.value == "error"
    assert "'Qwen3_5DecoderLayer' (did you mean 'Qwen2DecoderLayer'?)" in found.title
    assert "Qwen2DecoderLayer" in found.detail and "(Qwen2DecoderLayer)" in found.fix
    fits = judge("accelerate-issue1943_fsdp_gpt2block.yaml", model_classes=classes("gpt2.json"))
    assert "wrap-class-missing" not in ids(fits)


def test_a_space_after_the_comma_names_a_class_no_model_has(judge, tmp_path):
    cfg = config("LLaMA-Factory_fsdp2_config_qwen35.yaml", (",Qwen3_5VisionBlock", ", Qwen3_5VisionBlock"), tmp_path)
    assert "' Qwen3_5VisionBlock'" in said(judge(cfg), "wrap-class-missing").title  # without a model config too


def test_no_wrap_policy_makes_the_layers_one_unit(judge):
    found = said(judge("trl_tests_fsdp2_minimal.yaml", model_shape=LLAMA3_8B_SHAPE), "no-wrap")
    assert "absent (NO_WRAP)" in found.title and "(15.0 GiB in 16-bit)" in found.title
    assert "no-wrap" not in ids(judge("trl_fsdp2.yaml", model_classes=classes("Meta-Llama-3-8B.json")))


# ---------------------------------------------------------------- clipping and QLoRA


@pytest.mark.parametrize(
    "stack,severity",
    [
        ({"accelerate_clips_per_mesh": False, "trainer_clips_per_mesh": False}, "error"),
        ({"accelerate_clips_per_mesh": False, "trainer_clips_per_mesh": True}, "info"),
        (CLIPS, None),
    ],
)
def test_clipping_over_ignored_and_sharded_parameters(judge, tmp_path, stack, severity):
    cfg = config("trl_fsdp2.yaml", ("fsdp_version: 2", "fsdp_version: 2\n  fsdp_ignored_modules: visual"), tmp_path)
    findings = judge(cfg, fsdp_stack=stack)
    if severity is None:
        assert "clipping-mixed-dtensor" not in ids(findings)
    else:
        assert said(findings, "clipping-mixed-dtensor").severity.value == severity


def test_qlora_under_fsdp1_needs_a_float_storage(judge):
    qlora = run_of(lora={"quantize": "4bit"}, model={"precision": "bf16"})
    found = said(judge("peft_fsdp_config_qlora.yaml", run=qlora, plan=plan_of(qlora)), "qlora-quant-storage")
    assert found.severity.value == "error" and "Cannot flatten integer dtype tensors" in found.detail
    assert "bnb_4bit_quant_storage = torch.bfloat16" in found.fix


@pytest.mark.parametrize("torch,severity", [("2.13.0", "warning"), ("2.6.0", "error")])
def test_qlora_under_fsdp2_with_uint8_storage(judge, torch, severity):
    qlora = run_of(lora={"quantize": "4bit"}, model={"precision": "bf16"})
    findings = judge("peft_tests_fsdp2_config.yaml", run=qlora, plan=plan_of(qlora), packages={**STACK, "torch": torch})
    assert said(findings, "qlora-quant-storage").severity.value == severity


# ---------------------------------------------------------------- [fsdp] needs ranks to shard over


def test_fsdp_in_one_process_is_refused_as_the_trainer_would_and_several_pass(tmp_path):
    from conftest import make_run, plan_of

    from sftdoctor.checks.fsdp import fsdp_world

    one = plan_of(make_run(tmp_path, fsdp={}, launch={"nproc_per_node": 1}))
    [refused] = fsdp_world(one)
    assert refused.id == "fsdp-world/one-process" and refused.severity.value == "error"
    assert "Using fsdp only works in distributed training." in refused.title
    [fine] = fsdp_world(plan_of(make_run(tmp_path, fsdp={}, launch={"nproc_per_node": 2})))
    assert fine.severity.value == "ok" and "2 ranks" in fine.title
    assert fsdp_world(plan_of(make_run(tmp_path, launch={"nproc_per_node": 1}))) == []
