"""data-prep-timeout: rank 0's measured data preparation against ddp_timeout, on a recorded measurement of the tiny
example (tests/fixtures/data_prep/README.md) extrapolated to datasets of other sizes, formats and processes."""

import json

import pytest
from conftest import FIXTURES, plan_of, run_of, severities

from sftdoctor.facts.data_prep import extrapolate
from sftdoctor.run.resolve import ddp_timeout

TINY = json.loads((FIXTURES / "data_prep" / "tiny-packed-2proc.json").read_text())
MEASURED = {
    k: TINY[k]
    for k in ("sample_rows", "sample_bytes", "baseline_rows", "baseline_bytes", "prep_s", "fixed_s", "num_proc")
}
PER_BYTE = TINY["prep_s"] / (TINY["sample_bytes"] - TINY["baseline_bytes"])


def plan(nproc=2, hang_timeout_s=300):
    return plan_of(run_of(launch={"nproc_per_node": nproc}, watch={"hang_timeout_s": hang_timeout_s}))


def prep_of(size_bytes: int, rows: int, name="train.jsonl", num_proc=None, limit=None) -> dict:
    """The tiny example's measured rate, extrapolated to a file of this size."""
    measured = {**MEASURED, "num_proc": num_proc}
    return {**measured, **extrapolate(measured, [(name, size_bytes, rows)], limit), "packing": True}


def bytes_for(seconds: float) -> int:
    return int((seconds - TINY["fixed_s"]) / PER_BYTE)


def test_the_plan_times_out_after_4x_hang_timeout_plus_120_s():
    assert plan().ddp_timeout_s == ddp_timeout(300) == 1320 and plan().world_size == 2


def test_the_tiny_example_prepares_in_well_under_its_timeout(run):
    [finding] = run("data-prep-timeout", data_prep=TINY, plan=plan())
    assert finding.severity.value == "ok"
    assert finding.title.startswith("rank 0 prepares the data in about 1 s, 0% of ddp_timeout 1320 s")
    assert "1,200 rows (0.2 MiB, extrapolated by bytes from 256 rows" in finding.detail
    assert "1 process (SFTConfig.dataset_num_proc unset)" in finding.detail


def test_a_preparation_longer_than_ddp_timeout_is_an_error_whose_fix_covers_twice_the_estimate(run):
    prep = prep_of(bytes_for(2000), 10_000_000)
    [finding] = run("data-prep-timeout", data_prep=prep, plan=plan())
    assert finding.severity.value == "error" and "will time out" in finding.title
    assert "about 2,000 s, 152% of ddp_timeout 1320 s that ranks 1-1 wait in" in finding.title
    needed = int(finding.fix.split("hang_timeout_s = ")[1].split()[0])
    assert 4 * needed + 120 >= 2 * prep["estimate_s"] > 4 * (needed - 1) + 120
    assert finding.evidence["share"] == pytest.approx(prep["estimate_s"] / 1320, abs=1e-3)


def test_above_half_the_timeout_is_a_warning_below_it_ok(run):
    assert severities(run("data-prep-timeout", data_prep=prep_of(bytes_for(700), 1), plan=plan())) == ["warning"]
    assert severities(run("data-prep-timeout", data_prep=prep_of(bytes_for(640), 1), plan=plan())) == ["ok"]
    # the same data against a longer timeout: [watch] hang_timeout_s = 900 gives 3720 s
    assert severities(
        run("data-prep-timeout", data_prep=prep_of(bytes_for(2000), 1), plan=plan(hang_timeout_s=900))
    ) == ["warning"]


def test_more_processes_divide_the_preparation():
    one, eight = prep_of(bytes_for(2000), 1), prep_of(bytes_for(2000), 1, num_proc=8)
    assert eight["estimate_s"] == pytest.approx(TINY["fixed_s"] + (one["estimate_s"] - TINY["fixed_s"]) / 8, abs=0.02)


def test_parquet_is_extrapolated_by_rows_and_a_data_limit_prepares_only_its_share():
    by_rows = prep_of(10, 1_200_000, name="train.parquet")
    assert by_rows["basis"] == "rows" and by_rows["rows_total"] == 1_200_000
    per_row = TINY["prep_s"] / (TINY["sample_rows"] - TINY["baseline_rows"])
    assert by_rows["serial_s"] == pytest.approx(per_row * 1_200_000, rel=1e-3)
    limited = prep_of(bytes_for(2000), 1_000_000, limit=100_000)
    assert limited["rows_total"] == 100_000
    assert limited["serial_s"] == pytest.approx(prep_of(bytes_for(2000), 1_000_000)["serial_s"] / 10, rel=1e-3)


def test_one_process_waits_for_nobody(run):
    skipped = run("data-prep-timeout", data_prep=TINY, plan=plan(nproc=1))
    assert "one process" in skipped.reason


def test_a_probe_that_failed_is_a_warning_that_says_so_never_ok(run):
    [finding] = run(
        "data-prep-timeout",
        data_prep={"estimate_s": None, "error": "the data preparation probe took over 600 s"},
        plan=plan(),
    )
    assert finding.severity.value == "warning" and "could not be measured" in finding.title
    assert "took over 600 s" in finding.detail


def test_a_bound_says_at_most_and_that_it_was_not_measured(run):
    prep = {
        "estimate_s": 5.04,
        "basis": "bound",
        "bytes_total": 252_000,
        "floor_bytes_s": 50_000,
        "packing": True,
        "max_length": 256,
    }
    [finding] = run("data-prep-timeout", data_prep=prep, plan=plan())
    assert finding.severity.value == "ok"
    assert finding.title.startswith("rank 0 prepares the data in at most 5 s, 0% of ddp_timeout 1320 s")
    assert "0.24 MiB of rows, bounded, not measured: even at 50 kB/s" in finding.detail
