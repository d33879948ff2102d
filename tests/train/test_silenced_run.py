"""A run with silenced findings, end to end: the gate prints them marked silenced, the ids are recorded in the run
directory (resolved.json, each findings.jsonl record) and said in the summary at the end and by `sftdoctor report`."""

import json
import subprocess
import sys

import pytest
from trainrun import config, train

pytestmark = pytest.mark.slow  # end-to-end: sftdoctor train for real, then sftdoctor report


def test_silenced_ids_are_shown_recorded_and_summarised(tmp_path, tiny_data):
    cfg = config(
        tmp_path,
        tiny_data["messages"],
        training={"max_steps": 2, "save_steps": 2},
        extra={"checks": {"disable": ["batch-size"]}},
    )
    proc = train(cfg, "--disable", "lr-scheduler")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    gate = proc.stdout[: proc.stdout.index("checks:")]
    assert sorted(line.split()[1] for line in gate.splitlines() if line.startswith("~  ")) == [
        "batch-size",
        "lr-scheduler",
    ]
    summary = proc.stdout[proc.stdout.rindex("sftdoctor: run complete") :]
    assert "  silenced     lr-scheduler, batch-size ([checks] disable, --disable)" in summary, summary
    run_dir = tmp_path / "out"
    assert json.loads((run_dir / "resolved.json").read_text())["silenced"] == ["lr-scheduler", "batch-size"]
    records = [json.loads(line) for line in (run_dir / "findings.jsonl").read_text().splitlines()]
    preflight = [r for r in records if r["phase"] == "preflight"]
    assert {r["id"] for r in preflight if r["silenced"]} == {"lr-scheduler", "batch-size"}
    assert all(r["silenced"] is False for r in preflight if r["id"] not in ("lr-scheduler", "batch-size"))
    report = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "report", str(run_dir)], capture_output=True, text=True, timeout=300
    )
    assert report.returncode == 0, report.stderr
    assert "sftdoctor: silenced in this run: batch-size, lr-scheduler ([checks] disable, --disable)" in report.stdout
