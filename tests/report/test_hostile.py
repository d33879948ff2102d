"""`sftdoctor report` on hostile run directories (tests/hostile.py's vocabulary, applied by tests/rundirs.py): it
keeps the CLI contract (tests/cli_contract.py), refuses in one line what it cannot read of what it needs, says
what it left out, and never judges a curve over a NaN or an infinity ("fell", "stayed level", ✓)."""

from __future__ import annotations

import math
import os
import re

import pytest
from cli_contract import sftdoctor
from hostile import SPECIAL, no_hang
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rundirs import metrics, mutate, mutation, not_numbers, run_dir, strict

from sftdoctor.errors import InputError
from sftdoctor.report import command, page
from sftdoctor.report.panels import Axis

FUZZ = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
FILES = ("resolved.json", "metrics.jsonl", "findings.jsonl", "stopped.json")
CORE = ("resolved.json", "metrics.jsonl", "findings.jsonl")  # what a report cannot be made (or written) without
READERS = {
    "loss": "loss-plateau",
    "grad_norm": "grad-norm-curve",
    "learning_rate": "lr-curve",
    "eval_loss": "overfitting",
}


def report(runs, root, out, *options):
    scratch = root / "scratch"
    scratch.mkdir(exist_ok=True)
    with no_hang(30):
        return sftdoctor(["report", *runs, "--output", out, "--no-plugins", *options], scratch, [*runs, out, "--x"])


def verdicts(result, as_json: bool) -> dict[str, str]:
    """check id -> the title its reader gave (a message id `CHECK/slug` counts for its check)."""
    if as_json:
        return {f["id"].split("/")[0]: f["title"] for run in strict(result.stdout)["runs"] for f in run["findings"]}
    found = re.finditer(r"^\S+\s+([a-z-]+)(?:/[a-z0-9-]+)?\s{2,}(.+)$", result.stdout, re.MULTILINE)
    return {m[1]: m[2] for m in found}


def row(step: int) -> int:
    return next(i for i, r in enumerate(metrics()) if r["step"] == step and "loss" in r)


def read(run):
    """The run as the report reads it and its page without panels: reading, judging and writing the page are
    what is under test here, drawing is the slow part and the fuzzer's."""
    [judged] = command.load([run], "step", plugins=False)
    return judged, page.page([judged], [], Axis("step"))


def test_a_loss_that_went_nan_is_a_finding_not_a_fall(tmp_path):
    """Before: "✓ loss-plateau the train loss fell 70%" over a loss that was NaN for its last steps, and the
    page's "last train loss" was the last finite one."""
    run = run_dir(tmp_path / "run")
    for step in (22, 23, 24):
        mutate(run, ("non_finite", "metrics.jsonl", row(step), "loss", math.nan))
    judged, html = read(run)
    [finding] = [f for f in judged.verdicts if f.id == "loss-plateau/non-finite"]
    assert finding.severity.value == "error"
    assert finding.title == "the train loss is non-finite from step 22 (NaN): 3 of 24 logged points"
    assert (22, finding.id) in [(step, r["id"]) for _, step, r in judged.run.marks]  # marked on the panels
    assert "NaN (step 24); last finite 0.6" in html and "non-finite from step 22 (NaN)" in html


def test_tokens_that_are_not_numbers_have_no_place_on_a_tokens_axis(tmp_path):
    run = run_dir(tmp_path / "run")
    mutate(run, ("non_finite", "metrics.jsonl", row(5), "tokens_seen", math.nan))
    with pytest.raises(InputError) as caught:
        command.load([run], "tokens", plugins=False)
    assert str(caught.value) == (
        f"{run}: its count of tokens seen is non-finite at 1 of 24 logged points, first at "
        "step 5 (NaN): compare it with --x step"
    )


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name", CORE)
def test_a_file_the_report_needs_that_is_not_a_file_is_refused_in_one_line(tmp_path, name, kind):
    """Read with a bare read_text, a FIFO blocked forever and /dev/zero ate memory."""
    run = run_dir(tmp_path / "run")
    mutate(run, ("special", name, kind))
    if kind == "empty" and name == "findings.jsonl":  # no findings recorded yet: read as such
        assert read(run)[0].run.curves["problems"] == []
        return
    result = report([run], tmp_path, tmp_path / "out")
    [line] = result.stderr.splitlines()
    assert result.exit_code == 2 and line.startswith(f"sftdoctor: error: {run / name}: "), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_stop_record_that_cannot_be_read_is_said_not_read_as_not_stopped(tmp_path, kind):
    run = run_dir(tmp_path / "run", stopped=True)
    mutate(run, ("special", "stopped.json", kind))
    with no_hang(20):
        judged, html = read(run)
    [problem] = judged.run.curves["problems"]
    assert problem.startswith(f"{run / 'stopped.json'}: ") and problem.endswith("how the run ended is not known")
    assert "<h2>Not read</h2>" in html and "how the run ended is not known" in html


def test_lines_of_findings_that_are_not_findings_are_said_and_kept(tmp_path):
    """Before: left out of the page silently, and dropped from findings.jsonl when the report rewrote it."""
    run = run_dir(tmp_path / "run")
    with open(run / "findings.jsonl", "a") as log:
        log.write('{"title": 3}\n["x"]\n')
    problems = []
    assert [r["id"] for r in command.findings_of(run, problems)] == ["gpu-topology", "loss-spike"]
    assert problems == [
        f"{run / 'findings.jsonl'}: line 3 and 1 more line: not a finding record (a JSON object with "
        'a "title"), left out of the report'
    ]
    command.record_postrun(run, [{"phase": "postrun", "title": "t"}])
    assert (run / "findings.jsonl").read_text().splitlines()[2:] == [
        '{"title": 3}',
        '["x"]',
        '{"phase": "postrun", "title": "t"}',
    ]


def _series_clean(changes: list[tuple]) -> bool:
    metric = [c for c in changes if c[1] == "metrics.jsonl"]
    return all(c[0] == "non_finite" for c in metric) and not any(c[1] == "resolved.json" for c in changes)


@pytest.mark.slow  # 12 reports in-process, each drawing its panels: about 8 s of CPU
@given(data=st.data())
@settings(max_examples=int(os.environ.get("FUZZ_N", 12)), **FUZZ)
def test_fuzzed_run_directories_keep_the_contract_and_judge_no_curve_over_a_nan(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("report")
    run = run_dir(root / "run", stopped=data.draw(st.booleans(), label="stopped"))
    changes = [c for c in data.draw(st.lists(mutation(FILES), max_size=3), label="changes") if mutate(run, c)]
    before = {p.name for p in run.iterdir()}
    as_json = data.draw(st.booleans(), label="--json")
    axis = data.draw(st.sampled_from(["step", "tokens"]), label="--x")
    result = report([run], root, root / "out", "--x", axis, *(["--json"] if as_json else []))
    assert not [p for p in run.iterdir() if p.name.startswith(".")]
    assert {p.name for p in run.iterdir()} <= before | {"findings.jsonl"}
    if result.exit_code == 2:
        assert any(c[1] in CORE for c in changes), result.stderr
        assert not (root / "out").exists() or not list((root / "out").iterdir())
        return
    if any(c[0] == "special" and c[1] == "stopped.json" for c in changes):
        assert "stopped.json" in result.stderr
    said = verdicts(result, as_json)
    if _series_clean(changes):
        for series in not_numbers(changes):
            title = said[READERS[series]]
            assert "non-finite" in title and "fell" not in title and "stayed level" not in title, (series, title)
    if any("non-finite" in title for title in said.values()):
        assert "non-finite" in (root / "out" / "report.html").read_text()
