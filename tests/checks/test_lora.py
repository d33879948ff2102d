"""lora-targets, qlora, learning-rate and the adapters' part of gradient-checkpointing, on plans of real
machines (GPU facts recorded from nvidia-smi outputs) and layer listings recorded from the real probe
(tests/fixtures/lora_modules/index.json)."""

import json

import pytest
from conftest import FIXTURES, NO_GPU, index, plan_of, recorded_gpus, run_of, severities

from sftdoctor.checks import Skipped
from sftdoctor.facts.configs import read_json_object, summarize_model_config

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"
A100x4 = "a100_80g_pcie_4x_driver525_princeton.txt"
V100x4 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
P100x4 = "p100_pcie_4x_driver418_princeton_tiger.txt"
TURINGx10 = "quadro_rtx8000_10x_driver470_gengwg.txt"
BNB_OK = {"installed": True, "version": "0.49.1", "import_ok": True, "import_error": None}
PACKAGES = {"peft": "0.21.2", "transformers": "5.24.0", "trl": "1.16.0"}


def listing(name="tiny_qwen2.json"):
    return json.loads((FIXTURES / "lora_modules" / name).read_text())


def model(name):
    path = FIXTURES / "model_config" / name
    return summarize_model_config(path, read_json_object(path, "config.json"))


def lora_plan(lora=None, gpus=H100x8, modules="tiny_qwen2.json", **sections):
    """The plan of a run with these [lora] keys (None: no [lora]) on a recorded machine and model listing."""
    facts = {"gpus": recorded_gpus(gpus) if isinstance(gpus, str) else gpus}
    if modules is not None:
        facts["lora_modules"] = listing(modules) if isinstance(modules, str) else modules
    return plan_of(run_of(**({"lora": lora} if lora is not None else {}), **sections), **facts)


def targets(run, lora=None, modules="tiny_qwen2.json", packages=PACKAGES, **sections):
    fact = listing(modules) if isinstance(modules, str) else modules
    facts = {"plan": lora_plan(lora, modules=fact, **sections), "lora_modules": fact}
    if packages is not None:
        facts["packages"] = packages
    return run("lora-targets", **facts)


# ---------------------------------------------------------------- lora-targets


def test_a_full_fine_tune_skips_the_adapter_checks(run):
    plan = lora_plan(None)
    for check in ("lora-targets", "qlora"):
        assert isinstance(run(check, plan=plan, lora_modules=listing(), gpus=recorded_gpus(H100x8)), Skipped)


def test_all_linear_on_the_tiny_model_says_what_the_adapters_train(run):
    [finding] = targets(run, {})
    assert finding.severity.value == "ok"
    # rank 16 on q/o (64->64), k/v (64->32), gate/up (64->192), down (192->64), in each of 2 layers
    assert finding.title == "adapters of rank 16 on 14 layers train 38,912 parameters (31.52% of 123,456)"
    assert finding.detail == (
        "Wrapped: down_proj x2, gate_proj x2, up_proj x2, k_proj x2, o_proj x2, q_proj x2, v_proj x2."
    )
    assert "lm_head" not in finding.detail  # the output head is not a target of all-linear
    assert finding.evidence["trainable_params"] == 38_912 and finding.evidence["missing"] == []


