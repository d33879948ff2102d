"""What a sweep leaves: the table, best.toml, the pictures, the best runs' report."""

import json

import optuna
import pytest
from optuna.trial import TrialState
from sweeprun import light_sweep

from sftdoctor.run import load_run_config
from sftdoctor.sweep import results
from sftdoctor.sweep import study as studies
from sftdoctor.sweep.trial import trial_dir

SPACE = "training.learning_rate = {log_uniform = [1e-6, 1e-4]}\ntraining.warmup_ratio = {choices = [0.0, 0.1]}"


@pytest.fixture
def sweep(tmp_path):
    studies.quiet_optuna()
    made = light_sweep(tmp_path, SPACE, "trials = 6")
    made.output_dir.mkdir(parents=True)
    return made


def add(study, sweep, state, lr, warmup, value=None, steps=None, **attrs):
    dist = studies.distributions(sweep.space)
    study.add_trial(
        optuna.trial.create_trial(
            state=state,
            value=value,
            params={"training.learning_rate": lr, "training.warmup_ratio": warmup},
            distributions=dist,
            intermediate_values=steps or {},
            user_attrs=attrs,
        )
    )


def finished_study(sweep):
    study = optuna.create_study(direction="minimize")
    add(study, sweep, TrialState.COMPLETE, 1e-5, 0.0, 1.25, {5: 2.0, 10: 1.25})
    add(
        study,
        sweep,
        TrialState.PRUNED,
        1e-6,
        0.1,
        2.5,
        {5: 2.6, 10: 2.5},
        why={"id": "pruner", "title": "the median pruner stopped it at step 10"},
    )
    add(study, sweep, TrialState.PRUNED, 9e-5, 0.0, why={"id": "memory-fit", "title": "predicted peak 90 GiB of 80"})
    add(study, sweep, TrialState.FAIL, 3e-5, 0.1)  # interrupted: trial 4 retried it
    add(study, sweep, TrialState.COMPLETE, 3e-5, 0.1, 1.125, {5: 1.9, 10: 1.125}, retry_of=3)
    add(study, sweep, TrialState.FAIL, 5e-5, 0.0, why={"id": "run", "title": "the run failed (exit 1): CUDA error"})
    return study


def test_the_table_has_every_trial_its_state_value_and_why(sweep):
    lines = results.table(finished_study(sweep), sweep).splitlines()
    assert lines[0].split() == [
        "trial",
        "state",
        "eval_loss",
        "training.learning_rate",
        "training.warmup_ratio",
        "why",
        "pruned",
        "or",
        "failed",
    ]
    assert lines[1].split() == ["0", "complete", "1.2500", "1e-05", "0"]
    assert lines[2].split()[:5] == ["1", "pruned", "(2.5000)", "1e-06", "0.1"]
    assert lines[2].endswith("the median pruner stopped it at step 10")
    assert lines[3].split()[:3] == ["2", "pruned", "-"] and lines[3].endswith("memory-fit: predicted peak 90 GiB of 80")
    assert lines[4].split()[:2] == ["3", "interrupted"] and lines[4].endswith("retried as trial 4")
    assert lines[6].split()[:2] == ["5", "failed"] and lines[6].endswith("the run failed (exit 1): CUDA error")
    assert results.counts(finished_study(sweep)) == "2 complete, 2 pruned, 1 failed, 1 interrupted"


def test_best_toml_is_the_best_trials_run_config_with_a_run_directory_of_its_own(sweep):
    written = results.write(finished_study(sweep), sweep, plugins=False)
    assert written.best.number == 4
    run = load_run_config(written.best_toml)
    assert (run.training.learning_rate, run.training.warmup_ratio) == (3e-5, 0.1)
    assert run.training.output_dir == str(sweep.output_dir / "runs" / "best")
    assert written.best_toml.read_text().startswith(
        f"# The best trial of the sweep {sweep.path} (study 'sweep'): trial 4, eval_loss 1.125\n"
    )


def test_the_pictures_are_drawn_and_importances_skipped_with_a_reason_when_they_cannot_be(sweep):
    written = results.write(finished_study(sweep), sweep, plugins=False)
    assert [p.name for p in written.pictures] == ["history.png", "importances.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written.pictures)
    one = optuna.create_study()
    add(one, sweep, TrialState.COMPLETE, 1e-5, 0.0, 1.0)
    again = results.write(one, sweep, plugins=False)
    assert [p.name for p in again.pictures] == ["history.png"]
    assert again.skipped == ["importances.png: 1 complete trial: importances need 2 or more"]
    assert not (sweep.output_dir / "importances.png").exists()  # not an earlier, stale one


def test_the_best_runs_are_overlaid_in_one_report(sweep):
    study = finished_study(sweep)
    for number, loss in ((0, 1.25), (4, 1.125)):
        folder = trial_dir(sweep, number)
        folder.mkdir()
        (folder / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "loss": loss + 1 / s, "learning_rate": 1e-5}) + "\n" for s in range(1, 11))
        )
    written = results.write(study, sweep, plugins=False)
    assert written.report == sweep.output_dir / "report" / "report.html"
    page = written.report.read_text()
    assert "trial-0000" in page and "trial-0004" in page


def test_no_complete_trial_means_no_best(sweep):
    study = optuna.create_study()
    add(study, sweep, TrialState.PRUNED, 1e-5, 0.0, why={"id": "memory-fit", "title": "does not fit"})
    written = results.write(study, sweep, plugins=False)
    assert written.best is None and not (sweep.output_dir / "best.toml").exists() and written.report is None
