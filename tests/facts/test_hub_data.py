"""A hub dataset as `[data] train`: a folder laid out as a dataset repository, and an org/name id from a datasets
cache that the datasets library itself filled, resolved by the real datasets library in a child process, never
over the network; every row checked and a bad one named by split and row; what it cannot read, one line."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hubdata import REVISION, hub_env, hub_folder, seed_cache

from sftdoctor.errors import InputError
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.data import locate, rows

CHAT = [
    {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]} for i in range(6)
]
TEXT = [{"text": f"row {i}"} for i in range(4)]


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty Hugging Face home, offline, for this test and the child processes it starts."""
    home = tmp_path / "hf"
    for name in [k for k in __import__("os").environ if k.startswith(("HF_", "HUGGINGFACE_"))]:
        monkeypatch.delenv(name)
    for name, value in hub_env(home).items():
        if name.startswith("HF_"):
            monkeypatch.setenv(name, value)
    return home


def config(tmp_path, **data):
    path = tmp_path / "run.toml"
    lines = ["[model]", 'path = "m"', 'weights = "random"', "[data]"] + [
        f"{k} = {json.dumps(v)}" for k, v in data.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def facts_of(path):
    return Facts(Inputs(config=path))


def refused(path) -> str:
    with pytest.raises(InputError) as caught:
        facts_of(path).get("data")
    return str(caught.value)


def test_a_folder_resolves_to_its_subsets_files_as_datasets_does_even_when_subsets_differ_in_format(tmp_path, hf_home):
    """The second subset is JSON Lines, the first Parquet: datasets 5.2 would read both with the Parquet builder
    (it infers one format from the first config); read as files, each loads as what it is."""
    folder = hub_folder(tmp_path / "ds", {"train": CHAT, "test": CHAT[:2]}, config="chat")
    (folder / "plain").mkdir()
    (folder / "plain" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TEXT))
    readme = (folder / "README.md").read_text().rstrip().removesuffix("---")
    (folder / "README.md").write_text(
        readme + "- config_name: plain\n  data_files:\n  - split: train\n    path: plain/*.jsonl\n---\n"
    )
    line = refused(config(tmp_path, train="ds"))
    assert line.endswith(f"[data].subset: {folder} has several subsets: name one in [data] subset (chat, plain)")
    chat = facts_of(config(tmp_path, train="ds", subset="chat", eval_split="test"))
    found = chat.get("data_source")
    assert found["subset"] == "chat" and found["splits"] == ["train", "test"] and found["revision"] is None
    assert found["train"] == [str(folder / "data" / "train-00000-of-00001.parquet")]
    assert found["readme"] == str(folder / "README.md")
    data = chat.get("data")
    assert (data["train"]["rows"], data["eval"]["rows"], data["train"]["format"]) == (6, 2, "messages")
    plan = chat.get("plan")
    assert plan.train_files == tuple(found["train"]) and plan.eval_files == tuple(found["eval"])
    assert plan.data_source["subset"] == "chat" and plan.data_rows == 6
    plain = facts_of(config(tmp_path, train="ds", subset="plain")).get("data")
    assert (plain["train"]["rows"], plain["train"]["format"]) == (4, "text")


