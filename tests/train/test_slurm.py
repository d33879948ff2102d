"""`sftdoctor train --sbatch` and runs under Slurm: the batch script, and a real Slurm (tests/slurm.py) running
it, stopping it with SIGTERM and requeueing it."""

import json
import subprocess
import sys
import time

import pytest
from slurm import cluster, wait_for
from trainrun import EXAMPLES, complete, config, metrics

from sftdoctor.train.slurm import script

# One worker runs them all: the Slurm instances they start share this host's munged, which one may stop.
pytestmark = pytest.mark.xdist_group("slurm")


def plan_and_run(tmp_path, **sections):
    from conftest import make_run, plan_of

    run = make_run(tmp_path, **sections)
    return plan_of(run), run


def test_the_script_asks_for_one_task_per_node_and_a_signal_before_the_limit(tmp_path):
    plan, run = plan_and_run(
        tmp_path,
        launch={"nnodes": 4, "nproc_per_node": 8},
        slurm={"time": "2-00:00:00", "partition": "h100", "account": "llm", "signal_s": 600},
    )
    text = script(plan, tmp_path / "run.toml", run)
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --partition=h100",
        "#SBATCH --account=llm",
        "#SBATCH --signal=TERM@600",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
    ):
        assert line + "\n" in text, line
    assert f"srun --kill-on-bad-exit=1 {sys.executable} -m sftdoctor train {tmp_path / 'run.toml'} --resume" in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text


def test_a_login_node_without_gpus_asks_for_none_unless_told(tmp_path):
    plan, run = plan_and_run(tmp_path)
    assert "--gpus-per-node" not in script(plan, tmp_path / "run.toml", run)
    plan, run = plan_and_run(tmp_path, slurm={"gpus_per_node": 4})
    assert "#SBATCH --gpus-per-node=4\n" in script(plan, tmp_path / "run.toml", run)


def test_submit_without_sbatch_is_bad_input(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "train", str(EXAMPLES / "tiny.toml"), "--submit"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "--submit: goes with --sbatch" in proc.stderr


@pytest.fixture
def slurm(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


def submit(cfg, env):
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "train", str(cfg), "--sbatch", "--submit"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout.split("as Slurm job ")[1].split()[0]


@pytest.mark.slow
def test_sbatch_runs_the_run_and_sigterm_requeues_it_to_resume(tmp_path, tiny_data, slurm):
    """The generated script under a real Slurm: the job trains; `scancel --signal=TERM` (what the time limit's
    --signal sends) mid-run, with no checkpoint due for 1,000 steps, makes the run save the step it is at and
    stop; the job requeues itself and resumes from that checkpoint."""
    cfg = config(tmp_path, tiny_data["text"], training={"max_steps": 100, "save_steps": 1000})
    job = submit(cfg, slurm)
    run_dir = tmp_path / "out"
    assert wait_for(slurm, job, ("RUNNING",), 120) == "RUNNING"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (
        (run_dir / "metrics.jsonl").exists() and any(m["step"] >= 5 for m in metrics(run_dir))
    ):
        time.sleep(0.1)
    subprocess.run(["scancel", "--signal=TERM", job], env=slurm, check=True)
    assert wait_for(slurm, job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 600) == "COMPLETED"
    out = (run_dir / f"slurm-{job}.out").read_text()
    stop = int(out.split("every rank stops after step ")[1].split()[0])
    assert f"stops after step {stop} with a checkpoint" in out and f"requeueing job {job}" in out
    assert f"sftdoctor: resuming from {run_dir / f'checkpoint-{stop}'}" in out and "run complete" in out
    assert (run_dir / "final").is_dir() and complete(run_dir) == [f"checkpoint-{stop}", "checkpoint-100"]
    steps = [m["step"] for m in metrics(run_dir)]
    assert steps == list(range(1, 101))  # each step once: the resumed launch's records from step stop + 1
    assert json.loads((run_dir / "resolved.json").read_text())["reasons"]["node_rank"] == "one node"


def test_the_job_silences_what_the_login_nodes_gate_silenced(tmp_path):
    import dataclasses

    plan, run = plan_and_run(tmp_path)
    assert "--disable" not in script(plan, tmp_path / "run.toml", run)
    plan = dataclasses.replace(plan, silenced=("nccl-env/port-busy", "disk-full"))
    assert "--resume --disable=nccl-env/port-busy,disk-full\n" in script(plan, tmp_path / "run.toml", run)
