"""`sftdoctor sweep` on issue 40's hostile studies: a `study.journal` whose lines hold wrong types (a traceback
after the work, when the table was drawn or the next trial asked), a journal cut short (Optuna's next write
landed on the cut line and garbled both), files that are not files where the journal goes, and objectives
that are not numbers (a NaN trial ranked best); and a fuzzer over every option of `sweep` and every key of
every journal line, drawing from tests/hostile.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import pytest
from cli_contract import sftdoctor
from hostile import NON_FINITE, NON_FINITE_JSON, SPECIAL, no_hang, remove, special_file, wrong_type
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState
from sweeprun import LIGHT_BASE

from sftdoctor.cli import main
from sftdoctor.errors import InputError
from sftdoctor.sweep import results
from sftdoctor.sweep import study as studies
from sftdoctor.sweep.config import load_sweep
from sftdoctor.sweep.journal import check_journal

SPACE = "training.learning_rate = {log_uniform = [1e-6, 1e-4]}\ntraining.warmup_ratio = {choices = [0.0, 0.1]}"


@pytest.fixture(autouse=True)
def _quiet():
    studies.quiet_optuna()


def local_sweep(folder: Path, trials: int = 3, output_dir: Path | None = None):
    """A sweep over a base whose model is the tiny example's config (a local folder: nothing to download)."""
    for data in ("train.jsonl", "eval.jsonl"):
        (folder / data).write_text('{"text": "a"}\n')
    (folder / "base.toml").write_text(LIGHT_BASE)
    out = f'output_dir = "{output_dir}"\n' if output_dir else ""
    (folder / "sweep.toml").write_text(f'[sweep]\nbase = "base.toml"\ntrials = {trials}\n{out}\n[space]\n{SPACE}\n')
    return load_sweep(folder / "sweep.toml")


def finished(sweep, values=(1.25, 2.5, 1.125)) -> Path:
    """A study of complete trials (one of them pruned), written by Optuna itself: its journal's lines are the
    fuzzer's starting point."""
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    study, space, worker = studies.open_study(sweep, sweep.space, {"note": "not narrowed"})
    study = studies.load(sweep, space, worker)
    for i, value in enumerate(values):
        trial = studies.next_trial(study, sweep, space)
        trial.report(value + 1, 5)
        if i == 1:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, value)
    return sweep.output_dir / studies.JOURNAL


def lines(journal: Path) -> list[dict]:
    return [json.loads(line) for line in journal.read_text().splitlines()]


def write(journal: Path, records: list[dict]) -> None:
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))


def opened(sweep):
    return studies.open_study(sweep, sweep.space, {"note": "not narrowed"})


def refused(opening, starts: str) -> str:
    """The one-line refusal that `opening()` raises, which must start with `starts`."""
    with pytest.raises(InputError) as caught:
        opening()
    assert str(caught.value).startswith(starts), caught.value
    return str(caught.value)


# ---- wrong types, refused when the study is opened ---------------------------------------------------------


@pytest.mark.parametrize(
    "op, key, bad, says",
    [
        (6, "values", ["1.25"], 'values: a JSON list ["1.25"]; expected a list of one number (the objective) or null'),
        (6, "values", [1.0, 2.0], "values: a JSON list [1.0, 2.0]; expected a list of one number"),
        (6, "state", "COMPLETE", "state: a JSON string 'COMPLETE'; expected a trial state (0 to 4)"),
        (6, "state", 7, "state: 7; expected a trial state (0 to 4)"),
        (6, "datetime_complete", 12, "datetime_complete: 12; expected an ISO date and time"),
        (7, "intermediate_value", None, "intermediate_value: a JSON null; expected a number"),
        (7, "step", 1.5, "step: 1.5; expected an integer"),
        (5, "param_value_internal", "1e-5", "param_value_internal: a JSON string '1e-5'; expected a finite number"),
        (5, "distribution", "{}", "distribution: a JSON string '{}'; expected an Optuna distribution"),
        (4, "study_id", "0", "study_id: a JSON string '0'; expected an integer"),
        (0, "directions", ["MINIMIZE"], 'directions: a JSON list ["MINIMIZE"]; expected a list of one study direction'),
        (8, "user_attr", {"a": 1, "b": 2}, 'user_attr: a JSON object {"a": 1, "b": 2}; expected an object of one key'),
    ],
)
def test_a_journal_line_of_wrong_type_names_the_file_the_line_and_the_key(tmp_path, op, key, bad, says):
    """Each one replayed without a word and failed later: in the table (a string score), when the best was
    ranked, or at the next trial."""
    sweep = local_sweep(tmp_path)
    journal = finished(sweep)
    records = lines(journal)
    number = next(i for i, r in enumerate(records, 1) if r["op_code"] == op and key in r)
    records[number - 1][key] = bad
    write(journal, records)
    for opening in (lambda: opened(sweep), lambda: studies.existing(sweep)):  # a run (or its resume), --dry-run
        refused(opening, f"{journal}: line {number}: {says}")


