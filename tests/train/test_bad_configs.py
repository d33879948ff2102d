"""A broken run config stops `sftdoctor train` before anything starts: one line per problem naming the
file and the key, exit 2, no traceback, nothing written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny"
GOOD = f'''[model]
path = "{TINY / "model"}"
weights = "random"
[data]
train = "{TINY / "data" / "train.jsonl"}"
[training]
output_dir = "out"
'''

BROKEN = [
    (
        "unknown section",
        GOOD + "[trianing]\nseed = 1\n",
        "[trianing]: unknown section; expected one of model, data, training, deepspeed, fsdp, launch, report, watch, "
        "lora, eval, slurm, checks (did you mean 'training'?)",
    ),
    (
        "unknown key",
        GOOD.replace("[training]\n", "[training]\nlearnig_rate = 1e-5\n"),
        "[training].learnig_rate: unknown key (did you mean 'learning_rate'?)",
    ),
    (
        "wrong type",
        GOOD.replace("[training]\n", '[training]\nper_device_batch_size = "4"\n'),
        "[training].per_device_batch_size: expected an integer from 1 to 65536, got '4'",
    ),
    (
        "bad choice",
        GOOD.replace('weights = "random"', 'weights = "random"\nprecision = "bf32"'),
        "[model].precision: expected one of auto, bf16, fp16, fp32, got 'bf32'",
    ),
    (
        "missing model path",
        GOOD.replace(f'path = "{TINY / "model"}"\n', ""),
        "[model].path: missing; expected a local folder or a hub id",
    ),
    ("missing data file", GOOD.replace("train.jsonl", "nope.jsonl"), "[data].train: file not found: "),
    (
        "deepspeed config and stage",
        GOOD + '[deepspeed]\nconfig = "ds.json"\nzero_stage = 2\n',
        "[deepspeed]: give either config or zero_stage, not both",
    ),
    (
        "stage out of range",
        GOOD + "[deepspeed]\nzero_stage = 4\n",
        "[deepspeed].zero_stage: expected an integer 0 to 3, got 4",
    ),
    (
        "offload params without stage 3",
        GOOD + "[deepspeed]\nzero_stage = 2\noffload_params = true\n",
        "[deepspeed].offload_params: offload_params needs zero_stage = 3",
    ),
    (
        "floor without its schedule",
        GOOD.replace("[training]\n", '[training]\nlr_scheduler = "linear"\nmin_lr_rate = 0.1\n'),
        'a learning-rate floor needs lr_scheduler = "cosine_with_min_lr"',
    ),
    (
        "two floors",
        GOOD.replace("[training]\n", "[training]\nmin_lr_rate = 0.1\nmin_lr = 1e-6\n"),
        "[training]: give either min_lr_rate or min_lr, not both",
    ),
    (
        "auto port on several nodes",
        GOOD + '[launch]\nnnodes = 2\nmaster_port = "auto"\n',
        '[launch].master_port: master_port = "auto" works on one node only',
    ),
    (
        "node rank past nnodes",
        GOOD + "[launch]\nnnodes = 2\nnode_rank = 2\n",
        "[launch].node_rank: node_rank 2 must be below nnodes 2",
    ),
    ("not TOML", "[model\npath = 1\n", "not valid TOML"),
    (
        "data rows of no known shape",
        None,
        "line 1: no known format; found ['question']; expected one of: messages (messages); sharegpt",
    ),
]


@pytest.mark.parametrize("name, text, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_config_is_one_line_and_exit_2(tmp_path, name, text, message):
    if text is None:
        (tmp_path / "q.jsonl").write_text(json.dumps({"question": "?"}) + "\n")
        text = GOOD.replace(str(TINY / "data" / "train.jsonl"), "q.jsonl")
    config = tmp_path / "run.toml"
    config.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "sftdoctor", "train", str(config)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert all(line.startswith("sftdoctor: error: ") for line in proc.stderr.strip().splitlines())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in tmp_path.iterdir() if p.suffix in (".toml", ".jsonl")
    )


def test_every_shipped_example_config_validates_and_passes_the_gate_here():
    examples = sorted((ROOT / "examples").glob("*.toml"))
    assert examples
    for example in examples:
        proc = subprocess.run(
            [sys.executable, "-m", "sftdoctor", "check", "--config", str(example), "--json"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode in (0, 1), (example, proc.stderr)
        doc = json.loads(proc.stdout)
        errors = [f for f in doc["findings"] if f["severity"] == "error"]
        assert not errors, (example.name, errors)
