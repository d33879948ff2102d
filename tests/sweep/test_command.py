"""`sftdoctor sweep` end to end on the tiny example, on the CPU: every trial a real `sftdoctor train` run.

Each trial trains 4 steps of 4 rows of 64 tokens with an evaluation every 2 steps (about 20-30 s here, most
of it the workers' start-up and the run's report)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState
from sweeprun import base, run_sweep, sweep_command, sweep_file, tiny_gpu_facts, trials

from sftdoctor.run import load_run_config

pytestmark = pytest.mark.slow

LEARNING_RATE = {"training.learning_rate": {"log_uniform": [1e-5, 3e-2]}}


def values(found):
    return {t.number: (t.state, t.value, dict(t.params)) for t in found}


def test_a_four_trial_sweep_finds_a_better_learning_rate_than_its_worst_trial(tmp_path, tiny_data):
    path = sweep_file(tmp_path, base(tmp_path, tiny_data["messages"]), LEARNING_RATE, trials=4, seed=1)
    proc = run_sweep(path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    found = trials(tmp_path / "sweeps" / "sweep")
    assert len(found) == 4 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in found), values(found)
    scored = {
        t.number: t.value if t.state == TrialState.COMPLETE else t.intermediate_values[max(t.intermediate_values)]
        for t in found
    }  # a pruned trial by its last evaluation
    best = min((t for t in found if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    worst = max(scored, key=scored.get)
    assert best.value < scored[worst] and best.number != worst, values(found)
    assert best.params["training.learning_rate"] != found[worst].params["training.learning_rate"]
    run = load_run_config(tmp_path / "sweeps" / "sweep" / "best.toml")  # ready for `sftdoctor train`
    assert run.training.learning_rate == best.params["training.learning_rate"]
    for name in ("history.png", "importances.png", "report/report.html"):
        assert (tmp_path / "sweeps" / "sweep" / name).is_file() or name == "importances.png", name
    assert f"best         trial {best.number}: eval_loss {best.value:.4f}" in proc.stdout
    assert "the budget is spent: 4 of 4 trials" in proc.stdout
    for t in found:  # each trial a run directory of its own, through the gate
        folder = tmp_path / "sweeps" / "sweep" / f"trial-{t.number:04d}"
        assert {"run.toml", "gate.log", "train.log", "metrics.jsonl", "findings.jsonl"} <= {
            p.name for p in folder.iterdir()
        }


def test_a_trial_that_cannot_fit_the_gpus_is_pruned_with_the_finding_before_it_launches(tmp_path, tiny_data):
    space = {"training.per_device_batch_size": {"choices": [2048, 4096]}}
    facts = tiny_gpu_facts(tmp_path)
    path = sweep_file(tmp_path, base(tmp_path, tiny_data["messages"]), space, narrow=False)
    proc = run_sweep(path, "--facts", facts)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    found = trials(tmp_path / "sweeps" / "sweep")
    assert [t.state for t in found] == [TrialState.PRUNED, TrialState.PRUNED]
    for t in found:
        assert t.user_attrs["why"]["id"] == "memory-fit/does-not-fit", t.user_attrs
        assert (
            "per GPU of 1.5 GiB" in t.user_attrs["why"]["title"]
            and "more than the GPU has" in t.user_attrs["why"]["title"]
        )
        folder = tmp_path / "sweeps" / "sweep" / f"trial-{t.number:04d}"
        assert {p.name for p in folder.iterdir()} == {"run.toml", "gate.log", "findings.jsonl"}  # nothing launched
    assert proc.stdout.count("; not launched)") == 2 and "best         none: no trial is complete" in proc.stdout
    # narrowed by the plan (the default), that space is refused before any trial
    narrowed = run_sweep(
        sweep_file(tmp_path, base(tmp_path, tiny_data["messages"]), space, name="n.toml"), "--facts", facts
    )
    assert narrowed.returncode == 1 and "nothing in the space fits 1x NVIDIA Tiny" in narrowed.stdout
    assert not (tmp_path / "sweeps" / "n").exists()


def processes_using(folder: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(folder) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_sweep_killed_during_its_third_trial_goes_on_at_the_third_trial(tmp_path, tiny_data):
    path = sweep_file(tmp_path, base(tmp_path, tiny_data["messages"]), LEARNING_RATE, trials=4, pruner="none")
    sweep_dir = tmp_path / "sweeps" / "sweep"
    proc = subprocess.Popen(
        sweep_command(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 600
        while not (sweep_dir / "trial-0002" / "train.log").exists():  # the third trial is training
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: the trial stays "running" in the study
    finally:
        proc.wait()
    before = values(trials(sweep_dir))
    assert [before[n][0] for n in sorted(before)] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]
    deadline = time.monotonic() + 60  # the trial's launcher got SIGTERM when the sweep died: its ranks stop
    while processes_using(sweep_dir / "trial-0002") and time.monotonic() < deadline:
        time.sleep(0.5)

    rerun = run_sweep(path)
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-3000:]
    after = values(trials(sweep_dir))
    assert {n: after[n] for n in (0, 1)} == {n: before[n] for n in (0, 1)}  # the first two trials stand, not rerun
    assert "sftdoctor: trial 0: training" not in rerun.stdout and "sftdoctor: trial 1: training" not in rerun.stdout
    assert "trial 2 was left running (its worker (pid" in rerun.stdout
    assert after[2][0] == TrialState.FAIL
    retry = trials(sweep_dir)[3]
    assert retry.user_attrs["retry_of"] == 2 and retry.params == before[2][2]  # the third trial, run again
    assert [after[n][0] for n in (3, 4)] == [TrialState.COMPLETE, TrialState.COMPLETE] and len(after) == 5
    assert "the budget is spent: 4 of 4 trials (4 complete, 1 interrupted)" in rerun.stdout
    assert "2      interrupted  -" in rerun.stdout and "retried as trial 3" in rerun.stdout


def test_two_workers_on_one_study_run_four_distinct_trials_between_them(tmp_path, tiny_data):
    space = {"training.learning_rate": {"choices": [1e-4, 1e-3, 3e-3, 1e-2]}}
    # no pruner: with three trials complete the median pruner may stop the fourth, whichever rate ends last
    path = sweep_file(tmp_path, base(tmp_path, tiny_data["messages"]), space, pruner="none")
    workers = [
        subprocess.Popen(sweep_command(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [w.communicate(timeout=900)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n=====\n".join(o[-3000:] for o in outputs)
    found = trials(tmp_path / "sweeps" / "sweep")
    assert [t.number for t in found] == [0, 1, 2, 3] and all(t.state == TrialState.COMPLETE for t in found)
    assert sorted(t.params["training.learning_rate"] for t in found) == [1e-4, 1e-3, 3e-3, 1e-2]
    assert len({t.user_attrs["pid"] for t in found}) == 2  # both workers ran trials
    assert sum("the budget is spent: 4 of 4 trials (4 complete)" in o for o in outputs) >= 1


def test_ctrl_c_stops_the_running_trial_and_enqueues_it_for_the_rerun(tmp_path, tiny_data):
    path = sweep_file(tmp_path, base(tmp_path, tiny_data["messages"]), LEARNING_RATE, trials=4)
    sweep_dir = tmp_path / "sweeps" / "sweep"
    proc = subprocess.Popen(sweep_command(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (sweep_dir / "trial-0000" / "train.log").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-4000:]
    assert "sftdoctor: trial 0: stopped by SIGINT; enqueued again for the rerun" in out
    assert "stopped by SIGINT; rerun the same command to go on" in out
    found = trials(sweep_dir)
    assert [t.state for t in found] == [TrialState.FAIL, TrialState.WAITING]
    assert found[0].user_attrs["interrupted"] == "the sweep was stopped by SIGINT"
    assert not processes_using(sweep_dir / "trial-0000")  # its launcher and ranks were stopped


def test_sigterm_gives_the_running_trial_its_grace_to_save_and_the_rerun_resumes_from_that_checkpoint(
    tmp_path, tiny_data
):
    """scancel or a pre-emption: the trial's ranks save a checkpoint within the grace (none was scheduled), the
    trial is enqueued again and the sweep exits 143 with nothing left running; the rerun's retry continues from
    that checkpoint, not from step 1."""
    long_run = base(tmp_path, tiny_data["messages"], max_steps=300, save_steps=400, logging_steps=1, eval_steps=150)
    path = sweep_file(tmp_path, long_run, LEARNING_RATE, trials=1)
    sweep_dir = tmp_path / "sweeps" / "sweep"
    metrics = sweep_dir / "trial-0000" / "metrics.jsonl"
    proc = subprocess.Popen(sweep_command(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (metrics.exists() and '"loss"' in metrics.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 143, out[-4000:]
    assert "Traceback" not in out
    assert "sftdoctor: trial 0: stopped by SIGTERM; enqueued again for the rerun" in out
    assert "stopped by SIGTERM; rerun the same command to go on" in out
    [saved] = [p.parent.name for p in (sweep_dir / "trial-0000").glob("checkpoint-*/sftdoctor-complete")]
    saved_step = int(saved.split("-")[1])  # saved in the grace: none was scheduled before step 400
    found = trials(sweep_dir)
    assert [t.state for t in found] == [TrialState.FAIL, TrialState.WAITING]
    assert not processes_using(sweep_dir / "trial-0000")

    rerun = run_sweep(path)
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-3000:]
    assert "(resumed from the checkpoint of trial 0)" in rerun.stdout
    retry = trials(sweep_dir)[1]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["resumed_from"] == "trial-0000"
    log = (sweep_dir / "trial-0001" / "train.log").read_text()
    assert f"resuming from {sweep_dir / 'trial-0001' / saved}" in log
    steps = [
        json.loads(line)["step"]
        for line in (sweep_dir / "trial-0001" / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    assert steps == list(range(1, 301)), steps  # steps 1..saved_step once: continued, not started again
    assert saved_step < 300


def test_an_lm_eval_metric_is_maximised_from_each_runs_eval_json(tmp_path, tiny_data):
    data = tiny_data["messages"]
    evaluation = {"eval": {"tasks": ["tiny_count_choice"], "include": str(data / "tasks"), "limit": 20, "base": False}}
    space = {"training.learning_rate": {"choices": [1e-4, 3e-3]}}
    path = sweep_file(tmp_path, base(tmp_path, data, extra=evaluation), space, objective="eval:tiny_count_choice/acc")
    proc = run_sweep(path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "objective eval:tiny_count_choice/acc (maximize)" in proc.stdout and ", none pruner," in proc.stdout
    found = trials(tmp_path / "sweeps" / "sweep")
    assert [t.state for t in found] == [TrialState.COMPLETE] * 2
    for t in found:
        doc = json.loads((tmp_path / "sweeps" / "sweep" / f"trial-{t.number:04d}" / "eval.json").read_text())
        assert t.value == doc["metrics"]["tiny_count_choice"]["acc"]["value"] and 0 <= t.value <= 1
    best = max(found, key=lambda t: t.value)
    assert f"best         trial {best.number}: tiny_count_choice/acc {best.value:.4f}" in proc.stdout