def test_the_study_record_of_the_sweep_is_checked_too(tmp_path):
    """The space a rerun samples is read back from the study: a key of it of the wrong type failed in Optuna's
    distributions at the next trial."""
    sweep = local_sweep(tmp_path)
    journal = finished(sweep)
    records = lines(journal)
    number = next(i for i, r in enumerate(records, 1) if r["op_code"] == 2 and "sweep" in r["user_attr"])
    records[number - 1]["user_attr"]["sweep"]["space"][0]["low"] = "1e-6"
    write(journal, records)
    says = "user_attr.sweep.space[0].low: a JSON string '1e-6'; expected a finite number"
    refused(lambda: opened(sweep), f"{journal}: line {number}: {says}")


def test_a_journal_cut_short_is_refused_with_how_to_go_on(tmp_path):
    """Optuna skips a last line without its newline, then writes its next line onto it: both garbled, and the
    study unreadable mid-sweep."""
    sweep = local_sweep(tmp_path)
    journal = finished(sweep)
    whole = journal.read_bytes()
    keep = whole.rstrip(b"\n").rfind(b"\n") + 1
    journal.write_bytes(whole[:-10])
    count = whole.count(b"\n")
    message = refused(lambda: opened(sweep), f"{journal}: line {count}: cut short (no newline at its end")
    assert f"truncate -s {keep} {journal}" in message
    journal.write_bytes(whole[:keep])  # as the message says: the study opens again
    opened(sweep)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dev-null", "unreadable", "dangling", "loop", "folder"])
def test_a_journal_that_is_not_a_file_is_one_line(tmp_path, kind):
    sweep = local_sweep(tmp_path)
    sweep.output_dir.mkdir(parents=True)
    journal = special_file(sweep.output_dir / studies.JOURNAL, kind)
    with no_hang(20):
        for opening in (lambda: opened(sweep), lambda: studies.existing(sweep)):
            with pytest.raises(InputError, match=f"^{journal}: "):
                opening()


# ---- objectives that are not numbers ---------------------------------------------------------------------


@pytest.mark.parametrize("literal", NON_FINITE_JSON)
def test_a_trial_whose_objective_is_not_finite_is_never_ranked_best(tmp_path, literal):
    """A NaN compares false with everything, so sorted() leaves it where it was (first, here), and -inf is the
    smallest loss of all: either one was ranked best and best.toml named it."""
    sweep = local_sweep(tmp_path)
    journal = finished(sweep, values=(1.25, 2.5, 0.5))
    records = lines(journal)
    next(r for r in records if r["op_code"] == 6 and r["state"] == 1)["values"] = [float(literal)]
    write(journal, records)
    assert literal in journal.read_text()
    check_journal(journal)  # a number, as Optuna reads it: shown, not refused
    study = studies.load(sweep, sweep.space, 0)
    top, ranked = results.best(study)
    assert top.number == 2 and [t.number for t in ranked] == [2]
    assert "not ranked: its objective is" in results.table(study, sweep)
    values, why = results.importances(study, sweep)
    assert values is None and "1 complete trial" in why


def test_an_eval_json_of_wrong_types_is_no_objective(tmp_path):
    """RUN_DIR/eval.json's score as a string or a list crashed the worker with a traceback."""
    from sftdoctor.sweep.trial import objective

    class Sweep:
        task_metric = ("count", "acc")

    for bad in ("0.75", [0.75], None, {"v": 1}):
        (tmp_path / "eval.json").write_text(json.dumps({"metrics": {"count": {"acc": {"value": bad}}}}))
        value, why = objective(Sweep, tmp_path, None)
        assert value is None and "metrics.count.acc.value: a JSON" in why


# ---- the fuzzer ------------------------------------------------------------------------------------------


