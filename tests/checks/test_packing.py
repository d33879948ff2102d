"""packing: the verdict follows the probe's proof and what the user asked."""

from conftest import make_run, severities


def test_packing_check_verdicts(run, tmp_path):
    isolated = {"isolated": True, "max_abs_diff": 2e-7, "tolerance": 1e-4, "attn_implementation": "sdpa", "model_type": "qwen2"}
    leaky = {**isolated, "isolated": False, "max_abs_diff": 0.8}
    auto = make_run(tmp_path)
    forced = make_run(tmp_path, training={"packing": True})
    assert severities(run("packing", run=auto, packing_probe=isolated)) == ["ok"]
    assert severities(run("packing", run=auto, packing_probe=leaky)) == ["info"]
    assert severities(run("packing", run=forced, packing_probe=leaky)) == ["error"]
    assert severities(run("packing", run=forced)) == ["warning"]
    assert severities(run("packing", run=make_run(tmp_path, training={"packing": False}))) == ["ok"]
