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
        assert describe([str(tmp_path / name)]) == {
            "files": [str(tmp_path / name)],
            "rows": 7,
            "format": "prompt_completion",
            "shape": "prompt_completion",
            "conversational_rows": 0,
        }
    both = describe([str(tmp_path / "a.jsonl"), str(tmp_path / "c.parquet")])
    assert both["rows"] == 14


@pytest.mark.parametrize(
    "content, data_format, message",
    [
        (
            '{"text": "a"}\n{"messages": []}\n',
            "auto",
            r"line 2: text is NoneType, expected a string; the rows are text \(this row looks like messages\)",
        ),
        ('{"text": "a"\n', "auto", "line 1: not a JSON object"),
        ('{"input": "a"}\n', "auto", r"line 1: no known format; found \['input'\]"),
        pytest.param(
            '{"text": "a"}\n',
            "messages",
            r"line 1: expected a non-empty list of turns, got NoneType; the rows are "
            r"messages \(this row looks like text\) \(\[data\].format\)",
            id="a format that disagrees with the rows is named",
        ),
    ],
)
def test_bad_data_files_are_input_errors(tmp_path, content, data_format, message):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        describe([str(path)], data_format)


def write_rows(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


GOOD_CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"text": 5}, "line 51: text is int, expected a string"),
        ({"text": None}, "line 51: text is NoneType, expected a string"),
        ({"messages": "hi there"}, "line 51: expected a non-empty list of turns, got str"),
        (
            {"messages": [{"role": "human", "content": "hi"}]},
            "line 51: turn 0: role is 'human', expected one of system",
        ),
        ({"messages": [{"role": "user", "content": ["hi"]}]}, "line 51: turn 0: content is list, expected a string"),
    ],
)
def test_every_row_is_checked_not_only_the_first_ones(tmp_path, bad, says):
    first = {"text": "fine"} if "text" in bad else GOOD_CHAT
    path = write_rows(tmp_path / "d.jsonl", [first] * 50 + [bad] + [first] * 10)
    with pytest.raises(InputError, match="d.jsonl") as err:
        describe([path])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_sharegpt_and_alpaca_are_recognised_and_become_messages(tmp_path):
    from sftdoctor.facts.data import to_messages

    share = {
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "2+2?"},
            {"from": "gpt", "value": "4"},
        ]
    }
    alpaca = {"instruction": "Add the numbers.", "input": "2 and 2", "output": "4", "system": "be brief"}
    assert describe([write_rows(tmp_path / "s.jsonl", [share] * 3)])["format"] == "sharegpt"
    described = describe([write_rows(tmp_path / "a.jsonl", [alpaca, {**alpaca, "input": ""}])])
    assert (described["format"], described["shape"], described["rows"]) == ("alpaca", "messages", 2)
    assert to_messages(share, "sharegpt") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert to_messages(alpaca, "alpaca") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Add the numbers.\n\n2 and 2"},
        {"role": "assistant", "content": "4"},
    ]
    with pytest.raises(InputError, match="line 2: turn 0: from is 'robot'"):
        describe([write_rows(tmp_path / "bad.jsonl", [share, {"conversations": [{"from": "robot", "value": "x"}]}])])


def test_an_unknown_format_names_the_formats_and_the_keys_found(tmp_path):
    with pytest.raises(InputError) as err:
        describe([write_rows(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}])])
    said = str(err.value)
    assert (
        "found ['answer', 'question']" in said
        and "sharegpt (conversations)" in said
        and "alpaca (instruction + output)" in said
    )


def test_an_empty_file_and_a_blank_text_are_bad_input(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no rows"):
        describe([str(tmp_path / "empty.jsonl")])
    with pytest.raises(InputError, match="line 1: text is empty"):
        describe([write_rows(tmp_path / "d.jsonl", [{"text": "   "}])])


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

LEAF = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
ROW = st.recursive(
    LEAF,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "messages",
                    "role",
                    "content",
                    "text",
                    "prompt",
                    "completion",
                    "conversations",
                    "from",
                    "value",
                    "instruction",
                    "input",
                    "output",
                    "system",
                ]
            ),
            c,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(st.lists(ROW, min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_any_rows_give_a_description_or_one_clean_input_error(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("rows") / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        described = describe([str(path)])
    except InputError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
    else:
        assert described["rows"] == len(rows) and described["shape"] in ("messages", "prompt_completion", "text")


def test_a_key_that_changes_type_between_rows_is_named_where_datasets_cannot_load_it(tmp_path):
    """datasets 4.x: 'Column(/tags) changed from array to number'; 5.x loads it as a Json column."""
    from datasets import load_dataset

    from sftdoctor.facts.data import describe, mixed_columns_load

    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "tags": ["x"]}\n{"text": "b"}\n{"text": "c", "tags": 5}\n')
    with pytest.raises(InputError, match=r"line 3: tags is a number, but it is a list at d.jsonl line 1"):
        describe([str(path)], one_type_per_key=True)
    assert describe([str(path)])["rows"] == 3
    try:  # what the installed datasets does is what the probe says it does
        load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
        loads = True
    except Exception:
        loads = False
    assert mixed_columns_load() is loads
    path.write_text('{"text": "a", "score": 1}\n{"text": "b", "score": 0.5}\n{"text": "c", "score": null}\n')
    assert describe([str(path)], one_type_per_key=True)["rows"] == 3  # int and float are one column; null fits any


def test_half_a_surrogate_pair_is_bad_input_and_a_whole_pair_is_text(tmp_path):
    from sftdoctor.facts.data import describe

    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok \\ud83d\\ude00"}\n{"text": "a\\udb3fb"}\n')
    with pytest.raises(InputError, match=r"line 2: a string holds an unpaired UTF-16 surrogate \(\\udb3f\)"):
        describe([str(path)])
    path.write_text('{"text": "ok \\ud83d\\ude00"}\n')
    assert describe([str(path)])["rows"] == 1


def test_locate_names_the_file_and_line_as_datasets_numbers_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sftdoctor.facts.data import locate

    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n\n{"text": "b"}\n   \n{"text": "c"}\n')
    (tmp_path / "b.json").write_text('[{"text": "d"}, {"text": "e"}]')
    pq.write_table(pa.table({"text": ["f", "g"]}), tmp_path / "c.parquet")
    files = [str(tmp_path / n) for n in ("a.jsonl", "b.json", "c.parquet")]
    assert locate(files, {0, 2, 3, 6}) == {
        0: "a.jsonl line 1",
        2: "a.jsonl line 5",
        3: "b.json row 1",
        6: "c.parquet row 2",
    }
    from datasets import load_dataset  # the numbering the trainer's rows carry

    assert load_dataset("json", data_files=files[:1], split="train")["text"] == ["a", "b", "c"]
    assert locate(files, {99}) == {}
