"""The study on disk: one per sweep directory, its identity kept, the budget shared by every worker, the
trials of a worker that is gone failed and asked again."""

import os
import socket
import subprocess
import time

import optuna
import pytest
from optuna.trial import TrialState
from sweeprun import light_sweep

from sftdoctor.errors import InputError
from sftdoctor.sweep import study as studies

RANGE = "training.learning_rate = {log_uniform = [1e-6, 1e-4]}"
GRID = "training.learning_rate = {choices = [1e-6, 1e-5, 1e-4, 1e-3]}"


@pytest.fixture(autouse=True)
def _quiet():
    studies.quiet_optuna()


def worker(sweep):
    """What one `sftdoctor sweep` process holds: the study, the space it samples, its index."""
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    study, space, index = studies.open_study(sweep, sweep.space, {"note": "not narrowed"})
    return studies.load(sweep, space, index), space, index


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_budget_counts_finished_and_running_trials_but_not_a_failed_one_that_was_retried():
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    made = [
        optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, params={"x": 0.5}, distributions=dist),
        optuna.trial.create_trial(state=TrialState.PRUNED, params={"x": 0.5}, distributions=dist),
        optuna.trial.create_trial(state=TrialState.FAIL, params={"x": 0.5}, distributions=dist),  # retried
        optuna.trial.create_trial(state=TrialState.FAIL, params={"x": 0.5}, distributions=dist),  # failed for good
        optuna.trial.create_trial(
            state=TrialState.RUNNING, params={"x": 0.5}, distributions=dist, user_attrs={"retry_of": 2}
        ),
        optuna.trial.create_trial(state=TrialState.WAITING, params={"x": 0.5}, distributions=dist),
    ]
    study = optuna.create_study()
    study.add_trials(made)
    assert studies.counted(study.get_trials()) == 4


def test_a_worker_is_gone_when_its_process_is_on_this_host_no_more_or_silent_elsewhere():
    here, now = studies.me(), time.time()
    assert studies.gone({**here, "heartbeat": now}, now, here) is None
    parent = os.getppid()
    assert (
        studies.gone({"host": here["host"], "pid": parent, "pid_start": studies.process_start(parent)}, now, here)
        is None
    )
    dead = dead_pid()
    assert "is gone" in studies.gone({"host": here["host"], "pid": dead, "pid_start": 1}, now, here)
    reused = {"host": here["host"], "pid": parent, "pid_start": studies.process_start(parent) + 1}  # a reused pid
    assert "is gone" in studies.gone(reused, now, here)
    assert studies.gone({"host": "node-7", "pid": 1, "heartbeat": now - 30}, now, here) is None
    assert "no heartbeat for 11 minutes" in studies.gone(
        {"host": "node-7", "pid": 1, "heartbeat": now - 660}, now, here
    )
    assert "stopped before it started it" in studies.gone({}, now, here)


def test_a_trial_left_running_by_a_killed_worker_is_failed_and_its_values_run_again(tmp_path):
    sweep = light_sweep(tmp_path, RANGE, "trials = 3")
    study, space, _ = worker(sweep)
    first = studies.next_trial(study, sweep, space)
    study.tell(first, 1.0)
    second = studies.next_trial(study, sweep, space)
    killed = dead_pid()
    second.set_user_attr("pid", killed)  # its worker was killed
    said = []
    study, space, _ = worker(sweep)  # the rerun
    retry = studies.next_trial(study, sweep, space, said.append)
    assert said == [
        f"sftdoctor: trial 1 was left running (its worker (pid {killed} on {socket.gethostname()}) is "
        "gone): failed, and its parameters enqueued again"
    ]
    assert (retry.number, retry.params, retry.user_attrs["retry_of"]) == (2, second.params, 1)
    assert study.trials[1].state == TrialState.FAIL
    study.tell(retry, 0.5)
    assert studies.counted(study.get_trials()) == 2  # the failed trial 1 does not count: trial 2 took its place
    last = studies.next_trial(study, sweep, space)
    study.tell(last, 0.7)
    assert last.number == 3 and studies.next_trial(study, sweep, space) is None