@pytest.mark.parametrize(
    "data, says",
    [
        ({"subset": "nope"}, "[data].subset: {name} has no subset 'nope'; available: default"),
        ({"split": "validation"}, "[data].split: {name} (subset default) has no split 'validation'; available: train"),
        ({"eval_split": "dev"}, "[data].eval_split: {name} (subset default) has no split 'dev'; available: train"),
    ],
)
def test_an_unknown_subset_or_split_of_a_folder_or_a_cached_id_is_one_line_naming_the_available(
    tmp_path, hf_home, data, says
):
    hub_folder(tmp_path / "ds", {"train": TEXT})
    seed_cache(hf_home, "org/text_rows", {"train": [str(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet")]})
    for name, given in ((str(tmp_path / "ds"), "ds"), ("org/text_rows", "org/text_rows")):
        line = refused(config(tmp_path, train=given, **data))
        assert line == f"{tmp_path / 'run.toml'}: " + says.format(name=name)


def test_a_bad_row_of_a_folder_is_named_by_split_and_row_with_its_shard(tmp_path, hf_home):
    rows_ = CHAT[:2] + [{"messages": [{"role": "bot", "content": "x"}]}] + CHAT[3:]
    hub_folder(tmp_path / "ds", {"train": CHAT, "test": rows_}, suffix=".jsonl")
    line = refused(config(tmp_path, train="ds", eval_split="test"))
    assert line.startswith(f"{tmp_path / 'run.toml'}: [data].eval_split: {tmp_path / 'ds'} split test, row 3 ")
    assert "(dataset[2], test-00000-of-00001.jsonl line 3): turn 0: role is 'bot'" in line


def test_a_cached_id_reads_the_arrow_files_datasets_prepared_at_their_revision_offline(tmp_path, hf_home):
    hub_folder(tmp_path / "src", {"train": CHAT, "test": CHAT[:3]})
    shard = lambda split: str(tmp_path / "src" / "data" / f"{split}-00000-of-00001.parquet")  # noqa: E731
    seed_cache(hf_home, "org/chat_rows", {"train": [shard("train")], "test": [shard("test")]})
    facts = facts_of(config(tmp_path, train="org/chat_rows", eval_split="test"))
    found = facts.get("data_source")
    assert (found["kind"], found["revision"], found["subset"], found["cache"]) == ("hub", REVISION, "default", True)
    assert [p.rsplit("/", 1)[-1] for p in found["train"] + found["eval"]] == [
        "chat_rows-train.arrow",
        "chat_rows-test.arrow",
    ]
    assert str(hf_home / "datasets" / "org___chat_rows") in found["train"][0]
    data = facts.get("data")
    assert (data["train"]["rows"], data["eval"]["rows"]) == (6, 3)
    assert facts.get("plan").data_source == {
        "kind": "hub",
        "name": "org/chat_rows",
        "subset": "default",
        "split": "train",
        "eval_split": "test",
        "revision": REVISION,
    }
    line = refused(config(tmp_path, train="org/chat_rows", revision="f" * 40))
    assert f"[data].revision: the local datasets cache holds org/chat_rows at revision {REVISION}, not " in line


def test_a_bad_row_in_the_datasets_cache_is_named_by_split_and_row(tmp_path, hf_home):
    bad = CHAT[:4] + [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]}]
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "t.parquet")
    seed_cache(hf_home, "org/bad_rows", {"train": [str(tmp_path / "t.parquet")]})
    line = refused(config(tmp_path, train="org/bad_rows"))
    assert "[data].train: org/bad_rows split train, row 5 (dataset[4], bad_rows-train.arrow row 5): turn 1" in line


def test_an_id_neither_cached_nor_reachable_is_one_line_in_check_and_train_alike(tmp_path, hf_home):
    """Offline, an id the datasets cache lacks: one line naming it and how to fix it, exit 2, from `check
    --config` and from `train` in the same words, and nothing written."""
    path = config(tmp_path, train="org/never_cached", subset="sft")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    expected = (
        f"sftdoctor: error: {path}: [data].train: org/never_cached is not in the local datasets cache and "
        'HF_HUB_OFFLINE=1: load it once where there is network (python -c "import datasets; '
        "datasets.load_dataset('org/never_cached', 'sft')\"), or give a local folder laid out as the dataset repository"
    )
    before = sorted(tmp_path.rglob("*"))
    for args in (["check", "--config", str(path)], ["train", str(path)]):
        proc = subprocess.run(
            [sys.executable, "-m", "sftdoctor", *args], capture_output=True, text=True, env=hub_env(hf_home)
        )
        assert (proc.returncode, proc.stderr.strip()) == (2, expected), proc.stdout + proc.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_a_folder_of_other_formats_is_refused_naming_them(tmp_path, hf_home):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.csv").write_text("text\nhello\n")
    line = refused(config(tmp_path, train="ds"))
    assert line.endswith(
        "[data].train: " + f"{tmp_path / 'ds'} (subset default) split train is .csv data; sftdoctor "
        "reads JSON Lines, JSON and Parquet shards"
    )


@pytest.mark.parametrize("writer", [pa.ipc.new_stream, pa.ipc.new_file])
def test_arrow_shards_are_read_row_by_row_and_located(tmp_path, writer):
    table = pa.Table.from_pylist(TEXT)
    path = tmp_path / "x.arrow"
    with writer(str(path), table.schema) as out:
        for batch in table.to_batches(max_chunksize=3):
            out.write_batch(batch)
    assert list(rows(path)) == [(f"row {i + 1}", r) for i, r in enumerate(TEXT)]
    assert locate([str(path)], {3}) == {3: "x.arrow row 4"}
    (tmp_path / "y.arrow").write_bytes(b"not arrow")
    with pytest.raises(InputError, match="y.arrow: not a readable Arrow file"):
        list(rows(tmp_path / "y.arrow"))


def test_a_streamed_split_is_an_iterable_of_the_trained_columns_with_row_numbers(tmp_path, hf_home):
    """[data] streaming: the trainer gets an IterableDataset read from the shards (only the columns SFTTrainer
    reads, each row numbered), the eval split whole; a rehearsal's limit takes the first rows of the stream."""
    import dataclasses

    from datasets import Dataset, IterableDataset

    from sftdoctor.facts.trainer_inputs import ROW, load_data

    rows_ = [{**r, "source": "x"} for r in CHAT]
    hub_folder(tmp_path / "ds", {"train": rows_, "test": CHAT[:2]}, suffix=".jsonl")
    path = config(tmp_path, train="ds", eval_split="test", streaming=True)
    path.write_text(path.read_text() + "[training]\nmax_steps = 3\n")
    plan = facts_of(path).get("plan")
    train, evaluation = load_data(plan)
    assert isinstance(train, IterableDataset) and isinstance(evaluation, Dataset) and len(evaluation) == 2
    got = list(train)
    assert sorted(r[ROW] for r in got) == list(range(6)) and all(set(r) == {"messages", ROW} for r in got)
    assert sorted(r["messages"][0]["content"] for r in got) == [f"q{i}" for i in range(6)]
    limited, _ = load_data(dataclasses.replace(plan, data_limit=2))
    assert len(list(limited)) == 2
    assert plan.length_grouping == {}  # no sampler over a stream


def test_an_uncached_id_with_the_hub_unreachable_is_refused_at_once_not_after_retries(tmp_path, hf_home, monkeypatch):
    """Online, the hub (here a closed port on loopback) cannot be reached: one bounded request, then one line;
    datasets itself would retry for ~23 s (measured with 5.2.0) before saying the same."""
    import time

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    started = time.monotonic()
    line = refused(config(tmp_path, train="org/never_cached"))
    assert time.monotonic() - started < 15
    assert line.startswith(f"{tmp_path / 'run.toml'}: [data].train: org/never_cached is not in the local datasets ")
    assert "the Hugging Face hub cannot be reached (ConnectError: " in line and line.endswith("give a local folder")
