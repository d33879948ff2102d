"""data-rows: a data file that is one JSON object, and fewer training rows than one global batch (verdicts, not
bad input), on the rows the data probe counted; and the probe's own refusals (the eval split, mixed kinds)."""

import json

import pytest
from conftest import make_run, plan_of, severities

from sftdoctor.errors import InputError
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.data import describe, eval_split

ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def data(rows, one_object=(), split=None, eval_rows=None):
    out = {
        "train": {
            "files": ["d.jsonl"],
            "rows": rows,
            "format": "text",
            "shape": "text",
            **({"one_object": list(one_object)} if one_object else {}),
        }
    }
    if split:
        out["split"] = split
    if eval_rows:
        out["eval"] = {"files": ["e.jsonl"], "rows": eval_rows, "format": "text", "shape": "text"}
    return out


def test_fewer_rows_than_one_global_batch_is_a_warning_saying_what_the_trainer_does(run, tmp_path):
    plan = plan_of(make_run(tmp_path, training={"global_batch_size": 16, "per_device_batch_size": 8, "max_steps": 60}))
    [few] = run("data-rows", data=data(5), plan=plan)
    assert few.severity.value == "warning"
    assert few.title == (
        "5 training rows, fewer than one global batch of 16 (8 per device x 2 accumulation x 1): each "
        "epoch is one optimizer step on a partial batch of 5"
    )
    assert "60 steps pass over the same 5 rows 60 times" in few.detail
    [enough] = run("data-rows", data=data(40, eval_rows=4), plan=plan)
    assert enough.severity.value == "ok"
    assert enough.title == "40 training rows (4 eval): 2 full global batches of 16 per epoch and a partial one of 8"


def test_the_rows_counted_are_those_left_after_the_eval_split(run, tmp_path):
    plan = plan_of(make_run(tmp_path, training={"global_batch_size": 16, "per_device_batch_size": 8}))
    [few] = run("data-rows", data=data(20, split={"fraction": 0.25, "train": 15, "eval": 5}), plan=plan)
    assert few.severity.value == "warning" and few.title.startswith("15 training rows (5 eval), fewer than one")


def test_a_file_that_is_one_object_is_a_warning_of_its_own(run, tmp_path):
    plan = plan_of(make_run(tmp_path, training={"global_batch_size": 1}))
    findings = run("data-rows", data=data(1, one_object=["/x/d.json"]), plan=plan)
    assert severities(findings) == ["warning", "ok"]
    assert findings[0].title == "/x/d.json is one JSON object: the datasets library reads it as one row"


def test_no_whole_batch_is_left_to_batch_size(run, tmp_path):
    plan = plan_of(make_run(tmp_path, training={"global_batch_size": 7, "per_device_batch_size": 2}))
    assert severities(run("data-rows", data=data(3), plan=plan)) == ["info"]


@pytest.mark.parametrize("text", [json.dumps(ROW), json.dumps(ROW, indent=2)])
def test_a_file_of_one_object_is_one_row_as_datasets_reads_it(tmp_path, text):
    (tmp_path / "d.json").write_text(text)
    described = describe([str(tmp_path / "d.json")])
    assert described["rows"] == 1 and described["one_object"] == [str(tmp_path / "d.json")]


def test_an_object_that_wraps_rows_is_bad_input_saying_where_they_are(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps({"data": [ROW, ROW]}, indent=2))
    with pytest.raises(
        InputError,
        match=r"its one JSON object: no known format; found \['data'\].*its 'data' holds a "
        r"list of 2 objects: write that list as the file",
    ):
        describe([str(tmp_path / "d.json")])


def test_a_jsonl_file_that_is_a_json_array_is_read_as_datasets_reads_it(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps([ROW, ROW], indent=1))
    assert describe([str(tmp_path / "d.jsonl")])["rows"] == 2


@pytest.mark.parametrize(
    "rows, fraction, split",
    [(20, 0.01, (19, 1)), (20, 0.5, (10, 10)), (3, 0.5, (1, 2)), (1, 0.5, (0, 1)), (1, 1e-9, (0, 1)), (7, 0.0, (7, 0))],
)
def test_the_eval_split_counts(rows, fraction, split):
    assert eval_split(rows, fraction) == split


@pytest.mark.slow  # importing datasets: 3 s
def test_the_eval_split_is_datasets_own():
    from datasets import Dataset

    for rows in (2, 3, 7, 20, 33):
        for fraction in (1e-9, 0.01, 0.1, 0.25, 0.3333, 0.5):
            made = Dataset.from_dict({"a": list(range(rows))}).train_test_split(test_size=fraction, seed=0)
            assert (len(made["train"]), len(made["test"])) == eval_split(rows, fraction), (rows, fraction)


def _config(tmp_path, data_lines: str, **extra) -> Facts:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "d.jsonl").write_text(data_lines)
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra.items())
    (tmp_path / "run.toml").write_text(f'[model]\npath = "m"\n[data]\ntrain = "d.jsonl"\n{lines}')
    return Facts(Inputs(config=tmp_path / "run.toml"))


def test_an_eval_fraction_that_leaves_no_training_row_is_refused_with_the_counts(tmp_path):
    facts = _config(tmp_path, '{"text": "a"}\n', eval_fraction=0.01)
    with pytest.raises(InputError) as refused:
        facts.get("data")
    assert str(refused.value) == (
        f"{tmp_path / 'run.toml'}: [data].eval_fraction: 0.01 of 1 training row holds out 1 "
        "for eval and leaves 0 to train on (datasets' train_test_split holds out ceil(0.01 x "
        "1)): give more rows, or an eval file ([data] eval)"
    )
    assert _config(tmp_path, '{"text": "a"}\n{"text": "b"}\n', eval_fraction=0.01).get("data")["split"] == {
        "fraction": 0.01,
        "train": 1,
        "eval": 1,
    }


def test_parquet_and_json_in_one_split_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"text": "a"}]), tmp_path / "p.parquet")
    facts = _config(tmp_path, '{"text": "a"}\n')
    (tmp_path / "run.toml").write_text('[model]\npath = "m"\n[data]\ntrain = ["d.jsonl", "p.parquet"]\n')
    with pytest.raises(InputError, match=r"\[data\]\.train: mixes Parquet \(p\.parquet\) and JSON files"):
        facts.get("data")
