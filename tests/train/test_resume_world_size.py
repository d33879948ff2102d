"""A real ZeRO-2 checkpoint of 2 CPU ranks (DeepSpeed over gloo), resumed on 1: refused before launch by the
zero-resume check, in the same words by `check --config` and by the gate of `train --resume`."""

import json
import subprocess
import sys

import pytest
from trainrun import complete, config, metrics, train

pytestmark = pytest.mark.slow  # end-to-end: a real 2-rank DeepSpeed run


def zero2_config(folder, data, ranks: int, steps: int):
    """A ZeRO-2 run of `ranks` processes for `steps` steps, a checkpoint every 2 (the same file: one run)."""
    return config(
        folder,
        data,
        launch={"nproc_per_node": ranks},
        deepspeed={"zero_stage": 2},
        training={"packing": False, "max_steps": steps, "save_steps": 2},
    )


def test_a_zero2_checkpoint_of_two_ranks_is_not_resumed_on_one(tmp_path, tiny_data):
    two = zero2_config(tmp_path, tiny_data["text"], ranks=2, steps=2)
    first = train(two, "--no-rehearse")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run_dir = tmp_path / "out"
    assert complete(run_dir) == ["checkpoint-2"]
    before = metrics(run_dir)
    one = zero2_config(tmp_path, tiny_data["text"], ranks=1, steps=4)
    checked = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--config", str(one), "--select", "zero-resume", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 1, checked.stdout[-2000:] + checked.stderr[-2000:]
    [finding] = [f for f in json.loads(checked.stdout)["findings"] if f["id"] == "zero-resume/other-layout"]
    assert finding["severity"] == "error"
    assert finding["evidence"]["deepspeed"]["world_size"] == 2 and finding["evidence"]["launch"]["world_size"] == 1
    refused = train(one, "--resume")
    assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert finding["title"] in refused.stdout and "not starting: the checks above found errors" in refused.stdout
    assert "resuming from" not in refused.stdout and "rehearsing" not in refused.stdout  # nothing was launched
    assert metrics(run_dir) == before and complete(run_dir) == ["checkpoint-2"]
