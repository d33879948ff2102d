"""DeepSpeed JSONs judged by the installed DeepSpeed itself: every real config from public repositories is
accepted, broken ones are refused naming the key, and the CLI says so in one line a problem, exit 2."""

import json
import subprocess
import sys

import pytest
from conftest import FIXTURES, index

from sftdoctor.facts.deepspeed_probe import main

REAL = [e["file"] for e in index("deepspeed")]


# Real configs the installed DeepSpeed (0.19.8) refuses, and why: older releases took them.
REFUSED = {
    "transformers_ds_config_zero3_61c7ec9.json": ("zero_optimization.reduce_bucket_size", "greater than 0, got 0"),
    "openfold_deepspeed_config.json": ("", "NVIDIA Apex AMP integration has been removed"),
    "DeepSpeedExamples_deepspeed_bsz64k_lamb_config_seq128.json": ("", "Sparse Attention has been removed"),
}


@pytest.mark.parametrize("name", REAL)
def test_real_deepspeed_configs_are_judged_as_the_installed_deepspeed_judges_them(name):
    problems = main(str(FIXTURES / "deepspeed" / name))
    if name not in REFUSED:
        assert problems == []
        return
    key, says = REFUSED[name]
    assert [k for k, _ in problems] == [key] and says in problems[0][1]


@pytest.mark.parametrize(
    "config, key, says",
    [
        ({"zero_optimization": {"stage": "two"}}, "zero_optimization.stage", 'got "two"'),
        ({"zero_optimization": {"stage": 99}}, "zero_optimization.stage", "got 99"),
        ({"zero_optimization": {"stage": -1}}, "zero_optimization.stage", "got -1"),
        ({"zero_optimization": {"stage": 2.5}}, "zero_optimization.stage", "got 2.5"),
        ({"zero_optimization": [2]}, "zero_optimization", "expected an object, got [2]"),
        ({"fp16": True}, "fp16", "expected an object, got true"),
        ({"bf16": {"enabled": "yes"}}, "bf16.enabled", 'expected true, false or "auto", got "yes"'),
        ({"gradient_clipping": "high"}, "gradient_clipping", 'got "high"'),
        ({"zero_optimisation": {"stage": 2}}, "zero_optimisation", "did you mean 'zero_optimization'?"),
        ({"zero_optimization": {"stag": 2}}, "zero_optimization.stag", "did you mean 'stage'?"),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}},
            "zero_optimization.offload_param.device",
            'got "gpu"',
        ),
        ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu", "expected a positive integer"),
    ],
)
def test_broken_deepspeed_configs_are_refused_naming_the_key(tmp_path, config, key, says):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    problems = dict(main(str(path)))
    assert key in problems and says in problems[key], problems


def test_the_cli_refuses_a_broken_deepspeed_json_in_one_line_exit_2(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": "two"}}))
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--deepspeed", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f'sftdoctor: error: {path}: zero_optimization.stage: Input should be 0, 1, 2, 3 or 3, got "two"'
    ]
