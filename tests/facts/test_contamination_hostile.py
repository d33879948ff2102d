"""`sftdoctor check --config --select contamination` on eval and training files that are not files, not rows or not
text: each is refused in one line naming it (exit 2), or judged; a source that was not read is never "none of its
documents occurs" (✓). And on the real CLI: planted Chinese found with its rule named, two eval files of one name
named by their folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_contract import ENV, sftdoctor
from conftest import EXAMPLES
from facts.test_contamination_scripts import CHINESE, ENGLISH, chat, write_rows
from hostile import SPECIAL, no_hang, special_file
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

MODEL = EXAMPLES / "tiny" / "model"
# Row contents that are readable files but odd rows: what the data probe refuses or the scan must survive.
ODD_ROWS = {
    "one-object": '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}',
    "not-an-object": '[1, 2, 3]\n"text"\n',
    "non-string-text": '{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": null}]}\n',
    "empty-turns": '{"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]}\n',
    "huge-line": json.dumps(chat("长" * 1_100_000 + CHINESE[0])) + "\n",  # over PIECE: read in two pieces
    "nested": "[" * 100_000 + "]" * 100_000 + "\n",
    "surrogate": '{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "x"}]}\n',
    "bom-and-crlf": "\ufeff" + json.dumps(chat(CHINESE[1])) + "\r\n",
}


@pytest.fixture(autouse=True)
def _offline_without_plugins(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def config(root, train, evals) -> object:
    quoted = lambda p: json.dumps(str(p))  # noqa: E731 - a TOML basic string is a JSON string
    path = root / "run.toml"
    path.write_text(
        f'[model]\npath = {quoted(MODEL)}\nweights = "random"\n[data]\ntrain = {quoted(train)}\n'
        f"eval = [{', '.join(quoted(e) for e in evals)}]\nmax_length = 256\n[training]\n"
        "global_batch_size = 8\nper_device_batch_size = 8\nmax_steps = 2\npacking = false\n"
    )
    return path


def check(root, names, *paths):
    with no_hang(60):
        return sftdoctor(
            ["check", "--config", root / "run.toml", "--select", "contamination", "-v"],
            root,
            [root / "run.toml", *names, *paths],
        )


def clean_lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("✓")]


def good_train(root):
    return write_rows(
        root / "train.jsonl",
        [chat(f"row {i} 一些普通的文字 and some words") for i in range(40)] + [chat("请看这道题：" + CHINESE[2])],
    )


def make(root, kind, where):
    path = root / "odd" / "test.jsonl"
    if kind in ODD_ROWS:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ODD_ROWS[kind], encoding="utf-8")
        return path
    return special_file(path, kind)


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("where", ["eval", "train"])
def test_a_file_that_is_not_a_file_is_refused_in_one_line_naming_it(tmp_path, kind, where):
    hostile = make(tmp_path, kind, where)
    evals = [hostile] if where == "eval" else [write_rows(tmp_path / "e" / "test.jsonl", [chat(CHINESE[2])])]
    train = hostile if where == "train" else good_train(tmp_path)
    config(tmp_path, train, evals)
    result = check(tmp_path, [hostile])
    assert result.exit_code == 2, result.stdout
    assert not clean_lines(result)


@pytest.mark.parametrize("kind", sorted(set(ODD_ROWS) - {"huge-line", "bom-and-crlf"}))
def test_an_eval_file_of_odd_rows_is_refused_or_not_judged_never_clean(tmp_path, kind):
    hostile = make(tmp_path, kind, "eval")
    config(tmp_path, good_train(tmp_path), [hostile])
    result = check(tmp_path, [hostile])
    assert not any("odd/test.jsonl" in line or "eval file test.jsonl" in line for line in clean_lines(result)), (
        result.stdout
    )


def test_planted_chinese_is_found_through_the_cli_and_its_rule_named(tmp_path):
    dirty = write_rows(tmp_path / "a" / "test.jsonl", [chat(CHINESE[2]), chat(CHINESE[4]), chat(ENGLISH[0])])
    clean = write_rows(tmp_path / "b" / "test.jsonl", [chat(CHINESE[5]), chat(ENGLISH[1])])
    config(tmp_path, good_train(tmp_path), [dirty, clean])
    result = check(tmp_path, [])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "!  contamination/overlap  eval file a/test.jsonl: 1 of 3 documents (33.3%) occur in the "
        f"training rows (word 13-grams for 1, CJK character 25-grams for 2), e.g. {tmp_path}/a/"
        f"test.jsonl line 1 in {tmp_path}/train.jsonl line 41"
    )
    assert 'Shared 25 characters: "长江是中国最长的河流全长约6300公里流经青海西藏四川重"' in lines[1]
    assert lines[4].startswith(
        "✓  contamination          eval file b/test.jsonl: none of 2 documents occurs in the 41 "
        "training rows (word 13-grams for 1, CJK character 25-grams for 1)"
    )


@pytest.mark.slow  # a row of a million characters, read by the data probe and the scan (~4 s)
def test_a_huge_row_is_read_and_judged(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(ODD_ROWS["huge-line"] + json.dumps(chat("x")) + "\n", encoding="utf-8")
    config(tmp_path, train, [write_rows(tmp_path / "eval.jsonl", [chat(CHINESE[0]), chat(CHINESE[3])])])
    result = check(tmp_path, [train])
    assert "eval file eval.jsonl: 1 of 2 documents (50.0%) occur" in result.stdout


ROWS = st.sampled_from(sorted(ODD_ROWS) + ["good", "planted"])


@pytest.mark.slow  # 40 examples, most scanned in a child process: ~25 s
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    eval_kinds=st.lists(st.sampled_from(SPECIAL) | ROWS, min_size=1, max_size=3),
    train_kind=st.sampled_from(SPECIAL) | ROWS,
    same_name=st.booleans(),
)
@example(eval_kinds=["planted", "good", "empty"], train_kind="planted", same_name=True)  # one name, three folders
def test_fuzz_contamination_over_hostile_eval_and_train_files(tmp_path_factory, eval_kinds, train_kind, same_name):
    """Whatever the files: the CLI's contract; a file that is not a file refused (exit 2); when judged, a source
    that was not read whole is never ✓ (an empty one: "not judged"), and a readable one is found dirty exactly when
    the training file holds its documents (the same kind), each named apart from another file of its name."""
    root = tmp_path_factory.mktemp("fuzz")
    # as the findings name them: by the folder too when another file has the name
    endings = [
        f"d{i}/test.jsonl" if same_name and len(eval_kinds) > 1 else "test.jsonl" if same_name else f"e{i}.jsonl"
        for i in range(len(eval_kinds))
    ]
    evals = [
        fuzz_file(root / f"d{i}" / Path(ending).name, kind) for i, (ending, kind) in enumerate(zip(endings, eval_kinds))
    ]
    train = fuzz_file(root / "t" / "train.jsonl", train_kind)
    config(root, train, evals)
    result = check(root, [train, *evals])
    if REFUSED & {train_kind, *eval_kinds} or train_kind == "empty":
        assert result.exit_code == 2, result.stdout  # an empty eval file beside others is read: no documents
    if result.exit_code == 2:
        return
    for ending, kind in zip(endings, eval_kinds):
        said = [line for line in result.stdout.splitlines() if f"eval file {ending}: " in line]
        assert len(said) == 1, result.stdout  # each file its own source, never hidden by another of its name
        if kind in NOTHING_TO_JUDGE:
            assert "not judged: " in said[0], result.stdout
        elif train_kind == kind:  # the training file holds this file's documents
            assert "documents (100.0%) occur in the training rows" in said[0], result.stdout
        else:
            assert said[0].startswith("✓") and "documents occurs in the" in said[0], result.stdout


# What the data probe refuses (exit 2) and what it reads but holds no document long enough to judge.
REFUSED = set(SPECIAL) - {"empty"} | {"not-an-object", "non-string-text", "nested", "surrogate", "bom-and-crlf"}
NOTHING_TO_JUDGE = {"empty", "empty-turns", "one-object"}


def fuzz_file(path, kind):
    if kind in SPECIAL:
        return special_file(path, kind)
    if kind in ODD_ROWS:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ODD_ROWS[kind], encoding="utf-8")
        return path
    docs = [chat(CHINESE[2]), chat(ENGLISH[0])] if kind == "planted" else [chat(CHINESE[6]), chat(ENGLISH[2])]
    return write_rows(path, docs + [chat(f"filler {i} 普通的文字") for i in range(5)])


def test_the_scan_itself_never_opens_a_fifo_and_says_which_eval_file_it_could_not_read(tmp_path):
    """Below the CLI (whose config and data probe refuse these first): the child's own reads go through
    regular_file, so a file swapped for a FIFO or an unreadable one is a source not judged, never a hang."""
    from sftdoctor.errors import InputError
    from sftdoctor.facts.contamination import scan

    fifo, unreadable = (
        special_file(tmp_path / "f" / "test.jsonl", "fifo"),
        special_file(tmp_path / "u.jsonl", "unreadable"),
    )
    good = write_rows(tmp_path / "g" / "test.jsonl", [chat(CHINESE[2])])
    train = write_rows(tmp_path / "train.jsonl", [chat(CHINESE[2])])
    with no_hang(10):
        found = scan(
            {"train": [str(train)], "eval_files": [str(fifo), str(unreadable), str(good)], "tasks": [], "include": None}
        )
    assert found["sources"]["eval file f/test.jsonl"] == {"error": f"{fifo}: expected a data file, got a named pipe"}
    assert found["sources"]["eval file u.jsonl"]["error"].startswith(f"{unreadable}: cannot read")
    assert found["sources"]["eval file g/test.jsonl"]["touched"] == 1
    with no_hang(10), pytest.raises(InputError, match="named pipe"):
        scan({"train": [str(fifo)], "eval_files": [str(good)], "tasks": [], "include": None})
