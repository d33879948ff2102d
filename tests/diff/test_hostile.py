"""`sftdoctor diff` on hostile run directories (tests/hostile.py's vocabulary, applied by tests/rundirs.py): it
keeps the CLI contract (tests/cli_contract.py) and never says "agree", "0 differences" or "identical" about
what was absent, unreadable or not a number."""

from __future__ import annotations

import math
import os

import pytest
from cli_contract import sftdoctor
from hostile import SPECIAL, no_hang
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rundirs import metrics, mutate, mutation, not_numbers, run_dir, strict

FUZZ = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}


def diff(a, b, root, *options):
    with no_hang(20):
        return sftdoctor(["diff", a, b, *options], root, [a, b])


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_run_record_that_is_not_a_file_is_refused_in_one_line(tmp_path, kind):
    a, b = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    mutate(b, ("special", "resolved.json", kind))
    result = diff(a, b, tmp_path)
    [line] = result.stderr.splitlines()
    assert result.exit_code == 2 and line.startswith(f"sftdoctor: error: {b / 'resolved.json'}: "), line


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_facts_json_that_is_not_a_file_costs_its_areas_named_never_agreement(tmp_path, kind):
    """Read with a bare read_text, a FIFO here blocked forever and /dev/zero ate memory."""
    a, b = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    mutate(b, ("special", "facts.json", kind))
    result = diff(a, b, tmp_path)
    lines = result.stdout.splitlines()
    assert result.exit_code == 1
    assert any(
        line.startswith(
            "note    not compared: data, stack, gpus, env: B has a facts.json that cannot be used: "
            f"{b / 'facts.json'}: "
        )
        for line in lines
    ), lines
    assert lines[-1] == "no difference in plan; not compared: data, stack, gpus, env"


@pytest.mark.parametrize("kind", SPECIAL)
def test_metrics_that_are_not_a_file_leave_the_curves_not_compared(tmp_path, kind):
    a, b = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    mutate(a, ("special", "metrics.jsonl", kind))
    result = diff(a, b, tmp_path)
    assert result.stdout.splitlines()[3].startswith(f"curves  not compared: {a / 'metrics.jsonl'}"), result.stdout
    assert result.stdout.splitlines()[-1] == "no difference in data, plan, stack, gpus, env; not compared: curves"
    assert result.exit_code == 0  # the causes were all compared and agree


def test_a_run_without_facts_says_what_was_not_compared_never_0_differences(tmp_path):
    """Before: "0 differences", exit 0, for a run that recorded no stack, GPUs, environment or data digests."""
    a, b = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    assert diff(a, b, tmp_path).stdout.splitlines()[-1] == "0 differences"
    mutate(b, ("absent", "facts.json"))
    result = diff(a, b, tmp_path)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-3:] == [
        "note    not compared: data, stack, gpus, env: B has no facts.json (trained elsewhere, or before sftdoctor "
        "kept it)",
        "",
        "no difference in plan; not compared: data, stack, gpus, env",
    ]


def test_nan_losses_are_said_where_they_went_never_agreement(tmp_path):
    """Before: "the train losses agree at every one of 24 common steps" and "0 differences" over NaN losses."""
    a, b = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    for run in (a, b):
        for step in (23, 24):
            mutate(run, ("non_finite", "metrics.jsonl", row(step), "loss", math.nan))
    lines = diff(a, b, tmp_path).stdout.splitlines()
    assert lines[3].startswith("curves  both train losses are non-finite at step 23: nothing from there on is compared")
    assert lines[4:6] == [
        "curves  A: the train loss is non-finite from step 23 (NaN): 2 of 24 logged points",
        "curves  B: the train loss is non-finite from step 23 (NaN): 2 of 24 logged points",
    ]
    assert lines[-1] == "no difference in data, plan, stack, gpus, env; non-finite train loss in A and B"
    mutate(a, ("non_finite", "metrics.jsonl", row(22), "loss", math.inf))  # step 22 in A only: they part there
    result = diff(a, b, tmp_path, "--json")
    doc = strict(result.stdout)
    assert doc["curves"]["step"] == 22 and doc["curves"]["a"] == "inf" and isinstance(doc["curves"]["b"], float)


