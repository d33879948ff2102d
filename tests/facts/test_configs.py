"""The config-file probes (facts/configs.py), on real configs from public repositories, and fuzzed."""

import contextlib
import json

import pytest
from conftest import EXAMPLES, FIXTURES, index
from hypothesis import given, settings
from hypothesis import strategies as st

from sftdoctor.checks._common import ds_precision_flags
from sftdoctor.errors import InputError, SftdoctorError
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.configs import (
    LOADABLE_DTYPES,
    read_json_object,
    read_yaml_mapping,
    summarize_fsdp_config,
    summarize_model_config,
)

DEEPSPEED = index("deepspeed")
FSDP = index("fsdp")
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


# ---------------------------------------------------------------- accelerate FSDP YAML


def fsdp_fact(path):
    return summarize_fsdp_config(path, read_yaml_mapping(path, "accelerate FSDP config"))


@pytest.mark.parametrize("entry", FSDP, ids=[e["file"] for e in FSDP])
def test_real_fsdp_configs_read_as_accelerate_launch_reads_them(entry):
    """The version as accelerate reads it (absent: 1), the settings without the fsdp_ prefix, the top-level keys."""
    found = fsdp_fact(FIXTURES / "fsdp" / entry["file"])
    assert found["version"] == entry["fsdp_version"]
    assert found["top"].get("mixed_precision") == entry["mixed_precision"]
    assert found["top"].get("num_processes") == entry["num_processes"]
    assert found["fsdp"].get("state_dict_type") == entry["state_dict_type"]
    assert found["fsdp"].get("transformer_layer_cls_to_wrap") == entry["layer_cls"]
    assert all(not key.startswith("fsdp_") for key in found["fsdp"])
    assert all(found["written"][key] in ("fsdp_" + key, key) for key in found["fsdp"])
    assert "fsdp_config" not in found["top"]


def test_a_key_without_the_prefix_is_the_same_setting_and_one_given_twice_is_refused(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text("distributed_type: FSDP\nfsdp_config:\n  version: 2\n  fsdp_state_dict_type: FULL_STATE_DICT\n")
    assert fsdp_fact(path)["version"] == 2 and fsdp_fact(path)["written"]["version"] == "version"
    path.write_text("distributed_type: FSDP\nfsdp_config:\n  version: 2\n  fsdp_version: 1\n")
    with pytest.raises(InputError, match="version and fsdp_version name one setting"):
        fsdp_fact(path)


@pytest.mark.parametrize(
    "text, key, message",
    [
        ("fsdp_config: [", None, "not valid YAML"),
        ("- distributed_type: FSDP\n", None, "expected a YAML mapping"),
        ("", None, "got an empty file"),
        ("distributed_type: MULTI_GPU\nfsdp_config: {}\n", "distributed_type", 'got "MULTI_GPU"'),
        ("fsdp_config: {fsdp_version: 2}\n", "distributed_type", "got absent"),
        ("distributed_type: FSDP\n", "fsdp_config", "got absent"),
        ("distributed_type: FSDP\nfsdp_config: FULL_SHARD\n", "fsdp_config", "got str"),
        ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 3\n", "fsdp_config.fsdp_version", "expected 1 or 2"),
        ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: two\n", "fsdp_config.fsdp_version", 'got "two"'),
        ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: true\n", "fsdp_config.fsdp_version", "got true"),
        (
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_min_num_params: .nan\n",
            "fsdp_config.fsdp_min_num_params",
            "finite",
        ),
        ("distributed_type: FSDP\nfsdp_config: {}\nnum_processes: -.inf\n", "num_processes", "finite"),
        ("distributed_type: FSDP\nfsdp_config: {}\nmain_training_function: 2024-01-01\n", None, "got date"),
        ("distributed_type: FSDP\nfsdp_config: {1: 2}\n", "fsdp_config.1", "expected a key name"),
        ("distributed_type: FSDP\nfsdp_config: !!python/object:os.system {}\n", None, "not valid YAML"),
        ("a: &x [1, 2]\nb: [*x, *x]\ndistributed_type: FSDP\nfsdp_config: {}\n", None, "a YAML alias"),
        ("distributed_type: FSDP\nfsdp_config: {}\nnum_processes: 1" + "0" * 5000 + "\n", None, "4300 digits"),
        ("[" * 5000, None, "not valid YAML"),
    ],
)
def test_bad_fsdp_yaml_is_one_line_naming_file_key_and_problem(tmp_path, text, key, message):
    path = tmp_path / "fsdp.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message.replace("(", r"\(")) as err:
        fsdp_fact(path)
    assert str(err.value).startswith(f"{path}: {key}: " if key else str(path)) and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dev-null", "unreadable", "dangling", "folder", "binary", "loop"])
def test_an_fsdp_config_that_is_not_a_file_is_refused_in_one_line(tmp_path, kind):
    from hostile import fed_fifo, no_hang, special_file

    path = special_file(tmp_path / "fsdp.yaml", kind)
    fed = fed_fifo(path, b"distributed_type: FSDP\n") if kind == "fifo" else contextlib.nullcontext()
    with fed, no_hang(20), pytest.raises(InputError) as err:
        Facts(Inputs(fsdp=path)).get("fsdp_config")
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_the_fsdp_config_the_run_config_names_is_read_when_the_run_has_that_section(tmp_path):
    """[fsdp] config (run/config.py's Fsdp section, where this tree has it): read like --fsdp."""
    from types import SimpleNamespace
    from unittest import mock

    facts = Facts(Inputs())
    run = SimpleNamespace(fsdp=SimpleNamespace(config=str(FIXTURES / "fsdp" / "trl_fsdp2.yaml")))
    with mock.patch.object(facts, "get", side_effect=lambda name: run if name == "run" else None):
        from sftdoctor.facts.configs import probe_fsdp_config

        assert probe_fsdp_config(facts)["version"] == 2
        run.fsdp.config = None
        assert probe_fsdp_config(facts) is None


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode) | JSONISH.map(lambda v: json.dumps(v).encode()))
@settings(max_examples=200, deadline=None)
def test_the_fsdp_loader_gives_a_value_or_a_clean_input_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "fsdp.yaml"
    for raw in (data, b"distributed_type: FSDP\nfsdp_config:\n  fsdp_version: " + data):
        path.write_bytes(raw)
        try:
            value = Facts(Inputs(fsdp=path)).get("fsdp_config")
        except SftdoctorError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc)
        else:
            json.dumps(value, allow_nan=False)  # plain, finite JSON
