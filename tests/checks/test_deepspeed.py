"""deepspeed-precision on real DeepSpeed configs from public repositories."""

import json

import pytest
from conftest import FIXTURES, index, plan_of, recorded_gpus, run_of, severities

from sftdoctor.facts.configs import read_json_object

A100 = "a100_80g_pcie_4x_driver525_princeton.txt"
V100 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
DS_019 = {"version": "0.19.8", "gradient_clipping": 1.0}
DS_OLD = {"version": "0.16.4", "gradient_clipping": 0.0}


def ds(name):
    return {"path": name, "config": read_json_object(FIXTURES / "deepspeed" / name, "DeepSpeed config")}


def plan(precision, nnodes=1, gpus=None):
    return plan_of(
        run_of(model={"precision": precision}, launch={"nnodes": nnodes}),
        gpus=recorded_gpus(gpus) if gpus else {"devices": []},
    )


@pytest.fixture
def precision(run):
    """deepspeed-precision on a config (a fixture file's name, or a {"path", "config"} object) under DeepSpeed
    0.19's defaults; `planned` is the run's precision (its plan on `machine`, a recorded `nvidia-smi` output whose
    GPU facts are given too) and `facts` add to or replace what the check is given."""

    def findings(config, planned=None, nnodes=1, machine=None, **facts):
        given = {"deepspeed_config": ds(config) if isinstance(config, str) else config, "deepspeed_defaults": DS_019}
        if planned:
            given["plan"] = plan(planned, nnodes=nnodes, gpus=machine)
        if machine:
            given["gpus"] = recorded_gpus(machine)
        return run("deepspeed-precision", **{**given, **facts})

    return findings


def titles(findings, severity):
    return [f.title for f in findings if f.severity.value == severity]


def test_auto_flags_follow_the_run_and_pass(precision):
    findings = precision("LLaMA-Factory_ds_z2_config.json", "bf16", machine=A100)
    assert severities(findings) == ["ok"] and "ZeRO-2, bf16" in findings[0].title


def test_fp16_and_bf16_both_enabled_is_the_deepspeed_refusal(run):
    cfg = {
        "path": "both.json",
        "config": {"fp16": {"enabled": True}, "bf16": {"enabled": "auto"}, "gradient_clipping": 1.0},
    }
    findings = run("deepspeed-precision", deepspeed_config=cfg, plan=plan("bf16"))
    assert titles(findings, "error") == ["both.json: fp16 and bf16 are both enabled"]
    assert "cannot be simultaneously enabled" in findings[0].detail


def test_hard_coded_fp16_on_bf16_gpus_with_a_bf16_model_warns(precision):
    findings = precision(
        "DeepSpeedExamples_ds_config_fp16_z3.json",
        machine=A100,
        model_config={"path": "config.json", "dtype": "bfloat16"},
    )
    warning = titles(findings, "warning")[0]
    assert "fp16 is hard-coded" in warning and "bf16" in warning and "bfloat16" in warning
    assert '"fp16": {"enabled": false}' in findings[0].fix


def test_hard_coded_fp16_on_v100_is_the_right_choice(precision):
    findings = precision("DeepSpeedExamples_ds_config_fp16_z3.json", machine=V100)
    assert "warning" not in severities(findings)


def test_legacy_bfloat16_key_left_auto_is_not_filled_by_transformers(precision):
    findings = precision("transformers_ds_config_zero3_bf16.json", "bf16", nnodes=2)
    assert any('legacy key "bfloat16"' in t for t in titles(findings, "warning"))


def test_zero3_offload_on_one_node_is_slow(precision):
    findings = precision("axolotl_zero3_bf16_cpuoffload_all.json", "bf16")
    assert any(
        "ZeRO-3 with offload_optimizer to cpu, offload_param to cpu on a single node" in t
        for t in titles(findings, "warning")
    )
    # Across several nodes offload may be the point: no warning.
    findings = precision("axolotl_zero3_bf16_cpuoffload_all.json", "bf16", nnodes=4)
    assert not any("single node" in t for t in titles(findings, "warning"))


@pytest.mark.parametrize("name", ["FastChat_deepspeed_config_s2.json", "transformers_ds_config_zero3_61c7ec9.json"])
def test_missing_gradient_clipping_depends_on_the_installed_deepspeed(precision, name):
    old = precision(name, "fp16", nnodes=2, gpus=recorded_gpus(V100), deepspeed_defaults=DS_OLD)
    assert any("no gradient_clipping: DeepSpeed 0.16.4 defaults to 0" in t for t in titles(old, "warning"))
    new = precision(name, "fp16", nnodes=2, gpus=recorded_gpus(V100))
    assert any("clips at 1.0 by default" in t for t in titles(new, "info"))
    assert '"gradient_clipping": "auto"' in next(f for f in new if "clips" in f.title).fix