def test_a_nan_at_a_step_the_other_run_did_not_log_is_never_agreement(tmp_path):
    """Found by the fuzzer: A logs step 1 again (a rewind drops its step 2), B's step 2 is NaN. Before: "the train
    losses agree at every one of 23 common steps" over a run whose loss went NaN."""
    a, b = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    mutate(a, ("duplicate", "metrics.jsonl", 0, 2))
    mutate(b, ("non_finite", "metrics.jsonl", 1, "loss", math.nan))
    lines = diff(a, b, tmp_path).stdout.splitlines()
    assert lines[3] == (
        "curves  the train losses agree at the 23 common steps, where both are numbers; the non-finite loss of B "
        "is at steps the other run did not log"
    ), lines
    assert lines[-1].endswith("non-finite train loss in B")


def row(step: int) -> int:
    """The line of metrics.jsonl that logs the train loss of `step`."""
    return next(i for i, r in enumerate(metrics()) if r["step"] == step and "loss" in r)


def _touched(changes: list[tuple], name: str) -> list[tuple]:
    return [c for c in changes if c[1] == name]


def _facts_gap(changes: list[tuple]) -> bool:
    """A change to facts.json that surely leaves an area not compared (or different): the file gone or not a
    file, or a fact, the facts or the data digests replaced or taken away."""
    for change in _touched(changes, "facts.json"):
        if change[0] in ("absent", "special"):
            return True
        if change[0] in ("absent_key", "wrong_type") and (
            change[2] == () or change[2][0] in ("facts", "data_files") and len(change[2]) <= 2
        ):
            return True
    return False


def _nan_loss(changes: list[tuple]) -> bool:
    """A NaN or infinite train loss, in metrics.jsonl changed in no other way, beside an untouched plan."""
    metrics = _touched(changes, "metrics.jsonl")
    return (
        "loss" in not_numbers(metrics)
        and all(c[0] == "non_finite" for c in metrics)
        and not _touched(changes, "resolved.json")
    )


@pytest.mark.slow  # about 150 diffs in-process: about 10 s
@given(data=st.data())
@settings(max_examples=int(os.environ.get("FUZZ_N", 150)), **FUZZ)
def test_fuzzed_run_directories_keep_the_contract_and_claim_nothing_unearned(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("diff")
    a, b = run_dir(root / "a"), run_dir(root / "b")
    applied = {}
    for run in (a, b):
        changes = data.draw(st.lists(mutation(), max_size=3), label=f"changes to {run.name}")
        applied[run.name] = [c for c in changes if mutate(run, c)]
    as_json = data.draw(st.booleans(), label="--json")
    result = diff(a, b, root, *(["--json"] if as_json else []))
    every = applied["a"] + applied["b"]
    # resolved.json is what makes a run directory: gone, not a file or not an object, it is refused; nothing else is
    core = [
        c
        for c in _touched(every, "resolved.json")
        if c[0] in ("absent", "special") or c[0] == "wrong_type" and c[2] == ()
    ]
    assert result.exit_code == 2 if core else result.exit_code != 2 or _touched(every, "resolved.json"), result.stderr
    if result.exit_code == 2:
        return
    out = result.stdout
    if as_json:
        doc = strict(out)
        assert doc["not_compared"] or not _facts_gap(every), doc
        assert result.exit_code == 1 or not _facts_gap(every)
        return
    assert "identical" not in out and "\u2713" not in out
    if "0 differences" in out:
        assert "not compared" not in out and "non-finite" not in out, out
    if _facts_gap(every):
        assert result.exit_code == 1 and "0 differences" not in out, out
    if any(c[0] in ("absent", "special") for c in _touched(every, "metrics.jsonl")):
        assert "curves  not compared: " in out and "agree at every" not in out, out
    if _nan_loss(applied["a"]) or _nan_loss(applied["b"]):
        assert "agree at every" not in out and "0 differences" not in out, out
        assert "non-finite" in out or "curves  not compared: " in out, out
