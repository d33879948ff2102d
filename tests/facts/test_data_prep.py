"""The data preparation probe on the installed stack: the tiny example's rows through the run's own SFTTrainer in
a child process (end-to-end, slow), then data-prep-timeout's verdict on what it measured."""

import dataclasses

import pytest
from conftest import EXAMPLES, plan_of, run_of
from trainrun import write_config

from sftdoctor.checks import load_checks, run_check
from sftdoctor.facts import Facts, Inputs, Overlay
from sftdoctor.facts.data_prep import _bound, probe_data_prep
from sftdoctor.run import decide


@pytest.mark.slow
def test_the_tiny_examples_preparation_is_measured_and_fits_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr("sftdoctor.facts.data_prep.FLOOR_BYTES_S", 1)  # no bound: measured
    cfg = write_config(
        tmp_path,
        {
            "model": {"path": str(EXAMPLES / "tiny" / "model"), "weights": "random"},
            "data": {"train": str(EXAMPLES / "tiny" / "data" / "train.jsonl"), "max_length": 256},
            "training": {"packing": True, "max_steps": 4, "output_dir": "out"},
            "launch": {"nproc_per_node": 2},
        },
    )
    facts = Facts(Inputs(config=cfg))
    # the plan without the probes it does not need here (the unused-parameters probe builds a model of its own)
    plan = decide(facts.get("run"), Overlay(facts, unused_parameters=None))
    assert plan.world_size == 2 and plan.packing
    prep = probe_data_prep(Overlay(facts, plan=plan))
    assert prep["sample_rows"] == 256 and prep["baseline_rows"] == 2 and prep["rows_total"] == 1200
    assert prep["basis"] == "bytes"
    assert prep["bytes_total"] == (EXAMPLES / "tiny" / "data" / "train.jsonl").stat().st_size
    assert prep["num_proc"] is None  # sftdoctor's recipe leaves SFTConfig.dataset_num_proc unset: one process
    assert 0 < prep["prep_s"] < 10 and 0 < prep["estimate_s"] < 60
    [finding] = run_check(
        load_checks(plugins=False).checks["data-prep-timeout"], Facts.replay({"data_prep": prep, "plan": plan})
    )
    assert finding.severity.value == "ok" and "of ddp_timeout 1320 s" in finding.title


def test_data_small_enough_to_fit_even_at_the_floor_rate_is_bounded_without_a_child_process(tmp_path):
    """The tiny example's 0.25 MB at 50 kB/s: 5 s, under a tenth of any ddp_timeout sftdoctor sets (>= 140 s)."""
    tiny = EXAMPLES / "tiny" / "data" / "train.jsonl"
    plan = plan_of(run_of(data={"train": (str(tiny),)}, launch={"nproc_per_node": 2}, watch={"hang_timeout_s": 5}))
    assert plan.ddp_timeout_s == 140
    size = tiny.stat().st_size
    assert _bound(plan) == {
        "estimate_s": round(size / 50_000, 2),
        "basis": "bound",
        "bytes_total": size,
        "floor_bytes_s": 50_000,
        "packing": plan.packing,
        "max_length": plan.max_length,
    }
    big = tmp_path / "big.jsonl"  # 1.5 MB: 30 s at the floor, above a tenth of this run's 140 s: measured
    big.write_bytes(tiny.read_bytes() * 6)
    assert _bound(dataclasses.replace(plan, train_files=(str(big),))) is None
    parquet = tmp_path / "train.parquet"  # its size does not say how much text it holds: measured
    parquet.write_bytes(b"PAR1")
    assert _bound(dataclasses.replace(plan, train_files=(str(parquet),))) is None
