"""What `sftdoctor eval TARGET` loads: a run directory's final model, a checkpoint, a model folder, an
adapter (onto the base its config names), a cached hub id; anything else is a one-line error."""

import json

import pytest

from sftdoctor.errors import InputError
from sftdoctor.eval.target import resolve_target


def model_folder(path, tokenizer=True):
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


def run_dir(tmp_path, final="model"):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "resolved.json").write_text(json.dumps({"tokenizer_path": "/models/tok"}))
    if final == "model":
        model_folder(run / "final")
    elif final == "adapter":
        (run / "final").mkdir()
        (run / "final" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(run / "base")}))
    return run


def test_a_run_directory_is_its_final_model_and_results_belong_to_the_run(tmp_path):
    run = run_dir(tmp_path)
    target = resolve_target(str(run))
    assert (target.kind, target.path, target.run_dir) == ("model", str(run / "final"), run)
    assert target.tokenizer == str(run / "final")


def test_an_adapter_loads_onto_the_base_its_config_names_with_the_runs_tokenizer(tmp_path):
    run = run_dir(tmp_path, final="adapter")
    target = resolve_target(str(run))
    assert (target.kind, target.base) == ("adapter", str(run / "base"))
    assert target.tokenizer == "/models/tok"  # final/ holds no tokenizer here: the run's own


def test_a_checkpoint_is_a_model_of_its_run(tmp_path):
    run = run_dir(tmp_path)
    checkpoint = model_folder(run / "checkpoint-30", tokenizer=False)
    target = resolve_target(str(checkpoint))
    assert (target.kind, target.path, target.run_dir, target.tokenizer) == (
        "model",
        str(checkpoint),
        run,
        "/models/tok",
    )


@pytest.mark.parametrize(
    "case, message",
    [
        ("unfinished run", "a run directory without final/"),
        ("empty folder", "neither config.json (a model) nor adapter_config.json"),
        ("adapter without base", "names no base model"),
        ("broken adapter config", "not valid JSON"),
        ("missing", "no such model folder, run directory or cached hub id"),
        ("uncached hub id", "not a folder here and not in the local Hugging Face cache"),
    ],
)
def test_what_cannot_be_evaluated_is_a_one_line_error(tmp_path, monkeypatch, case, message):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    given = str(tmp_path / "x")
    if case == "unfinished run":
        given = str(run_dir(tmp_path, final=None))
    elif case == "empty folder":
        (tmp_path / "x").mkdir()
    elif case in ("adapter without base", "broken adapter config"):
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "adapter_config.json").write_text("{}" if case == "adapter without base" else "{")
    elif case == "uncached hub id":
        given = "nobody/no-such-model"
    with pytest.raises(InputError) as raised:
        resolve_target(given)
    assert message in str(raised.value) and "\n" not in str(raised.value)
