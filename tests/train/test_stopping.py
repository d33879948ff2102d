"""SIGTERM: every rank stops at one step, with a checkpoint when it fits the grace (sftdoctor.train.stopping)."""

import os
import signal
from types import SimpleNamespace

import pytest
import torch
from trainrun import complete, config, metrics, runtime_findings, stopped_by_sigterm, train
from transformers import TrainerControl, TrainerState

from sftdoctor.train.stopping import ASSUMED_WRITE_BPS, SaveOnSignal, checkpoint_bytes, save_fits


def test_a_save_fits_only_with_the_margin_to_spare():
    assert save_fits(left_s=100, steps=2, step_s=10, save_s=50)  # 70 x 1.25 = 87.5
    assert not save_fits(left_s=80, steps=2, step_s=10, save_s=50)
    assert save_fits(left_s=1, steps=0, step_s=5, save_s=0.5)  # alone, the rank stops at the step it is at


def test_the_busiest_rank_writes_the_trained_weights_and_its_share_of_the_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(100, 100, bias=False), torch.nn.Linear(100, 10, bias=False))
    assert checkpoint_bytes(model, 0, 8) == 11_000 * 4 + 11_000 * 8  # fp32 weights, AdamW's two moments, all of it
    assert checkpoint_bytes(model, 2, 8) == 11_000 * 4 + 11_000 * 12 / 8  # ZeRO: a shard each, fp32 master too
    model[0].weight.requires_grad_(False)  # a frozen base: only what trains is saved (LoRA's adapter)
    assert checkpoint_bytes(model, 0, 1) == 1_000 * 12


@pytest.fixture
def stopper():
    """A SaveOnSignal of one rank over a tiny model, its SIGTERM handler removed after."""
    before = signal.getsignal(signal.SIGTERM)
    model = torch.nn.Linear(1000, 1000)
    plan = SimpleNamespace(stop_grace_s=30, zero_stage=0, deepspeed=None)
    made = SaveOnSignal(SimpleNamespace(model=model), plan)
    yield made
    signal.signal(signal.SIGTERM, before)


def step(stopper, n, took=0.0):
    state, control = TrainerState(), TrainerControl()
    state.global_step = n
    stopper.on_step_begin(None, state, control)
    stopper.step_began -= took
    stopper.on_step_end(None, state, control)
    return control


def test_one_rank_saves_at_the_step_it_is_at_when_the_save_fits(stopper, capsys):
    assert not step(stopper, 1).should_training_stop  # no signal: nothing changes
    os.kill(os.getpid(), signal.SIGTERM)
    control = step(stopper, 2)
    assert control.should_training_stop and control.should_save and stopper.stopped
    assert "every rank stops after step 2 with a checkpoint" in capsys.readouterr().out


def test_without_the_time_to_save_the_rank_stops_with_the_checkpoint_it_has(stopper, capsys):
    stopper.grace_s = 0.5 * 1000 * 1001 * 12 / ASSUMED_WRITE_BPS  # half of what saving this model takes
    os.kill(os.getpid(), signal.SIGTERM)
    control = step(stopper, 7)
    assert control.should_training_stop and not control.should_save
    out = capsys.readouterr().out
    assert "stops after step 7 without a checkpoint" in out and "the newest complete checkpoint is kept" in out


def test_a_measured_save_replaces_the_estimate(stopper):
    stopper.save_s = 100.0  # this run's own saves took that long: more than the 30 s of grace
    os.kill(os.getpid(), signal.SIGTERM)
    assert not step(stopper, 3).should_save


@pytest.mark.slow
def test_sigterm_makes_both_ranks_save_the_step_they_agree_on_and_the_resume_finishes(tmp_path, tiny_data):
    """Two gloo ranks, no checkpoint due for 1,000 steps: SIGTERM to the launcher (as `scancel`, a time limit's
    --signal or `docker stop` sends it) ends the run within its grace with a complete checkpoint of the step
    the ranks agreed on; --resume goes on from exactly there."""
    cfg = config(
        tmp_path,
        tiny_data["text"],
        launch={"nproc_per_node": 2, "stop_grace_s": 60},
        training={"packing": False, "max_steps": 40, "save_steps": 1000, "logging_steps": 1},
    )
    run_dir = tmp_path / "out"
    code, out, stop = stopped_by_sigterm(cfg, run_dir)
    assert code == 143, out[-3000:]
    assert 3 < stop < 40 and complete(run_dir) == [f"checkpoint-{stop}"]
    assert f"SIGTERM: checkpoint-{stop} saved in" in out
    assert f"checkpoint-{stop}; resume with: sftdoctor train {cfg} --resume" in out
    assert not (run_dir / "final").exists()

    resumed = train(cfg, "--resume", "--no-rehearse")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"sftdoctor: resuming from {run_dir / f'checkpoint-{stop}'}" in resumed.stdout
    steps = [m["step"] for m in metrics(run_dir)]
    assert steps == list(range(1, 41)) and (run_dir / "final").is_dir()
    # a healthy pair of ranks, rank 0 saving and logging: no straggler, judged on every rank's own times
    timed = [m for m in metrics(run_dir) if "rank_forward_s" in m]
    assert len(timed) >= 30 and all(None not in m["rank_forward_s"] for m in timed)
    assert len([m for m in timed if None not in m["rank_data_s"]]) >= 30  # an epoch's first fetch is not timed
    assert not [f for f in runtime_findings(run_dir) if f["id"].startswith("straggler")]
