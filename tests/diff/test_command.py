"""`sftdoctor diff` on two real runs of the tiny model that differ in their learning rate and one data row."""

import json
import re
import shutil
import subprocess
import sys

import pytest
from trainrun import config, train

pytestmark = pytest.mark.slow  # two short trainings


def sftdoctor(*args):
    return subprocess.run(
        [sys.executable, "-m", "sftdoctor", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_two_runs_that_part_are_told_apart_cause_first(tmp_path, tiny_data):
    data = tmp_path / "data"
    shutil.copytree(tiny_data["messages"], data)
    runs = []
    for name, lr in (("a", 3e-3), ("b", 3e-4)):
        (tmp_path / name).mkdir()
        cfg = config(tmp_path / name, data, training={"learning_rate": lr, "max_steps": 6, "save_steps": 6})
        proc = train(cfg, "--no-rehearse")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        runs.append(tmp_path / name / "out")
        assert (runs[-1] / "facts.json").is_file()
    proc = sftdoctor("diff", *runs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    parted = re.match(r"curves  the train losses part at step (\d+): ", lines[3])
    assert parted and 2 <= int(parted[1]) <= 4, lines  # within the warmup, where the two rates first differ
    assert lines[4] == "plan    learning_rate: 0.003 (A) vs 0.0003 (B)"
    assert lines[-1] == "1 difference (1 plan); the most likely causes first"
    same = sftdoctor("diff", runs[0], runs[0], "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["differences"] == []

    with open(data / "data" / "train.jsonl", "a") as f:  # the data changed under the same name
        f.write(
            json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}) + "\n"
        )
    cfg = config(
        tmp_path / "a", data, training={"learning_rate": 3e-3, "max_steps": 6, "save_steps": 6, "output_dir": "again"}
    )
    assert train(cfg, "--no-rehearse").returncode == 0
    doc = json.loads(sftdoctor("diff", runs[0], tmp_path / "a" / "again", "--json").stdout)
    assert [d["area"] for d in doc["differences"]][:1] == ["data"]


def test_bad_input_is_one_line(tmp_path):
    proc = sftdoctor("diff", tmp_path, tmp_path / "nope")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert (
        line == f"sftdoctor: error: {tmp_path}: holds no resolved.json; expected a run directory of `sftdoctor train`"
    )