def test_clipping_set_to_zero_warns(precision):
    findings = precision("DeepSpeedExamples_ds_fp16_z1_config.json", machine=V100)
    assert any("gradient_clipping is 0" in t for t in titles(findings, "warning"))


def test_every_real_config_gets_a_verdict(precision):
    for entry in index("deepspeed"):
        findings = precision(entry["file"])
        assert findings and all(f.id.split("/")[0] == "deepspeed-precision" for f in findings), entry["file"]
        json.dumps([f.to_json() for f in findings])


def test_hard_coded_flags_that_disagree_with_the_run_precision_are_the_transformers_mismatch(precision):
    findings = precision("axolotl_zero3_bf16.json", "fp16", nnodes=2)
    assert titles(findings, "error") == [
        "axolotl_zero3_bf16.json: bf16.enabled=true disagree(s) with the run's precision fp16 "
        "([model].precision in the run config)"
    ]
    findings = precision("axolotl_zero3_bf16.json", "bf16", nnodes=2)
    assert "error" not in severities(findings)


def test_clipping_zero_is_an_error_under_the_trainer(precision):
    findings = precision("DeepSpeedExamples_ds_fp16_z1_config.json", "fp16", machine=V100)
    assert any("gradient_clipping is 0" in t for t in titles(findings, "error"))


def test_hard_coded_fp16_beside_a_run_on_a_machine_without_gpus_is_the_same_error(precision):
    """precision = "auto" without GPUs is fp32 in the plan, so DeepSpeed's fp16=true is transformers'
    'ds fp16.enabled=True vs hf fp16|fp16_full_eval=False' ValueError, on every machine alike."""
    cfg = {"path": "ds.json", "config": {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}}
    findings = precision(cfg, "auto")
    assert titles(findings, "error") == [
        "ds.json: fp16.enabled=true disagree(s) with the run's precision fp32 "
        '([model].precision = "auto" without a GPU: full precision on the CPU)'
    ]


def test_fixed_optimizer_and_clipping_values_that_differ_from_the_run_are_the_transformers_refusal(precision):
    """DeepSpeedExamples' BERT Lamb config fixes lr 11e-3 and weight decay 0.01; openfold's fixes clipping 0.1:
    under the Trainer each must equal the run's ([training] learning_rate 2e-5, weight_decay 0, max_grad_norm 1)."""
    lamb = precision("DeepSpeedExamples_deepspeed_bsz64k_lamb_config_seq128.json", "fp16", machine=V100)
    [refused] = [f for f in lamb if "transformers refuses values" in f.title]
    assert "optimizer.params.lr = 0.011 (the run: 2e-05)" in refused.title
    assert (
        "optimizer.params.weight_decay = 0.01 (the run: 0.0)" in refused.title
        and "gradient_clipping" not in refused.title
    )
    [clip] = [
        f
        for f in precision("openfold_deepspeed_config.json", "bf16", machine=A100)
        if "transformers refuses" in f.title
    ]
    assert "gradient_clipping = 0.1 (the run: 1.0)" in clip.title
    every_auto = precision("stanford_alpaca_default_offload_opt_param.json", "bf16", machine=A100)
    assert not [f for f in every_auto if "transformers refuses" in f.title]


@pytest.mark.parametrize("name", ["FastChat_deepspeed_config_s2.json", "transformers_ds_config_zero3.json"])
def test_fp16_auto_without_a_bf16_section_trains_in_bf16_through_accelerate_and_says_so(precision, name):
    """Real configs with "fp16": {"enabled": "auto"} and no bf16 section, for a bf16 run."""
    findings = precision(name, "bf16", machine=A100)
    [added] = [f for f in findings if "bf16 section" in f.title]
    assert added.severity.value == "info" and added.evidence["resolved"]["bf16"] is True
    assert added.title == f"{name}: no bf16 section for a bf16 run; accelerate adds one, so it trains in bf16"
    assert added.fix == 'add "bf16": {"enabled": "auto"} so the JSON says what runs'
    fp16_run = precision(name, "fp16", machine=V100)
    assert not any("bf16 section" in f.title for f in fp16_run)


def test_accelerate_adds_the_bf16_section_a_bf16_run_lacks():
    """What the rule above rests on, in the installed transformers + accelerate: the JSON's "auto" filled from
    TrainingArguments(bf16=True), then accelerate's DeepSpeed plugin given the run's mixed precision."""
    from accelerate.utils import DeepSpeedPlugin
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    config = {"fp16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    hf = HfTrainerDeepSpeedConfig(config)
    hf.trainer_config_process(TrainingArguments("out", bf16=True, use_cpu=True, report_to=[]))
    plugin = DeepSpeedPlugin(hf_ds_config=hf)
    plugin.set_mixed_precision("bf16")
    assert plugin.deepspeed_config["fp16"]["enabled"] is False
    assert plugin.deepspeed_config["bf16"] == {"enabled": True}
