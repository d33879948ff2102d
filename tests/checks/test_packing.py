"""packing: the verdict follows the probe's proof and what the user asked."""

from conftest import make_run, plan_of, severities

# The probe's proof that packed samples stay isolated, on a Qwen2 under sdpa.
ISOLATED = {
    "isolated": True,
    "max_abs_diff": 2e-7,
    "tolerance": 1e-4,
    "attn_implementation": "sdpa",
    "model_type": "qwen2",
}


def test_packing_check_verdicts(run, tmp_path):
    leaky = {**ISOLATED, "isolated": False, "max_abs_diff": 0.8}
    auto = make_run(tmp_path)
    forced = make_run(tmp_path, training={"packing": True})
    assert severities(run("packing", run=auto, packing_probe=ISOLATED)) == ["ok"]
    assert severities(run("packing", run=auto, packing_probe=leaky)) == ["info"]
    assert severities(run("packing", run=forced, packing_probe=leaky)) == ["error"]
    assert severities(run("packing", run=forced)) == ["warning"]
    assert severities(run("packing", run=make_run(tmp_path, training={"packing": False}))) == ["ok"]


def test_auto_packing_under_sdpa_says_the_plan_left_it_off_and_why(run, tmp_path):
    auto = make_run(tmp_path)
    [finding] = run("packing", run=auto, packing_probe=ISOLATED, plan=plan_of(auto, packing_probe=ISOLATED))
    assert finding.severity.value == "info" and finding.title.startswith("off (auto: sdpa has no varlen kernel")
    assert "LengthGroupedSampler" in finding.detail
    flash = make_run(tmp_path, model={"attn_implementation": "flash_attention_2"})
    on = {**ISOLATED, "attn_implementation": "flash_attention_2"}
    [finding] = run("packing", run=flash, packing_probe=on, plan=plan_of(flash, packing_probe=on))
    assert finding.severity.value == "ok" and finding.title.startswith("on: packed samples stay isolated")
