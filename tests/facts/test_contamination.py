"""The 13-gram scan of the training rows against the eval documents: real files, a real local lm-eval task."""

import json

import pytest

from sftdoctor.facts.contamination import Index, known_runs, scan, words

SENTENCES = [
    f"the {c} fox number {i} jumps over the lazy dog near the old river bank at dawn"
    for i, c in enumerate(["red", "brown", "grey", "white", "black"])
]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat(user, answer="ok"):
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def test_a_training_row_holding_13_words_of_an_eval_document_makes_it_dirty(tmp_path):
    eval_file = write_rows(tmp_path / "eval.jsonl", [chat(s) for s in SENTENCES])
    train = write_rows(
        tmp_path / "train.jsonl",
        [
            chat("unrelated words only here"),
            chat("Please: " + SENTENCES[3].upper() + " thanks"),
            chat(" ".join(SENTENCES[1].split()[:12])),
        ],
    )  # 12 words: not 13
    found = scan({"train": [str(train)], "eval_files": [str(eval_file)], "tasks": [], "include": None})
    source = found["sources"]["eval file eval.jsonl"]
    assert (found["train_rows"], source["docs"], source["touched"], source["too_short"]) == (3, 5, 1, 0)
    [example] = source["examples"]
    assert example["train"] == f"{train} line 2" and example["eval"] == f"{eval_file} line 4"
    assert len(example["overlap"].split()) == 13


def test_short_documents_must_occur_whole_and_the_shortest_are_not_judged():
    index = Index("t", [("d0", "one two three four five six seven eight"), ("d1", "too short to judge")])
    index.scan("row", words("x one two three four five six seven eight y"))
    assert index.result() == {
        "docs": 2,
        "touched": 1,
        "too_short": 1,
        "rules": {"word 13-grams": 1},
        "too_short_below": "8 words",
        "examples": [
            {
                "train": "row",
                "eval": "d0",
                "rule": "word 13-grams",
                "shared": "8 words",
                "overlap": "one two three four five six seven eight",
            }
        ],
    }


def test_only_stretches_of_known_words_are_cut_into_ngrams():
    vocab = set(words(SENTENCES[0]))
    row = words("zzz " + SENTENCES[0] + " qqq short known the fox")
    assert list(known_runs(row, vocab)) == [words(SENTENCES[0])]


@pytest.mark.slow  # lm-eval loads the local task
def test_a_local_lm_eval_task_is_scanned_as_lm_eval_renders_it(tmp_path):
    task = tmp_path / "tasks"
    task.mkdir()
    write_rows(task / "docs.jsonl", [{"question": s, "answer": "yes"} for s in SENTENCES])
    (task / "foxes.yaml").write_text(
        "task: foxes\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
        f"{task / 'docs.jsonl'}\ntest_split: test\noutput_type: generate_until\n"
        'doc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: exact_match\n"
    )
    train = write_rows(tmp_path / "train.jsonl", [chat(SENTENCES[0]), chat(SENTENCES[2]), chat("nothing")])
    found = scan({"train": [str(train)], "eval_files": [], "tasks": ["foxes"], "include": str(task)})
    assert found["sources"]["foxes"]["touched"] == 2 and found["sources"]["foxes"]["docs"] == 5
    assert found["sources"]["foxes"]["examples"][0]["eval"] == "foxes document 0"


@pytest.mark.slow  # lm-eval in a child process
def test_the_bundled_example_is_scanned_against_its_tasks_and_its_eval_file():
    import subprocess
    import sys

    from conftest import EXAMPLES

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sftdoctor",
            "check",
            "--config",
            str(EXAMPLES / "tiny.toml"),
            "--select",
            "contamination",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    titles = [f["title"] for f in json.loads(proc.stdout)["findings"]]
    # its synthetic rows repeat 20 words: one sorted answer of the eval split shares 13 words with a training row
    assert titles[0].startswith("eval file eval.jsonl: 1 of 37 documents (2.7%) occur in the training rows")
    assert titles[1:] == [
        "tiny_count_choice: none of 100 documents occurs in the 1,200 training rows (word 13-grams)",
        "tiny_count_gen: none of 100 documents occurs in the 1,200 training rows (word 13-grams)",
    ]


@pytest.mark.slow
def test_the_scan_leaves_the_working_folder_as_it_found_it(tmp_path):
    import os

    before = os.getcwd()
    test_a_local_lm_eval_task_is_scanned_as_lm_eval_renders_it(tmp_path)
    assert os.getcwd() == before
