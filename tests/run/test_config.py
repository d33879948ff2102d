"""The run config: typed, frozen, defaults in one place, provenance, every problem at once; fuzzed."""

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sftdoctor.errors import InputError, InputErrors
from sftdoctor.run.config import RunConfig, load_run_config, validate

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


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
    assert cfg.data.train == (str(tmp_path / "data.jsonl"),)
    assert cfg.training.output_dir == str(tmp_path / "runs" / "run") and not cfg.given("training", "output_dir")
    assert cfg.model.precision == "auto" and not cfg.given("model", "precision")
    assert cfg.deepspeed.config == str(tmp_path / "ds" / "z2.json") and cfg.given("deepspeed", "config")
    assert cfg.launch.master_port == 29500 and not cfg.given("launch", "master_port")


def test_run_config_reports_every_problem_at_once_with_did_you_mean(tmp_path):
    path = write(tmp_path, '[model]\npath = "m"\nprecison = "bf16"\n[launch]\nnnodes = 0\n[trainig]\nx = 1\n')
    with pytest.raises(InputErrors) as err:
        load_run_config(path)
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert any("[model].precison: unknown key (did you mean 'precision'?)" in line for line in lines)
    assert any("[launch].nnodes: expected an integer from 1 to 65536, got 0" in line for line in lines)
    assert any("[trainig]" in line for line in lines)
    assert all(line.startswith(str(path)) for line in lines)


def test_run_config_needs_the_model_path(tmp_path):
    with pytest.raises(InputErrors, match=r"\[model\].path: missing"):
        load_run_config(write(tmp_path, '[model]\nprecision = "bf16"\n'))


def test_run_config_rejects_a_config_and_a_stage_together(tmp_path):
    with pytest.raises(InputErrors, match="either config"):
        load_run_config(write(tmp_path, '[model]\npath="m"\n[deepspeed]\nconfig="a.json"\nzero_stage=2\n'))


def test_invalid_toml_is_one_line(tmp_path):
    with pytest.raises(InputError, match="not valid TOML"):
        load_run_config(write(tmp_path, "[model\npath = 1"))


@given(
    st.dictionaries(
        st.sampled_from(["model", "launch", "deepspeed", "data", "fsdp", "eval"]),
        st.dictionaries(
            st.sampled_from(
                ["path", "precision", "nnodes", "master_port", "zero_stage", "config", "sharding", "offload"]
                + ["reshard_after_forward", "every_n_checkpoints", "tasks"]
            ),
            JSONISH.filter(lambda v: v is not None),
            max_size=4,
        ),
        max_size=3,
    )
)
@settings(max_examples=200, deadline=None)
def test_run_config_validation_never_crashes(raw):
    try:
        validate(raw, Path("run.toml"))
    except InputErrors as exc:
        assert all(str(e).startswith("run.toml") for e in exc.errors)


def test_the_config_is_frozen_and_round_trips_through_json_with_its_provenance(tmp_path):
    cfg = load_run_config(write(tmp_path, '[model]\npath = "m"\n[launch]\nmaster_port = 29500\n'))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.path = "other"
    again = RunConfig.from_json(json.loads(json.dumps(cfg.to_json())))
    assert again == cfg and again.given("launch", "master_port") and not again.given("launch", "nnodes")


