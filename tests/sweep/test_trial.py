"""One trial: the eval losses followed as the run writes them, the pruner's stop, what the run's end says."""

import json
import math
import signal
import sys
import threading
import time

import optuna
import pytest
from optuna.trial import TrialState
from sweeprun import light_sweep

from sftdoctor.sweep import study as studies
from sftdoctor.sweep.trial import Follower, Stop, launched, verdict

RANGE = "training.learning_rate = {log_uniform = [1e-6, 1e-4]}"


@pytest.fixture(autouse=True)
def _quiet():
    studies.quiet_optuna()


def records(path, *rows):
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def test_the_follower_gives_each_evaluation_once_as_it_is_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follow = Follower(path)
    assert follow.evals() == []  # not written yet
    records(path, {"step": 1, "loss": 3.0}, {"step": 2, "eval_loss": 2.5})
    with open(path, "a") as f:
        f.write('{"step": 4, "eval_lo')  # a line still being written
    assert follow.evals() == [(2, 2.5)]
    with open(path, "a") as f:
        f.write('ss": 2.0}\n{"step": 4, "train_loss": 1.0}\nnot json\n')
    assert follow.evals() == [(4, 2.0)] and follow.last == (4, 2.0)
    # a resumed launch rewrites the file without the records after its checkpoint, then logs them again
    tmp = tmp_path / "new"
    records(tmp, {"step": 2, "eval_loss": 2.5}, {"step": 4, "eval_loss": 1.9}, {"step": 6, "eval_loss": 1.7})
    tmp.replace(path)
    assert follow.evals() == [(6, 1.7)] and follow.last == (6, 1.7)


def fake_launcher(losses, every):
    """A stand-in for `sftdoctor train`: one evaluation every 0.2 s, then waits 30 s; it writes how it ended
    ("SIGINT", "SIGTERM" or "ran out") to `ended`, so a test sees that it was stopped without timing it."""
    return [
        sys.executable,
        "-c",
        f"""
import json, signal, sys, time
def ended(how, code):
    open("ended", "w").write(how)
    sys.exit(code)
signal.signal(signal.SIGTERM, lambda *a: ended("SIGTERM", 143))
try:
    for i, loss in enumerate({list(losses)!r}, 1):
        with open("metrics.jsonl", "a") as f:
            f.write(json.dumps({{"step": i * {every}, "eval_loss": loss}}) + "\\n")
        time.sleep(0.2)
    time.sleep(30)
    ended("ran out", 0)
except KeyboardInterrupt:
    ended("SIGINT", 130)
""",
    ]


@pytest.fixture
def median_study(tmp_path):
    """Three finished trials whose eval loss fell to 1.0 by step 15, under the sweep's median pruner."""
    sweep = light_sweep(tmp_path, RANGE, "trials = 8")
    study = optuna.create_study(pruner=studies.pruner(sweep))
    dist = studies.distributions(sweep.space)
    for _ in range(3):
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.COMPLETE,
                value=1.0,
                params={"training.learning_rate": 1e-5},
                distributions=dist,
                intermediate_values={5: 2.0, 10: 1.5, 15: 1.0},
            )
        )
    return sweep, study


def asked(study, sweep, tmp_path, monkeypatch):
    """The study's next trial and its run directory, the working directory of the fake launcher."""
    trial = study.ask(studies.distributions(sweep.space))
    run_dir = tmp_path / f"trial-{trial.number:04d}"
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    return trial, run_dir


def test_a_trial_that_lags_the_median_is_stopped_at_once_and_pruned(tmp_path, median_study, monkeypatch):
    sweep, study = median_study
    trial, run_dir = asked(study, sweep, tmp_path, monkeypatch)
    outcome = launched(sweep, study, trial, run_dir, fake_launcher([2.2, 2.1, 2.0, 1.9], 5), Stop())
    assert (run_dir / "ended").read_text() == "SIGINT"  # stopped, not waited for
    assert outcome.state == "pruned" and outcome.launched
    assert outcome.why == {
        "id": "pruner",
        "title": "the median pruner stopped it at step 10: its best eval_loss so far "
        "2.1000 is worse than the median 1.5000 of 3 other trials at that step",
    }
    # never before its second evaluation: step 5 was reported, not judged
    assert study.trials[-1].intermediate_values == {5: 2.2, 10: 2.1}


def test_a_trial_that_keeps_up_is_not_pruned_and_a_signal_stops_it_for_a_retry(tmp_path, median_study, monkeypatch):
    sweep, study = median_study
    trial, run_dir = asked(study, sweep, tmp_path, monkeypatch)
    stop = Stop()

    def signal_after_the_third_evaluation():  # as the sweep's SIGTERM handler would, with no timer to race
        while len(study.trials[-1].intermediate_values) < 3:
            time.sleep(0.05)
        stop(signal.SIGTERM, None)

    threading.Thread(target=signal_after_the_third_evaluation, daemon=True).start()
    outcome = launched(sweep, study, trial, run_dir, fake_launcher([1.9, 1.4, 0.9], 5), stop)
    assert outcome.state == "interrupted" and (run_dir / "ended").read_text() == "SIGTERM"
    assert study.trials[-1].intermediate_values == {5: 1.9, 10: 1.4, 15: 0.9}


