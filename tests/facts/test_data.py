"""The data fact: rows and shape of JSONL, JSON and Parquet files, without the datasets library."""

import json

import pytest

from sftdoctor.errors import InputError
from sftdoctor.facts.data import describe


def test_jsonl_json_and_parquet_give_rows_and_shape(tmp_path):
    rows = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(7)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "b.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    for name in ("a.jsonl", "b.json", "c.parquet"):
        assert describe([str(tmp_path / name)]) == {"files": [str(tmp_path / name)], "rows": 7, "shape": "prompt_completion"}
    both = describe([str(tmp_path / "a.jsonl"), str(tmp_path / "c.parquet")])
    assert both["rows"] == 14


@pytest.mark.parametrize("content, message", [
    ('{"text": "a"}\n{"messages": []}\n', "mixed row shapes"),
    ('{"text": "a"\n', "line 1: not a JSON object"),
    ('{"input": "a"}\n', r"found keys \['input'\]"),
])
def test_bad_data_files_are_input_errors(tmp_path, content, message):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        describe([str(path)])


def test_a_format_that_disagrees_with_the_rows_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n')
    with pytest.raises(InputError, match=r"\[data\].format is 'messages' but the rows are 'text'"):
        describe([str(path)], "messages")
