"""`sftdoctor eval` with the real lm-evaluation-harness on tiny models built here (random weights: the
numbers do not matter, the command's behaviour does) and the tiny example's local tasks. The fine-tuned
model beating its base is tests/train/test_sft.py's bundled-example test."""

import json
import shutil

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from sftdoctor.cli import main
from sftdoctor.eval.command import table
from sftdoctor.eval.harness import differences

TASKS = EXAMPLES / "tiny" / "tasks"


def invoke(*args):
    return CliRunner().invoke(main, ["eval", *map(str, args)])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A random tiny Qwen2 saved with its tokenizer, and a LoRA adapter on it (as sftdoctor saves one)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(EXAMPLES / "tiny" / "model"))
    model.save_pretrained(root / "base")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EXAMPLES / "tiny" / "model" / name, root / "base" / name)
    adapter = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    adapter.peft_config["default"].base_model_name_or_path = str(root / "base")
    adapter.save_pretrained(root / "adapter")
    return root


@pytest.mark.slow
def test_a_model_and_its_base_side_by_side_with_settings_recorded_next_to_the_model(models):
    result = invoke(
        models / "adapter",
        "--tasks",
        "tiny_count_choice,tiny_count_gen",
        "--include",
        TASKS,
        "--base",
        models / "base",
        "--limit",
        8,
    )
    assert result.exit_code == 0, result.output
    assert "task" in result.output and "difference" in result.output and "tiny_count_gen" in result.output
    doc = json.loads((models / "adapter" / "eval.json").read_text())
    assert doc["target"]["kind"] == "adapter" and doc["base"]["target"]["kind"] == "model"
    choice = doc["metrics"]["tiny_count_choice"]["acc"]
    assert 0 <= choice["value"] <= 1 and choice["stderr"] > 0
    settings = doc["settings"]
    assert settings["limit"] == 8 and settings["generation"]["tiny_count_gen"]["until"] == ["<|im_end|>"]
    assert settings["task_versions"] == {"tiny_count_choice": 1.0, "tiny_count_gen": 1.0}
    assert set(doc["base"]["metrics"]) == {"tiny_count_choice", "tiny_count_gen"}


def count_choice(target, limit: int, out, *flags):
    """`sftdoctor eval` of tiny_count_choice on `limit` rows, its result written to `out`."""
    return invoke(target, "--tasks", "tiny_count_choice", "--include", TASKS, "--limit", limit, "--out", out, *flags)


@pytest.mark.slow
def test_a_result_compares_only_with_one_of_the_same_settings(models, tmp_path):
    first = tmp_path / "a.json"
    assert count_choice(models / "base", 5, first).exit_code == 0
    same = count_choice(models / "adapter", 5, tmp_path / "b.json", "--compare", first, "--json")
    assert same.exit_code == 0, same.output
    doc = json.loads(same.output[same.output.index("{") :])
    assert doc["compared"]["file"] == str(first) and "tiny_count_choice" in doc["compared"]["metrics"]
    other = count_choice(models / "adapter", 6, tmp_path / "c.json", "--compare", first)
    assert other.exit_code == 2
    assert "evaluated with other settings" in other.output and "limit: 5 vs 6" in other.output
    assert not (tmp_path / "c.json").exists()  # refused before anything was written


@pytest.mark.slow
def test_an_unknown_task_is_named_with_a_did_you_mean_before_any_model_loads(models):
    result = invoke(models / "base", "--tasks", "tiny_cuont_gen", "--include", TASKS)
    assert result.exit_code == 2
    assert "no lm-eval task 'tiny_cuont_gen' (did you mean 'tiny_count_gen'?)" in result.output
    assert "evaluating" not in result.output


def broken_copy(models, tmp_path, name, damage):
    folder = tmp_path / name
    shutil.copytree(models / "base", folder)
    damage(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("case", ["weights cut", "config not JSON", "out is a folder", "more shots than the split"])
def test_a_model_or_option_that_cannot_be_used_is_one_line_and_nothing_written(models, tmp_path, case):
    """Each one crashed inside transformers, safetensors or lm-eval with a traceback; --out a folder after the
    whole evaluation had run."""
    target, extra, says = models / "base", [], None
    if case == "weights cut":
        target = broken_copy(
            models,
            tmp_path,
            "cut",
            lambda f: (f / "model.safetensors").write_bytes(
                (models / "base" / "model.safetensors").read_bytes()[:1000]
            ),
        )
        says = f"{target}: cannot be loaded (SafetensorError: "
    elif case == "config not JSON":
        target = broken_copy(models, tmp_path, "cfg", lambda f: (f / "config.json").write_bytes(b"\x00\x01"))
        says = f"{target / 'config.json'}: not valid JSON"
    elif case == "out is a folder":
        (tmp_path / "folder").mkdir()
        extra, says = ["--out", tmp_path / "folder"], f"{tmp_path / 'folder'}: --out: is a folder"
    else:
        extra, says = ["--num-fewshot", 100000], "--num-fewshot: 100000 few-shot examples: more than"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = invoke(target, "--tasks", "tiny_count_choice", "--include", TASKS, "--limit", 2, *extra)
    assert result.exit_code == 2, result.output
    assert f"sftdoctor: error: {says}" in result.output and "Traceback" not in result.output
    assert result.output.count("sftdoctor: error:") == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no eval.json, no temporary file


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give TARGET"),
        (["m"], "give --tasks NAMES"),
        (["m", "--tasks", "x", "--batch-size", "0"], "expected a positive integer or auto"),
        (["nothing/here/at/all", "--tasks", "x"], "no such model folder, run directory or cached hub id"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2 and message in result.output
    assert result.output.count("sftdoctor: error:") == 1 and "Traceback" not in result.output


def test_a_compare_file_that_is_not_a_result_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": {}}')
    result = invoke(tmp_path / "m", "--tasks", "tiny_count_choice", "--compare", bad)
    assert result.exit_code == 2 and "not a result written by sftdoctor eval" in result.output


def test_the_table_shows_values_with_standard_errors_and_the_difference():
    doc = {
        "metrics": {"t": {"acc": {"value": 0.75, "stderr": 0.044}}},
        "base": {"metrics": {"t": {"acc": {"value": 0.64, "stderr": 0.048}}}},
        "settings": {"num_fewshot": None, "limit": 100, "lm_eval": "0.4.13"},
    }
    lines = table(doc).splitlines()
    assert lines[0].split() == ["task", "metric", "base", "model", "difference"]
    assert lines[1].split() == ["t", "acc", "0.640", "±0.048", "0.750", "±0.044", "+0.110"]


def test_settings_that_differ_are_named():
    a = {"num_fewshot": 5, "limit": None, "apply_chat_template": False, "generation": {}, "task_versions": {"t": 1}}
    assert differences(a, dict(a)) == []
    assert differences(a, {**a, "num_fewshot": 0, "task_versions": {"t": 2}}) == [
        "num_fewshot: 5 vs 0",
        "task_versions: {'t': 1} vs {'t': 2}",
    ]


def test_the_command_leaves_the_environment_as_it_found_it(tmp_path, monkeypatch):
    """It turns tqdm off for itself; later processes of the same caller (a test session) still draw bars."""
    import os

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    invoke(tmp_path / "missing", "--tasks", "x")
    assert "TQDM_DISABLE" not in os.environ