def mutations(records: list[dict]):
    """(line index, key, new value) drawn over every key of every line: a value of another JSON type, a
    non-finite number, or the key gone."""

    @st.composite
    def draw_one(draw):
        index = draw(st.integers(0, len(records) - 1))
        keys = sorted(records[index])
        key = draw(st.sampled_from(keys))
        how = draw(st.sampled_from(["type", "non-finite", "gone", "score", "score", "score"]))
        if how == "score":  # an objective (or a reported value) that is no number: read, shown, never ranked
            objectives = [(i, "values") for i, r in enumerate(records) if r["op_code"] == 6 and r["state"] == 1]
            reported = [(i, "intermediate_value") for i, r in enumerate(records) if r["op_code"] == 7]
            index, key = draw(st.sampled_from(objectives * 3 + reported))
            value = draw(st.sampled_from(NON_FINITE))
            return index, key, [value] if isinstance(records[index][key], list) else value
        if how == "type":
            return index, key, draw(wrong_type(records[index][key]))
        if how == "non-finite":
            return index, key, draw(st.sampled_from(NON_FINITE))
        return index, key, KeyError

    return draw_one()


@pytest.fixture(scope="module")
def study_lines(tmp_path_factory) -> tuple[Path, Path, list[dict]]:
    """(the sweep's folder, its output folder outside it, the lines of its study's journal): one study, made
    once, that every example changes (its identity holds the base's paths, so it stays in one folder)."""
    root, out = tmp_path_factory.mktemp("sweep"), tmp_path_factory.mktemp("sweep-out") / "sweep"
    journal = finished(local_sweep(root, trials=3, output_dir=out))
    special_file(root / "facts-fifo", "fifo")
    return root, out, lines(journal)


@pytest.mark.slow  # about 20 s: 60 sweeps in-process, each refused or shown without running a trial
@given(data=st.data())
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
def test_every_option_of_sweep_on_hostile_journals(study_lines, data):
    """Every option of `sweep` (read from click) over a study whose journal has one key of one line changed
    (another type, NaN or ±inf, or gone), or is cut short, or is not a file: a table and exit 0 or 1, or one
    line naming the journal (exit 2); never a traceback, and never a trial whose objective is not a number
    ranked best. Without --dry-run the budget is spent, so no trial runs (a cut journal is only shown: cut at
    a line's end it is a sound, shorter study); the sweep's folder is outside the checked root (finishing writes
    best.toml and the pictures there)."""
    root, out, records = study_lines
    journal = out / studies.JOURNAL
    remove(journal)
    records = [dict(r) for r in records]
    kind = data.draw(st.sampled_from(["mutate", "mutate", "cut", "special"]), label="journal")
    scored = False
    if kind == "mutate":
        index, key, value = data.draw(mutations(records), label="mutation")
        scored = key in ("values", "intermediate_value") and value is not KeyError
        records[index] = {k: v for k, v in records[index].items() if k != key or value is not KeyError}
        if value is not KeyError:
            records[index][key] = value
        write(journal, records)
    elif kind == "cut":
        write(journal, records)
        whole = journal.read_bytes()
        journal.write_bytes(whole[: data.draw(st.integers(0, len(whole) - 1), label="cut at")])
    else:
        special_file(journal, data.draw(st.sampled_from([k for k in SPECIAL if k not in ("empty",)]), label="kind"))
    argv = ["sweep", root / "sweep.toml"]
    options = [p for p in main.commands["sweep"].params if isinstance(p, click.Option) and "--help" not in p.opts]
    chosen = data.draw(st.lists(st.sampled_from(options), unique_by=lambda p: p.name), label="options")
    if data.draw(st.integers(0, 4), label="facts?"):  # --facts one time in five: a bad one refuses first
        chosen = [p for p in chosen if p.is_flag]
    for option in chosen:
        argv += (
            [option.opts[-1]]
            if option.is_flag
            else [
                option.opts[-1],
                data.draw(
                    st.sampled_from([root / "missing.json", root / "facts-fifo", root / "base.toml"]), label="facts"
                ),
            ]
        )
    if kind == "mutate" and scored and "--dry-run" in argv:
        argv.remove("--dry-run")  # to the end of the sweep, where the best is ranked (the budget is spent)
    if kind == "cut" and "--dry-run" not in argv:
        argv.append("--dry-run")  # a cut at a line's end is a shorter, sound study: a run would train its trials
    with no_hang(60):
        result = sftdoctor(
            argv,
            root,
            [journal, root / "sweep.toml", "--facts", root / "missing.json", root / "facts-fifo", root / "base.toml"],
        )
    for line in result.stdout.splitlines():  # "  best         trial 2: eval_loss 1.1250 (...)"
        if line.startswith("  best         trial"):
            assert math.isfinite(float(line.split(": ", 1)[1].split()[1])), result.stdout
