"""`[data] train` as data files, a folder laid out as a hub dataset, or an org/name id: told apart once, its hub
keys refused where they mean nothing; fuzzed."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sftdoctor.errors import InputErrors
from sftdoctor.run.config import validate
from sftdoctor.run.data_source import FILES, FOLDER, HUB, identity, looks_like_hub_id, named, source


def run_over(tmp_path, **data):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "hub" / "data").mkdir(parents=True, exist_ok=True)
    return validate({"model": {"path": "m"}, "data": {"train": "d.jsonl", **data}}, tmp_path / "run.toml")


def refusals(tmp_path, **data) -> list[str]:
    with pytest.raises(InputErrors) as caught:
        run_over(tmp_path, **data)
    return [str(e) for e in caught.value.errors]


@pytest.mark.parametrize(
    "value, hub",
    [("org/name", True), ("HuggingFaceH4/ultrachat_200k", True), ("a.b-c/d_e.f", True)]
    + [(v, False) for v in ("data/train.jsonl", "org/name.parquet", "a/b/c", "./org", "org--x/y", "org/..", "name")],
)
def test_an_id_is_told_from_a_misspelt_path(value, hub):
    assert looks_like_hub_id(value) is hub


def test_each_kind_of_source_is_read_from_the_validated_config(tmp_path):
    files = run_over(tmp_path)
    assert source(files).kind == FILES and files.data.train == (str(tmp_path / "d.jsonl"),)
    folder = run_over(tmp_path, train="hub", subset="sft", eval_split="test")
    assert folder.data.train == (str((tmp_path / "hub").absolute()),)
    assert source(folder).kind == FOLDER and source(folder).subset == "sft" and source(folder).eval_split == "test"
    hub = run_over(tmp_path, train="org/name", split="train[:10]", revision="main")
    assert hub.data.train == ("org/name",)
    assert (source(hub).kind, source(hub).name, source(hub).revision) == (HUB, "org/name", "main")


def test_a_missing_file_that_is_no_id_says_what_train_takes(tmp_path):
    (line,) = refusals(tmp_path, train="data/train.jsonl")
    assert "[data].train: file not found: data/train.jsonl" in line
    assert "a folder laid out as a hub dataset, or a hub id (org/name)" in line


def test_an_id_shaped_name_under_a_local_folder_is_a_misspelt_path_not_a_hub_id(tmp_path):
    """`hub/train` beside the folder hub/ (the user meant a file in it): not found, never a hub lookup."""
    (line,) = refusals(tmp_path, train="hub/train")
    assert "[data].train: file not found: hub/train" in line


@pytest.mark.parametrize(
    "data, key, says",
    [
        ({"subset": "sft"}, "[data].subset", "goes with a hub dataset in [data] train"),
        ({"eval_split": "test"}, "[data].eval_split", "goes with a hub dataset"),
        ({"train": "hub", "revision": "v1"}, "[data].revision", "is a local folder, which has no revisions"),
        ({"train": "org/name", "eval_split": "train"}, "[data].eval_split", "'train' is the training split"),
        ({"train": "org/name", "eval_split": "test", "eval_fraction": 0.1}, "[data]", "give either eval_split or"),
    ],
)
def test_hub_keys_are_refused_where_they_mean_nothing(tmp_path, data, key, says):
    (line,) = refusals(tmp_path, **data)
    assert f"run.toml: {key}: " in line and says in line


def test_a_source_is_named_and_compared_without_the_folders_place():
    folder = {"kind": FOLDER, "name": "/x/hub", "subset": "default", "split": "train", "eval_split": "test"}
    assert named(folder) == "/x/hub (subset default, split train, eval split test)"
    moved = {**folder, "name": "/elsewhere/hub"}
    assert identity(folder) == identity(moved) != identity(None) == "data files"
    hub = {"kind": HUB, "name": "org/name", "subset": None, "split": "train", "revision": "a" * 40}
    assert identity(hub) == f"org/name (split train, revision {'a' * 40})"
    assert identity({**hub, "revision": "b" * 40}) != identity(hub)


KEYS = st.sampled_from(["subset", "split", "revision", "eval_split", "train", "eval", "eval_fraction"])
VALUES = st.one_of(
    st.sampled_from(["org/name", "hub", "d.jsonl", "train", "test", "", "a/b/c", "org/name.jsonl", "./hub"]),
    st.text(max_size=8),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.lists(st.sampled_from(["d.jsonl", "hub", "org/name"]), max_size=3),
)


@given(data=st.dictionaries(KEYS, VALUES, max_size=5))
@settings(max_examples=300, deadline=None)
def test_any_hub_keys_validate_or_are_refused_line_by_line(tmp_path_factory, data):
    """Whatever the [data] hub keys hold: a validated run with one source, or one line per problem naming the
    file and the key; never an exception of another kind."""
    tmp_path = tmp_path_factory.mktemp("fuzz")
    try:
        run = run_over(tmp_path, **data)
    except InputErrors as exc:
        for line in str(exc).splitlines():
            assert line.startswith(f"{tmp_path / 'run.toml'}: [data]"), line
        return
    found = source(run)
    assert found.kind in (FILES, FOLDER, HUB)
    assert found.kind == FILES or (len(run.data.train) == 1 and found.name == run.data.train[0])


def test_a_stream_needs_max_steps_and_holds_nothing_out(tmp_path):
    """transformers' Trainer cannot count epochs of an IterableDataset: refused when the config is read, so
    `check --config` and `train` say it in the same words."""
    (line,) = refusals(tmp_path, streaming=True)
    assert line.endswith(
        "[data].streaming: a streamed dataset has no length to count epochs in: set [training] max_steps"
    )
    with pytest.raises(InputErrors, match="cannot hold out eval_fraction"):
        validate(
            {
                "model": {"path": "m"},
                "data": {"train": "d.jsonl", "streaming": True, "eval_fraction": 0.1},
                "training": {"max_steps": 5},
            },
            tmp_path / "run.toml",
        )
    run = validate(
        {"model": {"path": "m"}, "data": {"train": "d.jsonl", "streaming": True}, "training": {"max_steps": 5}},
        tmp_path / "run.toml",
    )
    assert run.data.streaming
