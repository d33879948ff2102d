"""Loaders of the run's config files, on real configs from public repositories, and fuzzed."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, index
from sftdoctor.checks.common import ds_precision_flags
from sftdoctor.errors import InputError, InputErrors
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.configs import read_json_object, summarize_model_config
from sftdoctor.train.config import load_run_config

DEEPSPEED = index("deepspeed")
MODELS = index("model_config")


def _flag(value):
    return {"true": True, "false": False, "auto": "auto", "absent": None}[value]


@pytest.mark.parametrize("entry", DEEPSPEED, ids=[e["file"] for e in DEEPSPEED])
def test_real_deepspeed_configs_read_as_their_precision_flags(entry):
    cfg = read_json_object(FIXTURES / "deepspeed" / entry["file"], "DeepSpeed config")
    flags = ds_precision_flags(cfg)
    assert flags["fp16"] == _flag(entry["fp16"])
    assert flags["bf16"] == _flag(entry["bf16"])
    assert (flags["bf16_key"] or "absent") == entry["bf16_key"]
    assert cfg.get("zero_optimization", {}).get("stage") == entry["zero_stage"]


@pytest.mark.parametrize("entry", MODELS, ids=[e["file"] for e in MODELS])
def test_real_model_configs_give_their_dtype_and_the_key_it_came_from(entry):
    path = FIXTURES / "model_config" / entry["file"]
    summary = summarize_model_config(path, read_json_object(path, "model config.json"))
    expected = None if entry["dtype"] == "absent" else entry["dtype"]
    assert summary["dtype"] == expected
    if expected and "." not in (summary["dtype_key"] or ""):
        assert summary["dtype_key"] == entry["dtype_key"]
    assert summary["model_type"] == entry["model_type"]


def test_both_config_generations_are_covered():
    keys = {e["dtype_key"] for e in MODELS}
    assert {"dtype", "torch_dtype"} <= keys
    assert any((e["transformers_version"] or "").startswith("5.") for e in MODELS)


def test_a_nested_multimodal_config_falls_back_to_its_text_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llava", "text_config": {"model_type": "llama", "torch_dtype": "float16",
                                                                        "hidden_size": 4096}}))
    summary = summarize_model_config(path, read_json_object(path, "model config.json"))
    assert (summary["dtype"], summary["dtype_key"], summary["hidden_size"]) == ("float16", "text_config.torch_dtype", 4096)


def test_the_top_level_dtype_wins_over_a_legacy_key_as_in_transformers_5(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"dtype": "bfloat16", "torch_dtype": "float32"}')
    assert summarize_model_config(path, read_json_object(path, "x"))["dtype"] == "bfloat16"


@pytest.mark.parametrize("text, message", [
    ('{"fp16": {"enabled": true},}', "not valid JSON"),
    ('{"fp16": {}, "fp16": {}}', "duplicate key"),
    ("[1, 2]", "expected a JSON object"),
    ("// comment\n{}", "not valid JSON"),
])
def test_bad_deepspeed_json_is_one_line_naming_file_and_problem(tmp_path, text, message):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as err:
        read_json_object(path, "DeepSpeed config")
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_a_model_folder_means_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "dtype": "bfloat16"}')
    facts = Facts(Inputs(model_config=tmp_path))
    assert facts.get("model_config")["dtype"] == "bfloat16"


def write(tmp_path, text, name="run.toml"):
    """A run config beside a one-row data file (data.jsonl), as `[data] train` needs an existing file."""
    (tmp_path / "data.jsonl").write_text('{"text": "hello"}\n')
    if "[data]" not in text:
        text += '\n[data]\ntrain = "data.jsonl"\n'
    path = tmp_path / name
    path.write_text(text)
    return path


def test_run_config_fills_defaults_and_resolves_paths_next_to_the_file(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "z2.json").write_text("{}")
    path = write(tmp_path, '[model]\npath = "m"\n[deepspeed]\nconfig = "ds/z2.json"\n')
    cfg = load_run_config(path)
    assert cfg["data"]["train"] == [str(tmp_path / "data.jsonl")]
    assert cfg["training"]["output_dir"] == str(tmp_path / "runs" / "run")
    assert cfg["model"]["precision"] == "auto"
    assert cfg["deepspeed"]["config"] == str(tmp_path / "ds" / "z2.json")
    assert cfg["launch"]["master_port"] == 29500


def test_run_config_reports_every_problem_at_once_with_did_you_mean(tmp_path):
    path = write(tmp_path, '[model]\npath = "m"\nprecison = "bf16"\n[launch]\nnnodes = 0\n[trainig]\nx = 1\n')
    with pytest.raises(InputErrors) as err:
        load_run_config(path)
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert any("[model].precison: unknown key (did you mean 'precision'?)" in l for l in lines)
    assert any("[launch].nnodes: expected a positive integer, got 0" in l for l in lines)
    assert any("[trainig]" in l for l in lines)
    assert all(l.startswith(str(path)) for l in lines)


def test_run_config_needs_the_model_path(tmp_path):
    with pytest.raises(InputErrors, match=r"\[model\].path: missing"):
        load_run_config(write(tmp_path, '[model]\nprecision = "bf16"\n'))


def test_run_config_rejects_a_config_and_a_stage_together(tmp_path):
    with pytest.raises(InputErrors, match="either config"):
        load_run_config(write(tmp_path, '[model]\npath="m"\n[deepspeed]\nconfig="a.json"\nzero_stage=2\n'))


def test_invalid_toml_is_one_line(tmp_path):
    with pytest.raises(InputError, match="not valid TOML"):
        load_run_config(write(tmp_path, "[model\npath = 1"))


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
                       lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
                       max_leaves=20)


@given(st.binary(max_size=500) | st.text(max_size=500).map(str.encode) | JSONISH.map(lambda v: json.dumps(v).encode()))
@settings(max_examples=300, deadline=None)
def test_config_loaders_give_a_value_or_a_clean_input_error(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("fuzz")
    for name, probe in (("ds.json", "deepspeed_config"), ("config.json", "model_config"), ("run.toml", "run_config")):
        path = folder / name
        path.write_bytes(data)
        inputs = Inputs(**{"deepspeed_config": {"deepspeed": path}, "model_config": {"model_config": path},
                           "run_config": {"config": path}}[probe])
        try:
            Facts(inputs).get(probe)
        except (InputError, InputErrors) as exc:
            assert str(name) in str(exc)


@given(st.dictionaries(st.sampled_from(["model", "launch", "deepspeed", "data"]),
                       st.dictionaries(st.sampled_from(["path", "precision", "nnodes", "master_port", "zero_stage", "config"]),
                                       JSONISH.filter(lambda v: v is not None), max_size=4), max_size=3))
@settings(max_examples=200, deadline=None)
def test_run_config_validation_never_crashes(raw):
    from pathlib import Path

    from sftdoctor.train.config import validate

    try:
        validate(raw, Path("run.toml"))
    except InputErrors as exc:
        assert all(str(e).startswith("run.toml") for e in exc.errors)
