"""End to end, on the CPU with the real stack: a tiny Qwen2 whose config.json vocab_size (300) is smaller than its
tokenizer's 384 ids. The preflight names it before launch (token-ids), a forced launch of sftdoctor's recipe dies
with torch's own `IndexError: index out of range in self`, and the triage of that log names it again."""

import json
import shutil

import pytest
from conftest import EXAMPLES

from sftdoctor.checks import run_check
from sftdoctor.facts import Facts, Inputs
from sftdoctor.findings import Severity
from sftdoctor.run import for_launch
from sftdoctor.train.launch import start, worker_env
from sftdoctor.triage import diagnose

RUN = """[model]
path = "model"
weights = "random"
[data]
train = "train.jsonl"
max_length = 64
[training]
global_batch_size = 4
per_device_batch_size = 4
max_steps = 2
packing = false
output_dir = "out"
"""


@pytest.mark.slow
def test_ids_past_the_embedding_are_named_before_launch_and_after_the_real_failure(tmp_path, monkeypatch, registry):
    shutil.copytree(EXAMPLES / "tiny" / "model", tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    (tmp_path / "model" / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    rows = (EXAMPLES / "tiny" / "data" / "train.jsonl").read_text().splitlines()[:8]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "run.toml").write_text(RUN)
    monkeypatch.chdir(tmp_path)

    facts = Facts(Inputs(config=tmp_path / "run.toml"))
    [before] = run_check(registry.checks["token-ids"], facts)  # the scan, in a child process
    assert before.severity is Severity.ERROR
    assert before.title.startswith("8 of 8 rows hold token ids past the embedding's 300 rows (largest ")
    assert before.evidence["tokenizer_size"] == 384 and before.evidence["mode"] == "full"

    plan = for_launch(facts.get("plan"), plugins=False, forced=True, rehearse=False)
    run_dir = tmp_path / "out"
    run_dir.mkdir()
    code = start(plan, run_dir, worker_env(plan, tmp_path / "run.toml", run_dir), resume=False)
    assert code != 0
    log = (run_dir / "train.log").read_bytes()
    assert b"IndexError: index out of range in self" in log

    with open(run_dir / "train.log", "rb") as stream:
        after = diagnose(stream, "train.log")
    assert after.root.finding.id == "token-ids"
    assert after.root.finding.evidence["signature"] == "token-ids-cpu-index"


@pytest.mark.slow
def test_chat_rows_without_a_template_are_named_before_launch_and_after_the_real_failure(
    tmp_path, monkeypatch, registry
):
    """The tiny example's tokenizer without its chat template (a base model's): TRL 1.16 adds none, transformers 5.25
    refuses while the trainer is built, after the model has loaded."""
    shutil.copytree(EXAMPLES / "tiny" / "model", tmp_path / "model")
    tokenizer_config = json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template")
    (tmp_path / "model" / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    rows = (EXAMPLES / "tiny" / "data" / "train.jsonl").read_text().splitlines()[:8]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "run.toml").write_text(RUN)
    monkeypatch.chdir(tmp_path)

    facts = Facts(Inputs(config=tmp_path / "run.toml"))
    [before] = run_check(registry.checks["chat-template"], facts)
    assert before.severity is Severity.ERROR
    assert before.title.endswith("/model) has no chat template, and 8 of the 8 rows are chat (messages)")

    plan = for_launch(facts.get("plan"), plugins=False, forced=True, rehearse=False)
    run_dir = tmp_path / "out"
    run_dir.mkdir()
    assert start(plan, run_dir, worker_env(plan, tmp_path / "run.toml", run_dir), resume=False) != 0
    log = (run_dir / "train.log").read_bytes()
    assert b"ValueError: Cannot use chat template functions because tokenizer.chat_template is not set" in log
    assert b"trl/trainer/sft_trainer.py" in log and b"_prepare_dataset" in log  # inside SFTTrainer's __init__
    with open(run_dir / "train.log", "rb") as stream:
        assert diagnose(stream, "train.log").root.finding.id == "chat-template"