def ended(tmp_path, code, sweep=None, **files):
    sweep = sweep or light_sweep(tmp_path, RANGE, "trials = 2")
    run_dir = tmp_path / "trial-0000"
    run_dir.mkdir(exist_ok=True)
    for name, text in files.items():
        (run_dir / name.replace("_", ".", 1)).write_text(text)
    follower = Follower(run_dir / "metrics.jsonl")
    return verdict(sweep, run_dir, code, follower)


def test_the_objective_is_the_last_evaluation(tmp_path):
    metrics = (
        "\n".join(
            json.dumps(r)
            for r in ({"step": 5, "eval_loss": 2.0}, {"step": 10, "loss": 1.0}, {"step": 10, "eval_loss": 1.5})
        )
        + "\n"
    )
    outcome = ended(tmp_path, 0, metrics_jsonl=metrics)
    assert (outcome.state, outcome.value, outcome.why["title"]) == ("complete", 1.5, "eval_loss at step 10")


def test_a_run_without_an_evaluation_fails_and_one_that_diverged_is_pruned(tmp_path):
    assert ended(tmp_path, 0, metrics_jsonl="").why == {"id": "objective", "title": "the run logged no eval_loss"}
    diverged = ended(tmp_path, 0, metrics_jsonl=json.dumps({"step": 5, "eval_loss": math.nan}) + "\n")
    assert diverged.state == "pruned" and diverged.why["title"] == "eval_loss at step 5 is nan: the run diverged"


def test_a_watchers_stop_and_a_failed_rehearsal_prune_the_trial_anything_else_fails_it(tmp_path):
    stopped = json.dumps({"id": "nan-loss", "title": "loss is nan at step 3", "exit_code": 3})
    outcome = ended(tmp_path, 3, stopped_json=stopped)
    assert (outcome.state, outcome.why["id"]) == ("pruned", "nan-loss")
    assert outcome.why["title"] == "the nan-loss watcher stopped the run: loss is nan at step 3"
    (tmp_path / "trial-0000" / "stopped.json").unlink()
    rehearsal = ended(tmp_path, 1, rehearsal_log="Traceback (most recent call last):\nRuntimeError: boom\n")
    assert rehearsal.state == "pruned" and rehearsal.why["id"] == "rehearsal"
    assert rehearsal.why["title"].startswith("the rehearsal failed: ")
    (tmp_path / "trial-0000" / "rehearsal.log").unlink()
    failed = ended(tmp_path, 1, launch_log="step 3/8\nsftdoctor: the run failed (exit 1, after step 3): CUDA error\n")
    assert (failed.state, failed.why["title"]) == ("failed", "the run failed (exit 1, after step 3): CUDA error")


def test_an_lm_eval_objective_is_read_from_eval_json(tmp_path):
    (tmp_path / "tasks").mkdir()
    sweep = light_sweep(
        tmp_path,
        "lora.r = {choices = [8, 16]}",
        'objective = "eval:count/acc"',
        base_extra='\n[eval]\ntasks = ["count"]\ninclude = "tasks"\n',
    )
    doc = {"metrics": {"count": {"acc": {"value": 0.75, "stderr": 0.1}, "acc_norm": {"value": 0.7, "stderr": 0.1}}}}
    outcome = ended(tmp_path, 0, sweep, eval_json=json.dumps(doc))
    assert (outcome.state, outcome.value, outcome.why["title"]) == ("complete", 0.75, "count acc")


def test_a_combination_the_run_config_refuses_is_pruned_before_the_gate(tmp_path):
    """Each value passes alone (the sweep file is read), the pair does not: several nodes need one given port."""
    from sftdoctor.sweep.trial import run_trial

    sweep = light_sweep(
        tmp_path, 'launch.nnodes = {choices = [1, 2]}\nlaunch.master_port = {choices = [29500, "auto"]}'
    )
    study = optuna.create_study()
    study.enqueue_trial({"launch.nnodes": 2, "launch.master_port": "auto"})
    trial = study.ask(studies.distributions(sweep.space))
    outcome = run_trial(sweep, study, trial, plugins=False, facts_file=None, stop=Stop(), say=lambda line: None)
    assert outcome.state == "pruned" and outcome.why["id"] == "run-config"
    assert outcome.why["title"].startswith('[launch].master_port: master_port = "auto" works on one node only')
    assert not (tmp_path / "sweeps" / "sweep" / "trial-0000" / "gate.log").exists()


def test_hyperband_stops_a_trial_far_behind_its_bracket_at_a_rung(tmp_path, monkeypatch):
    """Optuna's HyperbandPruner as the sweep builds it: rungs from one evaluation (5 steps) to max_steps (20)."""
    sweep = light_sweep(tmp_path, RANGE, 'trials = 16\npruner = "hyperband"')
    study = optuna.create_study(study_name="hb", pruner=studies.pruner(sweep))
    dist = studies.distributions(sweep.space)
    for _ in range(9):  # earlier trials, reported and judged as the follower does: each rung remembers them
        done = study.ask(dist)
        for step, loss in ((5, 2.0), (10, 1.5), (15, 1.2), (20, 1.0)):
            done.report(loss, step)
            assert not done.should_prune()
        study.tell(done, 1.0)
    trial, run_dir = asked(study, sweep, tmp_path, monkeypatch)
    outcome = launched(sweep, study, trial, run_dir, fake_launcher([9.0, 8.0, 7.0, 6.0], 5), Stop())
    assert outcome.state == "pruned" and outcome.launched, outcome
    assert outcome.why["title"].startswith("the hyperband pruner stopped it at step ")
    assert "is not among the best of its bracket" in outcome.why["title"]
