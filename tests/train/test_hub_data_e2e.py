"""End to end, on the CPU with the real stack and no network (HF_HUB_OFFLINE=1): the tiny example trains from its
folder laid out as a hub dataset (examples/tiny/hub) and, streamed, from the same rows as an org/name id in a
datasets cache that the datasets library itself filled; each run records what it read, and `diff` tells the two
sources apart."""

import json
import math
import subprocess
import sys

import pytest
from hubdata import REVISION, hub_env, seed_cache
from trainrun import EXAMPLES, metrics, write_config

HUB = EXAMPLES / "tiny" / "hub"
SHARD = HUB / "data" / "{split}-00000-of-00001.parquet"


def run_config(folder, train, out, **data):
    return write_config(
        folder,
        {
            "model": {"path": str(EXAMPLES / "tiny" / "model"), "weights": "random"},
            "data": {"train": train, "eval_split": "test", "max_length": 128, **data},
            "training": {
                "per_device_batch_size": 8,
                "learning_rate": 3e-3,
                "max_steps": 4,
                "save_steps": 4,
                "eval_steps": 2,
                "logging_steps": 1,
                "packing": False,
                "seed": 0,
                "output_dir": str(out),
            },
            "launch": {"master_port": "auto"},
        },
    )


def train(config, env):
    return subprocess.run(
        [sys.executable, "-m", "sftdoctor", "train", str(config), "--no-rehearse"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=config.parent,
    )


@pytest.mark.slow
def test_the_tiny_example_trains_from_a_hub_folder_and_from_a_populated_cache_offline(tmp_path):
    home = tmp_path / "hf"
    env = hub_env(home)  # offline, and an empty cache: nothing but what the test puts there
    seed_cache(home, "tiny-org/tiny_chat", {s: [str(SHARD).format(split=s)] for s in ("train", "test")})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    folder_run, cache_run = tmp_path / "run-folder", tmp_path / "run-cache"

    done = train(run_config(tmp_path / "a", str(HUB), folder_run), env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"data            {HUB} (subset default, split train, eval split test): 1200 rows" in done.stdout
    kept = json.loads((folder_run / "facts.json").read_text())["data_files"]
    assert sorted(kept) == sorted(
        [str(SHARD).format(split="train"), str(SHARD).format(split="test"), str(HUB / "README.md")]
    )

    done = train(run_config(tmp_path / "b", "tiny-org/tiny_chat", cache_run, streaming=True), env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        "tiny-org/tiny_chat (subset default, split train, eval split test, revision 0123456789ab): 1200 rows, "
        "streamed (shuffled within 10,000 rows)"
    ) in done.stdout
    plan = json.loads((cache_run / "resolved.json").read_text())
    assert plan["data_source"]["revision"] == REVISION
    assert [p.rsplit("/", 1)[-1] for p in plan["train_files"] + plan["eval_files"]] == [
        "tiny_chat-train.arrow",
        "tiny_chat-test.arrow",
    ]
    for run_dir in (folder_run, cache_run):
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
        assert [r["step"] for r in records if "eval_loss" in r] == [2, 4]  # the test split, evaluated
    card = (cache_run / "README.md").read_text()  # the model card links the dataset and names what trained
    assert "datasets: [tiny-org/tiny_chat]" in card and "on tiny-org/tiny_chat (subset default, split train" in card
    assert plan["streaming"] and all(math.isfinite(r["loss"]) for r in metrics(cache_run))

    diff = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "diff", str(folder_run), str(cache_run)], capture_output=True, text=True
    )
    assert "data    data source: a local folder (subset default, split train, eval_split test) (A) vs " in diff.stdout
    assert f"tiny-org/tiny_chat (subset default, split train, eval_split test, revision {REVISION}) (B)" in diff.stdout