def test_llama2_7b_q_v_adapters_are_the_numbers_peft_prints(run):
    [finding] = targets(
        run,
        {"r": 8, "target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]},
        modules="Llama-2-7b-chat-hf.json",
    )
    assert finding.severity.value == "ok"
    trainable = 4_194_304 + 32000 * 4096
    assert finding.title == (
        f"adapters of rank 8 on 64 layers train {trainable:,} parameters "
        f"({trainable / 6_738_415_616:.2%} of 6,738,415,616)"
    )
    assert finding.detail == "Wrapped: q_proj x32, v_proj x32; trained in full: lm_head."


def test_a_misspelt_name_beside_good_ones_is_an_error_saying_peft_would_skip_it(run):
    [finding] = targets(run, {"target_modules": ["q_proj", "v_porj"]})
    assert finding.severity.value == "error"
    assert (
        finding.title == "[lora] target_modules names 1 layer this qwen2 does not have: v_porj (did you mean 'v_proj'?)"
    )
    assert "peft silently skips" in finding.detail and "Wrapped: q_proj x2." in finding.detail
    assert (
        "Its linear layers: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj." in finding.detail
    )
    assert finding.evidence["missing"] == ["v_porj"] and "all-linear" in finding.fix


def test_llama_names_on_gpt2_match_nothing_which_peft_refuses(run):
    [finding] = targets(run, {"target_modules": ["q_proj", "v_proj"]}, modules="gpt2.json")
    assert finding.severity.value == "error"
    assert "names 2 layers this gpt2 does not have: q_proj (did you mean 'c_proj'?); v_proj" in finding.title
    assert "peft refuses a list that matches nothing" in finding.detail and "silently" not in finding.detail
    assert "c_attn, c_fc, c_proj, lm_head" in finding.detail


def test_gpt2s_own_conv1d_names_are_fine(run):
    [finding] = targets(run, {"r": 8, "target_modules": ["c_attn"]}, modules="gpt2.json")
    assert finding.severity.value == "ok" and f"{12 * 8 * (768 + 2304):,} parameters" in finding.title
    assert finding.detail == "Wrapped: c_attn x12."


@pytest.mark.parametrize("saved, hint", [(["embed_token"], " (did you mean 'embed_tokens'?)"), (["wte"], "")])
def test_modules_to_save_not_in_the_model_is_an_error(run, saved, hint):
    [finding] = targets(run, {"modules_to_save": saved})
    assert finding.severity.value == "error"
    assert finding.title == f"[lora] modules_to_save names {saved[0]}, not a module of this model{hint}"
    assert finding.evidence == {"modules_to_save": saved}


def test_every_problem_of_the_targets_is_said_and_no_count_is_claimed(run):
    findings = targets(run, {"target_modules": ["q_proj", "v_porj"], "modules_to_save": ["embed_token"]})
    assert severities(findings) == ["error", "error"]
    assert not any("train" in f.title and "parameters" in f.title for f in findings)


@pytest.mark.parametrize("packages", [{"peft": None, "transformers": "5.24.0"}, {}])
def test_lora_without_peft_installed_is_an_error(run, packages):
    findings = targets(run, {}, packages=packages)
    assert severities(findings) == ["error"]
    assert findings[0].title == "[lora] is set but peft is not installed" and "pip install" in findings[0].fix


def test_unknown_packages_do_not_claim_peft_is_missing(run):
    assert severities(targets(run, {}, packages=None)) == ["ok"]


@pytest.mark.parametrize(
    "key, old, new, since", [("use_dora", "0.8.2", "0.9.0", "0.9"), ("use_rslora", "0.6.2", "0.7.1", "0.7")]
)
def test_dora_and_rslora_need_a_peft_that_has_them(run, key, old, new, since):
    findings = targets(run, {key: True}, packages={**PACKAGES, "peft": old})
    assert severities(findings) == ["error"]
    assert findings[0].title == (f"[lora] {key} = true needs peft {since} or newer; peft {old} is installed")
    assert f"{key} = false" in findings[0].fix
    assert severities(targets(run, {key: True}, packages={**PACKAGES, "peft": new})) == ["ok"]
    assert severities(targets(run, {key: False}, packages={**PACKAGES, "peft": old})) == ["ok"]


def test_dora_counts_its_magnitude_vectors(run):
    [finding] = targets(run, {"use_dora": True})
    magnitudes = 2 * (64 + 32 + 32 + 64 + 192 + 192 + 64)
    assert f"train {38_912 + magnitudes:,} parameters" in finding.title


def test_a_model_whose_layers_could_not_be_listed_is_a_warning_not_a_verdict(run):
    broken = {"error": "listing the model's layers failed: ValueError: Unrecognized model in /m"}
    findings = targets(run, {"target_modules": ["q_proj"]}, modules=broken)
    assert severities(findings) == ["warning"]
    assert findings[0].title == f"the model's layers could not be listed ({broken['error']})"
    assert "--select lora-targets" in findings[0].fix


# ---------------------------------------------------------------- qlora


def qlora(
    run,
    quantize="4bit",
    gpus=H100x8,
    bitsandbytes=BNB_OK,
    model_config=None,
    modules="Llama-2-7b-chat-hf.json",
    lora=None,
    **sections,
):
    gpu_facts = NO_GPU if gpus is None else recorded_gpus(gpus)
    plan = lora_plan({"quantize": quantize, **(lora or {})}, gpus=gpu_facts, modules=modules, **sections)
    facts = {"plan": plan, "gpus": gpu_facts}
    if bitsandbytes is not None:
        facts["bitsandbytes"] = bitsandbytes
    if model_config is not None:
        facts["model_config"] = model_config
    return run("qlora", **facts)


def test_lora_without_quantize_skips_qlora(run):
    assert isinstance(run("qlora", plan=lora_plan({}), gpus=recorded_gpus(H100x8)), Skipped)


@pytest.mark.parametrize("quantize", ["4bit", "8bit"])
def test_qlora_without_a_gpu_is_an_error(run, quantize):
    findings = qlora(run, quantize, gpus=None)
    assert severities(findings) == ["error"]
    assert findings[0].title == f'[lora] quantize = "{quantize}" needs a CUDA GPU, and none is visible'
    assert 'quantize = "none"' in findings[0].fix


def test_qlora_without_bitsandbytes_is_an_error(run):
    findings = qlora(run, bitsandbytes={"installed": False})
    assert severities(findings) == ["error"] and "not installed" in findings[0].title
    assert findings[0].fix == "pip install bitsandbytes"


def test_a_bitsandbytes_that_does_not_import_is_an_error_quoting_why(run):
    broken = {
        "installed": True,
        "version": "0.41.1",
        "import_ok": False,
        "import_error": "RuntimeError: CUDA Setup failed despite GPU being available.",
    }
    findings = qlora(run, bitsandbytes=broken)
    assert severities(findings) == ["error"]
    assert findings[0].title == (
        "bitsandbytes 0.41.1 does not import against this torch: "
        "RuntimeError: CUDA Setup failed despite GPU being available."
    )


# bitsandbytes' installation guide (0.48-0.50): NF4/FP4 on compute capability 6.0+, LLM.int8() on 7.5+.
EIGHT_BIT_TOO_OLD = {
    P100x4: "4x Tesla P100-PCIE... (compute capability 6.0)",
    V100x4: "4x Tesla V100-PCIE... (compute capability 7.0)",
}
MACHINES = [e["file"] for e in index("nvidia_smi") if recorded_gpus(e["file"])["devices"]]


def test_every_recorded_machine_is_judged():
    assert {P100x4, V100x4, TURINGx10, A100x4, H100x8} <= set(MACHINES)


@pytest.mark.parametrize("gpus", MACHINES)
def test_4bit_runs_on_every_recorded_gpu_from_pascal_on(run, gpus):
    findings = qlora(run, "4bit", gpus=gpus)
    assert severities(findings) == ["ok"], [f.title for f in findings]
    devices = recorded_gpus(gpus)["devices"]
    assert f"on {len(devices)}x {devices[0]['name']}" in findings[0].title
    assert findings[0].title.startswith("4-bit NF4 with double quantization base computing in ")


@pytest.mark.parametrize("gpus", MACHINES)
def test_8bit_needs_turing_or_newer(run, gpus):
    findings = qlora(run, "8bit", gpus=gpus)
    if gpus in EIGHT_BIT_TOO_OLD:
        assert severities(findings) == ["error"]
        assert findings[0].title == (
            f"{EIGHT_BIT_TOO_OLD[gpus]} are below compute capability 7.5, which bitsandbytes' 8bit layers need"
        )
        assert findings[0].fix == '[lora] quantize = "4bit"'
    else:
        assert severities(findings) == ["ok"] and findings[0].title.startswith("LLM.int8() base computing in ")


def test_a_gpu_too_old_even_for_4bit_is_told_to_drop_quantization(run):
    maxwell = {
        "devices": [{"index": 0, "name": "Tesla M40 24GB", "compute_capability": "5.2", "memory_total_mib": 24576}]
    }
    plan = lora_plan({"quantize": "4bit"}, gpus=maxwell, modules="Llama-2-7b-chat-hf.json")
    findings = run("qlora", plan=plan, gpus=maxwell, bitsandbytes=BNB_OK)
    assert severities(findings) == ["error"] and "below compute capability 6.0" in findings[0].title
    assert findings[0].fix == '[lora] quantize = "none" (LoRA in 16 bits)'


def test_qlora_under_zero3_says_the_quant_storage(run):
    findings = qlora(run, "4bit", deepspeed={"zero_stage": 3})
    assert severities(findings) == ["ok"]
    assert findings[0].title == (
        "4-bit NF4 with double quantization base computing in bfloat16 on 8x NVIDIA H100 80GB "
        "HBM3 (compute capability 9.0); stored as bfloat16 so ZeRO-3 can partition it"
    )
    assert findings[0].evidence["quant_storage"] == "bfloat16" and findings[0].evidence["bitsandbytes"] == "0.49.1"
    on_v100 = qlora(run, "4bit", gpus=V100x4, deepspeed={"zero_stage": 3})
    assert on_v100[0].title.endswith("; stored as float16 so ZeRO-3 can partition it")


@pytest.mark.parametrize("quantize, stage", [("4bit", 2), ("4bit", None), ("8bit", 3)])
def test_quant_storage_is_not_mentioned_where_zero3_does_not_partition_4bit_weights(run, quantize, stage):
    ds = {"deepspeed": {"zero_stage": stage}} if stage is not None else {}
    [finding] = qlora(run, quantize, **ds)
    assert "ZeRO-3" not in finding.title and finding.evidence["quant_storage"] == "uint8"


def test_zero3_parameter_offload_of_a_quantized_base_is_an_error(run):
    findings = qlora(run, "4bit", deepspeed={"zero_stage": 3, "offload_params": True})
    assert severities(findings) == ["error"]
    assert "offload_params with a quantized base" in findings[0].title and "offload_params = false" in findings[0].fix


def test_optimizer_offload_with_qlora_is_advice_sized_by_the_adapters(run):
    findings = qlora(run, "4bit", deepspeed={"zero_stage": 2, "offload_optimizer": True})
    assert severities(findings) == ["ok", "info"]
    assert "moves only the adapters' optimizer states" in findings[1].title
    assert (
        f"They are {16 * 39_976_960 / 2**20:,.0f} MiB" in findings[1].detail
    )  # r=16 all-linear on Llama-2-7B: 610 MiB
    assert "610 MiB" in findings[1].detail


BF16_SAVED = "SmolLM2-135M_merged_transformers5_bfloat16.json"


def test_fp16_compute_over_a_bf16_saved_model_is_a_warning(run):
    findings = qlora(run, "4bit", gpus=A100x4, model_config=model(BF16_SAVED), model={"precision": "fp16"})
    assert severities(findings) == ["ok", "warning"]
    assert findings[1].title == "QLoRA computes in fp16 (bnb_4bit_compute_dtype) over a model saved in bf16"
    assert "65504" in findings[1].detail and findings[0].evidence["compute_dtype"] == "float16"


@pytest.mark.parametrize("precision, saved", [("bf16", BF16_SAVED), ("fp16", "Llama-2-7b-chat-hf.json")])
def test_compute_dtype_that_matches_the_saved_one_is_fine(run, precision, saved):
    assert severities(qlora(run, "4bit", gpus=A100x4, model_config=model(saved), model={"precision": precision})) == [
        "ok"
    ]


def test_every_qlora_problem_is_said_at_once(run):
    findings = qlora(
        run, "8bit", gpus=None, bitsandbytes={"installed": False}, deepspeed={"zero_stage": 3, "offload_params": True}
    )
    assert severities(findings) == ["error", "error", "error"]


# ---------------------------------------------------------------- learning-rate


def rate_plan(rate, lora=True, **model):
    return plan_of(
        run_of(training={"learning_rate": rate}, model=model, **({"lora": {}} if lora else {})),
        gpus=recorded_gpus(H100x8),
    )


def test_a_full_fine_tunes_rate_with_lora_is_advice_to_raise_it(run):
    [finding] = run("learning-rate", plan=rate_plan(2e-5))
    assert finding.severity.value == "info"
    assert finding.title == "learning rate 2e-05 with LoRA is a full fine-tune's rate: the adapters will learn slowly"
    assert finding.fix == "[training] learning_rate = 2e-4" and "QLoRA (Dettmers et al., 2023)" in finding.detail


def test_a_lora_rate_for_a_full_fine_tune_is_advice_to_lower_it(run):
    [finding] = run("learning-rate", plan=rate_plan(2e-4, lora=False))
    assert finding.severity.value == "info"
    assert (
        finding.title == "learning rate 0.0002 for a full fine-tune is a LoRA rate: expect loss spikes and forgetting"
    )
    assert finding.fix.startswith("[training] learning_rate = 2e-5") and "Tulu 2" in finding.detail


@pytest.mark.parametrize(
    "rate, lora",
    [
        (1e-4, True),
        (2e-4, True),
        (3e-4, True),
        (5e-5, True),
        (1e-5, False),
        (2e-5, False),
        (5e-5, False),
        (9e-5, False),
    ],
)
def test_usual_rates_are_fine(run, rate, lora):
    [finding] = run("learning-rate", plan=rate_plan(rate, lora=lora))
    assert finding.severity.value == "ok"
    assert finding.title == f"learning rate {rate:g} is in the usual range for a {'LoRA' if lora else 'full fine-tune'}"


@pytest.mark.parametrize("rate, lora", [(4.9e-5, True), (1e-4, False)])
def test_the_edges_of_the_usual_ranges(run, rate, lora):
    assert severities(run("learning-rate", plan=rate_plan(rate, lora=lora))) == ["info"]


@pytest.mark.parametrize("lora", [True, False])
def test_random_weights_are_not_fine_tuned_so_the_rate_is_not_judged(run, lora):
    assert isinstance(run("learning-rate", plan=rate_plan(3e-3, lora=lora, weights="random")), Skipped)


# ---------------------------------------------------------------- gradient-checkpointing with adapters


def test_checkpointing_with_lora_says_gradients_reach_the_adapters(run):
    [finding] = run("gradient-checkpointing", plan=lora_plan({}))
    assert finding.severity.value == "ok"
    assert finding.title == (
        "on, non-reentrant (use_reentrant=False), passed as TrainingArguments.gradient_checkpointing; "
        "gradients reach the adapters (enable_input_require_grads)"
    )
    assert "None of the inputs have requires_grad=True" in finding.detail
    assert "enable_input_require_grads()" in finding.detail and "ZeRO-3" not in finding.detail
    assert finding.evidence["use_reentrant"] is False


def test_checkpointing_with_lora_under_zero3_is_reentrant_and_says_why(run):
    [finding] = run("gradient-checkpointing", plan=lora_plan({}, deepspeed={"zero_stage": 3}))
    assert finding.title.startswith("on, reentrant (use_reentrant=True), passed as TrainingArguments.")
    assert "Under ZeRO-3 TRL forces reentrant checkpointing for PEFT" in finding.detail
    assert finding.evidence["use_reentrant"] is True


@pytest.mark.parametrize("stage", [None, 3])
def test_a_full_fine_tune_has_no_adapter_advice(run, stage):
    ds = {"deepspeed": {"zero_stage": stage}} if stage is not None else {}
    [finding] = run("gradient-checkpointing", plan=lora_plan(None, **ds))
    assert "non-reentrant (use_reentrant=False)" in finding.title
    assert "enable_input_require_grads" not in finding.title + finding.detail


def test_lora_without_checkpointing_needs_no_input_grads(run):
    [finding] = run(
        "gradient-checkpointing",
        plan=lora_plan({}, training={"gradient_checkpointing": False}, deepspeed={"zero_stage": 3}),
    )
    assert finding.severity.value == "info" and "enable_input_require_grads" not in finding.title + finding.detail
