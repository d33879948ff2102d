"""The eval-tasks probe against the installed lm-eval: a child process asks lm-eval's TaskManager, with the
run's include folder; its answer is kept in the probe cache."""

import shutil

import pytest
from conftest import EXAMPLES

from sftdoctor.facts import Facts, Inputs

pytestmark = pytest.mark.slow


def config(tmp_path, tasks):
    shutil.copytree(EXAMPLES / "tiny" / "tasks", tmp_path / "tasks")
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    names = ", ".join(f'"{t}"' for t in tasks)
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\npath = "m"\n[data]\ntrain = "d.jsonl"\n[eval]\ntasks = [{names}]\ninclude = "tasks"\n')
    return path


def test_local_and_bundled_tasks_are_known_and_a_typo_gets_its_nearest(tmp_path, monkeypatch):
    monkeypatch.setenv("SFTDOCTOR_CACHE", str(tmp_path / "cache"))
    fact = Facts(Inputs(config=config(tmp_path / "a", ["tiny_count_gen", "gsm8k", "tiny_cuont_choice"]))).get(
        "eval_tasks"
    )
    assert fact["installed"] and fact["unknown"] == {"tiny_cuont_choice": "tiny_count_choice"}
    assert fact["indexed"] > 10000  # lm-eval's own tasks were indexed too
    again = Facts(Inputs(config=config(tmp_path / "b", ["tiny_count_gen", "gsm8k", "tiny_cuont_choice"]))).get(
        "eval_tasks"
    )
    assert again == fact and len(list((tmp_path / "cache" / "probes").glob("eval-tasks-*.json"))) == 1


def test_without_eval_there_is_nothing_to_probe(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "run.toml").write_text('[model]\npath = "m"\n[data]\ntrain = "d.jsonl"\n')
    facts = Facts(Inputs(config=tmp_path / "run.toml"))
    assert facts.get("eval_tasks") is None and "no [eval] in the run config" in facts.why_missing("eval_tasks")
