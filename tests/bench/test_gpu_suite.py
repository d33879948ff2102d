"""bench/gpu/run.py, the suite a lent GPU machine runs, rehearsed on the CPU so that it keeps working between
GPU days: every step runs (or says why not), its figures land in one JSON, and the table names every step."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu" / "run.py"
STEPS = [
    "machine",
    "packing_probe",
    "throughput",
    "watch_overhead",
    "memory_plan",
    "sharding",
    "allreduce",
    "flight_recorder",
]


def test_help_needs_no_torch():
    """--help (and the whole suite's own process) imports neither torch nor transformers."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{str(SUITE)!r}, '--help']\n"
        "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'trl')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--cpu-rehearsal" in done.stdout
    assert "HEAVY []" in done.stdout


@pytest.mark.slow
def test_cpu_rehearsal_runs_every_step(tmp_path):
    out = tmp_path / "results.json"
    fixture = tmp_path / "fixture"
    done = subprocess.run(
        [
            sys.executable,
            str(SUITE),
            "--cpu-rehearsal",
            "--out",
            str(out),
            "--fixture-dir",
            str(fixture),
            "--budget-s",
            "480",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["mode"] == "cpu-rehearsal"
    assert list(results["steps"]) == STEPS
    for name, step in results["steps"].items():
        assert step["status"] in ("ok", "skipped"), f"{name}: {step.get('error')}\n{step.get('output_tail')}"
        if step["status"] == "ok":
            assert step["figures"], name
        else:
            assert step["skipped"], name
    # what the rehearsal cannot do is said, with the reason
    missing = "\n".join(results["could_not_run"])
    assert "throughput / sftdoctor MFU: CPU rehearsal: no GPU" in missing
    assert "max_memory_allocated needs a GPU" in missing
    # the recorded fixture of the machine: facts and check, replayable by `sftdoctor check --facts`
    assert "gpus" in json.loads((fixture / "facts.json").read_text())["facts"]
    assert "findings" in json.loads((fixture / "check.json").read_text())
    assert {e["file"] for e in json.loads((fixture / "index.json").read_text())} == {"facts.json", "check.json"}
    # the table names each step
    table = done.stdout
    for name in STEPS:
        assert any(line.startswith(name + " ") for line in table.splitlines()), name
    assert "could not run" in table
    figures = results["steps"]["throughput"]["figures"]
    assert figures["sftdoctor tokens/s"] > 0 and figures["TRL tokens/s"] > 0
    assert results["steps"]["allreduce"]["figures"]["ranks, backend"] == "2, gloo"
    assert results["steps"]["flight_recorder"]["figures"]["entries"] > 0
    # FSDP2 trained on 2 gloo ranks; the ZeRO runs and the GPU memory are said to be left out, with the reason
    sharding = results["steps"]["sharding"]["figures"]
    assert sharding["ranks"] == "2 (gloo, CPU)"
    assert sharding["FSDP2 tokens/s"] > 0
    assert sharding["FSDP2 peak host RSS, max over ranks (GiB)"] > 0
    assert "sharding / ZeRO-3: CPU rehearsal" in missing
    assert "sharding / FSDP2: measured GPU memory" in missing
