"""The config-file probes (facts/configs.py), on real configs from public repositories, and fuzzed."""

import json

import pytest
from conftest import EXAMPLES, FIXTURES, index
from hypothesis import given, settings
from hypothesis import strategies as st

from sftdoctor.checks._common import ds_precision_flags
from sftdoctor.errors import InputError, SftdoctorError
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.configs import LOADABLE_DTYPES, read_json_object, summarize_model_config

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
    path.write_text(
        json.dumps(
            {
                "model_type": "llava",
                "text_config": {"model_type": "llama", "torch_dtype": "float16", "hidden_size": 4096},
            }
        )
    )
    summary = summarize_model_config(path, read_json_object(path, "model config.json"))
    assert (summary["dtype"], summary["dtype_key"], summary["hidden_size"]) == (
        "float16",
        "text_config.torch_dtype",
        4096,
    )


def test_the_top_level_dtype_wins_over_a_legacy_key_as_in_transformers_5(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"dtype": "bfloat16", "torch_dtype": "float32"}')
    assert summarize_model_config(path, read_json_object(path, "x"))["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"fp16": {"enabled": true},}', "not valid JSON"),
        ('{"fp16": {}, "fp16": {}}', "duplicate key"),
        ("[1, 2]", "expected a JSON object"),
        ("// comment\n{}", "not valid JSON"),
    ],
)
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


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(st.binary(max_size=500) | st.text(max_size=500).map(str.encode) | JSONISH.map(lambda v: json.dumps(v).encode()))
@settings(max_examples=300, deadline=None)
def test_config_loaders_give_a_value_or_a_clean_input_error(tmp_path_factory, data):
    """DeepSpeed's verdict is asked in this process (the probe's child would cost seconds an example)."""
    from unittest import mock

    from sftdoctor.facts import deepspeed_probe

    folder = tmp_path_factory.mktemp("fuzz")
    in_process = mock.patch.object(deepspeed_probe, "problems_in_child", lambda path: deepspeed_probe.main(str(path)))
    for name, probe in (("ds.json", "deepspeed_config"), ("config.json", "model_config"), ("run.toml", "run")):
        path = folder / name
        path.write_bytes(data)
        inputs = Inputs(
            **{
                "deepspeed_config": {"deepspeed": path},
                "model_config": {"model_config": path},
                "run": {"config": path},
            }[probe]
        )
        try:
            with in_process:
                Facts(inputs).get(probe)
        except SftdoctorError as exc:
            assert str(name) in str(exc)


@pytest.mark.parametrize(
    "value,loads",
    [("auto", False), ("torch.bfloat16", False), ("bf16", False), *((name, True) for name in LOADABLE_DTYPES)],
)
def test_the_dtype_names_refused_are_those_the_pinned_transformers_cannot_load(tmp_path, value, loads):
    """facts.configs.LOADABLE_DTYPES pinned against transformers 5.24-5.25's PretrainedConfig (getattr(torch, v))."""
    from transformers import AutoConfig

    config = json.loads((EXAMPLES / "tiny" / "model" / "config.json").read_text())
    config.pop("dtype", None)
    (tmp_path / "config.json").write_text(json.dumps({**config, "torch_dtype": value}))
    if loads:
        AutoConfig.from_pretrained(tmp_path)
    else:
        with pytest.raises(AttributeError):
            AutoConfig.from_pretrained(tmp_path)