def test_two_workers_share_one_budget_and_never_run_one_grid_point_twice(tmp_path):
    sweep = light_sweep(tmp_path, GRID)
    (a, space, i), (b, _, j) = worker(sweep), worker(sweep)
    assert (i, j) == (0, 1)
    asked = [
        studies.next_trial(a, sweep, space),
        studies.next_trial(b, sweep, space),
        studies.next_trial(b, sweep, space),
        studies.next_trial(a, sweep, space),
    ]
    assert studies.next_trial(a, sweep, space) is None and studies.next_trial(b, sweep, space) is None  # 4 running
    assert [t.number for t in asked] == [0, 1, 2, 3]
    assert sorted(t.params["training.learning_rate"] for t in asked) == [1e-6, 1e-5, 1e-4, 1e-3]


def test_tpe_workers_are_seeded_apart(tmp_path):
    sweep = light_sweep(tmp_path, RANGE, "trials = 4")
    (a, space, _), (b, _, _) = worker(sweep), worker(sweep)
    x, y = studies.next_trial(a, sweep, space), studies.next_trial(b, sweep, space)
    assert x.params != y.params


def test_a_rerun_may_raise_the_budget_but_not_change_the_space(tmp_path):
    sweep = light_sweep(tmp_path, RANGE, "trials = 2")
    worker(sweep)
    worker(light_sweep(tmp_path, RANGE, "trials = 8"))  # more trials: the same study goes on
    other = light_sweep(tmp_path, "training.learning_rate = {log_uniform = [1e-5, 1e-4]}", "trials = 2")
    with pytest.raises(
        InputError,
        match=r"was made with another base, space or objective \(.*sweep.toml; the \[space\] "
        r"differs\): its trials would not compare",
    ):
        worker(other)


def test_one_sweep_directory_holds_one_study(tmp_path):
    worker(light_sweep(tmp_path, RANGE, "trials = 2"))
    with pytest.raises(InputError, match=r"study.journal holds the study 'sweep': one sweep directory holds one study"):
        worker(light_sweep(tmp_path, RANGE, 'trials = 2\nstudy = "other"'))


def test_the_space_is_the_one_the_study_was_created_with(tmp_path):
    sweep = light_sweep(tmp_path, GRID)
    sweep.output_dir.mkdir(parents=True)
    narrowed = (sweep.space[0].with_choices((1e-6, 1e-5)),)
    _, space, _ = studies.open_study(sweep, narrowed, {"note": "narrowed here"})
    _, again, _ = studies.open_study(sweep, sweep.space, {"note": "nothing dropped on that machine"})
    assert space == again == narrowed


@pytest.mark.parametrize(
    "journal, says",
    [
        (b"\x91\xfe binary\n", "line 1: not an Optuna journal (UnicodeDecodeError"),
        (
            b'{"op_code": 0, "worker_id": "w", "study_name": "sweep", "directions": [1]}\nnot json\n',
            "line 2: not an Optuna journal (JSONDecodeError",
        ),
        (b"[1, 2]\n", "line 1: not an Optuna journal (a record with no op_code)"),
        (b'{"op_code": 0, "worker_id": "w"}\n', "line 1: study_name: missing; expected a string (op_code 0)"),
        (
            b'{"op_code": 99, "worker_id": "x"}\n',
            "line 1: op_code: not an Optuna journal (op_code 99; expected 0 to 10)",
        ),
        (None, "is not a file; expected the study's Optuna journal"),
    ],
)
def test_a_garbled_journal_is_named_when_the_study_is_opened_or_shown(tmp_path, journal, says):
    sweep = light_sweep(tmp_path, RANGE, "trials = 2")
    sweep.output_dir.mkdir(parents=True)
    path = sweep.output_dir / studies.JOURNAL
    path.mkdir() if journal is None else path.write_bytes(journal)
    for opening in (lambda: worker(sweep), lambda: studies.existing(sweep)):  # a run, and --dry-run
        with pytest.raises(InputError) as caught:
            opening()
        assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value)
