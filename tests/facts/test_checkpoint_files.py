"""A local checkpoint's safetensors read from their headers alone: what `from_pretrained` would stop on (a
truncated shard, a shard the index names but the folder lacks, bytes that are no header) is refused by
`check --config` and `train` alike (facts.launch_inputs), in the CLI's own process, before any child starts.

The oracle is the real safetensors (the files are written by it, and each refusal is checked against its own
`safe_open`), not this module's reading of the format."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli_contract import sftdoctor
from conftest import EXAMPLES
from safetensors import safe_open
from safetensors.torch import save_file

from sftdoctor.facts.checkpoint_files import checkpoint_problem, shard_problem


def write(path, tensors):
    save_file({k: torch.ones(*shape) for k, shape in tensors.items()}, str(path))
    return path


def loads(path) -> bool:
    try:
        with safe_open(str(path), "pt") as f:
            [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118 (safe_open is not iterable)
        return True
    except Exception:
        return False


@pytest.mark.parametrize("cut", [0, 4, 8, 20, -1, -100])
def test_a_truncated_shard_is_named_where_safetensors_refuses_it(tmp_path, cut):
    path = write(tmp_path / "model.safetensors", {"embed.weight": (64, 8), "lm_head.weight": (64, 8)})
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    assert not loads(path)
    problem = shard_problem(path)
    assert problem and ("truncated" in problem or "too short" in problem), problem


def test_a_whole_shard_passes_as_safetensors_loads_it(tmp_path):
    path = write(tmp_path / "model.safetensors", {"a": (3, 5), "b": (7,)})
    assert loads(path) and shard_problem(path) is None


def test_data_past_the_last_tensor_is_refused_as_safetensors_refuses_it(tmp_path):
    path = write(tmp_path / "model.safetensors", {"a": (3, 5)})
    path.write_bytes(path.read_bytes() + b"\0" * 16)
    assert not loads(path)
    assert "past the last tensor" in shard_problem(path)


def rewrite(path, change):
    """The file with its header changed by `change(header)` and its data kept."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    change(header)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length :])


LIES = {
    "unknown dtype": lambda h: h["a"].update(dtype="X9"),
    "dtype of another size": lambda h: h["a"].update(dtype="F16"),
    "shape of another size": lambda h: h["a"].update(shape=[3, 6]),
    "shape not a list": lambda h: h["a"].update(shape="3x5"),
    "a gap between tensors": lambda h: h["b"].update(
        data_offsets=[h["b"]["data_offsets"][0] + 4, h["b"]["data_offsets"][1] + 4]
    ),
    "overlapping tensors": lambda h: h["b"].update(
        data_offsets=[0, h["b"]["data_offsets"][1] - h["b"]["data_offsets"][0]]
    ),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_header_that_lies_is_refused_where_safetensors_refuses_it(tmp_path, lie):
    path = write(tmp_path / "model.safetensors", {"a": (3, 5), "b": (7,)})
    rewrite(path, LIES[lie])
    assert not loads(path)
    assert shard_problem(path).startswith("not a loadable safetensors header"), shard_problem(path)


def test_a_shard_the_index_names_but_the_folder_lacks_is_named(tmp_path):
    write(tmp_path / "model-00001-of-00002.safetensors", {"a": (2, 2)})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    assert checkpoint_problem(tmp_path).startswith("model-00002-of-00002.safetensors: safetensors file not found")


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"weight_map": 3}'])
def test_an_index_that_is_not_one_is_named(tmp_path, text):
    (tmp_path / "model.safetensors.index.json").write_text(text)
    assert checkpoint_problem(tmp_path).startswith("model.safetensors.index.json is not a safetensors index")


def test_check_and_train_refuse_a_truncated_checkpoint_in_the_same_words(tmp_path):
    root = tmp_path / "ex"
    shutil.copytree(EXAMPLES, root)
    model = root / "tiny" / "model"
    path = write(model / "model.safetensors", {"model.embed_tokens.weight": (384, 64)})
    path.write_bytes(path.read_bytes()[:-10])
    config = root / "tiny.toml"
    config.write_text(config.read_text().replace('weights = "random"', 'weights = "pretrained"'))
    lines = []
    for argv in (["check", "--config", config], ["train", config, "--dry-run"]):
        result = sftdoctor(argv, root, [config])
        assert result.exit_code == 2
        lines.append(result.stderr)
    assert lines[0] == lines[1]
    assert "[model].path: model.safetensors: its tensors end at byte" in lines[0] and "truncated" in lines[0]