@pytest.mark.parametrize(
    "text, says",
    [
        (
            "[watch]\nhang_timeout_s = inf",
            "[watch].hang_timeout_s: expected a number of seconds from 5 to 86400, got inf",
        ),
        ("[training]\nepochs = nan", "[training].epochs: expected a number > 0 and <= 10000, got nan"),
        ("[training]\nwarmup_ratio = 1.0", "[training].warmup_ratio: expected a number from 0 up to (not including) 1"),
        ("[launch]\nnode_rank = 2\nnnodes = 2", "[launch].node_rank: node_rank 2 must be below nnodes 2"),
        (
            '[data]\ntrain = "data.jsonl"\nmax_length = 1e12',
            "[data].max_length: expected an integer from 16 to 1048576",
        ),
        (
            '[data]\ntrain = "data.jsonl"\nmax_length = 1000000000000',
            "[data].max_length: expected an integer from 16 to 1048576",
        ),
        ("[training]\nepochs = inf", "[training].epochs: expected a number > 0 and <= 10000, got inf"),
        ("[launch]\nnproc_per_node = 100000", "[launch].nproc_per_node: expected an integer from 1 to 1024"),
        ("[training]\nseed = -1", "[training].seed: expected an integer from 0 to 4294967295"),
    ],
)
def test_values_out_of_range_name_the_key_and_the_range(tmp_path, text, says):
    with pytest.raises(InputErrors) as err:
        load_run_config(write(tmp_path, '[model]\npath = "m"\n' + text + "\n"))
    assert says in str(err.value)


@pytest.mark.parametrize("model", ["./models/llama-3-8b", "/data/models/llama", "models/llama/8b", "~/llama"])
def test_a_missing_local_model_folder_is_bad_input_but_a_hub_id_is_kept(tmp_path, model):
    with pytest.raises(InputErrors, match=r"\[model\].path: folder not found"):
        load_run_config(write(tmp_path, f'[model]\npath = "{model}"\n'))
    assert load_run_config(write(tmp_path, '[model]\npath = "Qwen/Qwen2.5-7B"\n')).model.path == "Qwen/Qwen2.5-7B"


def test_eval_is_absent_or_names_its_tasks_and_an_existing_include_folder(tmp_path):
    model = '[model]\npath = "org/model"\n'
    assert load_run_config(write(tmp_path, model)).eval is None
    (tmp_path / "tasks").mkdir()
    run = load_run_config(write(tmp_path, model + '[eval]\ntasks = ["mmlu"]\ninclude = "tasks"\nlimit = 50\n'))
    assert run.eval.tasks == ("mmlu",) and run.eval.include == str(tmp_path / "tasks") and run.eval.base is True
    assert RunConfig.from_json(json.loads(json.dumps(run.to_json()))) == run
    with pytest.raises(InputErrors) as raised:
        load_run_config(write(tmp_path, model + '[eval]\ntasks = ["a,b"]\ninclude = "nowhere"\nlimit = 0\n'))
    lines = str(raised.value).splitlines()
    assert any("[eval].tasks: expected a list of lm-eval task names" in line for line in lines), lines
    assert any("[eval].limit: expected an integer from 1" in line for line in lines), lines
    assert any("[eval].include: folder not found: " in line for line in lines), lines
    with pytest.raises(InputErrors) as raised:
        load_run_config(write(tmp_path, model + "[eval]\n"))
    assert "[eval].tasks: missing; expected a list of lm-eval task names" in str(raised.value)


def test_checks_disable_defaults_to_nothing_and_round_trips(tmp_path):
    assert load_run_config(write(tmp_path, '[model]\npath = "m"\n')).checks.disable == ()
    cfg = load_run_config(
        write(tmp_path, '[model]\npath = "m"\n[checks]\ndisable = ["nccl-env/port-busy", "disk-full"]\n')
    )
    assert cfg.checks.disable == ("nccl-env/port-busy", "disk-full") and cfg.given("checks", "disable")
    assert RunConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


@pytest.mark.parametrize("value", ['"disk-full"', '[""]', "[1]", "true", '["a", ["b"]]', "{}"])
def test_checks_disable_is_a_list_of_ids(tmp_path, value):
    """The ids themselves are checked against the registry by whoever runs the checks (a layer above)."""
    path = write(tmp_path, f'[model]\npath = "m"\n[checks]\ndisable = {value}\n')
    with pytest.raises(InputErrors) as raised:
        load_run_config(path)
    assert [str(e) for e in raised.value.errors] == [
        f"{path}: [checks].disable: expected a list of check ids or message ids (CHECK/slug), got "
        f"{__import__('tomllib').loads('v = ' + value)['v']!r}"
    ]
