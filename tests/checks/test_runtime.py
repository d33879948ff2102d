"""Runtime checks: the findings the watchers publish, from the facts the trainer streams."""

import math

import pytest
from flight_dumps import FLIGHT_RECORDER

from sftdoctor.checks import load_checks, run_check
from sftdoctor.train.watch import TRAINING_PHASE, RuntimeFacts


@pytest.fixture(scope="module")
def runtime():
    specs = {s.id: s for s in load_checks(plugins=False).phase("runtime")}
    assert set(specs) == {"nan-loss", "loss-spike", "fp16-loss-scale", "nccl-timeout", "straggler"}
    return lambda check_id, **facts: run_check(specs[check_id], RuntimeFacts(facts))


def test_nan_loss_says_step_values_lr_precision_and_checkpoint(runtime):
    assert runtime("nan-loss", step_stats={"step": 3, "finite": True}) == []
    [finding] = runtime(
        "nan-loss",
        step_stats={
            "step": 812,
            "finite": False,
            "grad_norm": math.nan,
            "loss_finite": False,
            "ranks": "all",
            "last_finite": {"loss": 1.92, "grad_norm": 0.81},
            "lr": 1.9e-5,
            "precision": "bf16",
            "checkpoint": "runs/x/checkpoint-800",
            "action": "stopped",
            "attribution": "first: model.layers.3.mlp",
        },
    )
    assert finding.severity.value == "error" and finding.title == "non-finite loss at step 812: stopped"
    for said in ("step 812", "loss 1.92", "grad_norm 0.81", "1.9e-05", "bf16", "checkpoint-800", "model.layers.3.mlp"):
        assert said in finding.detail
    assert "--resume" in finding.fix


def test_loss_spike_uses_a_robust_baseline(runtime):
    calm = [2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 2.02, 1.98, 2.01]
    assert runtime("loss-spike", log_stats={"step": 90, "loss": 2.3, "history": calm}) == []
    [spike] = runtime("loss-spike", log_stats={"step": 100, "loss": 4.0, "history": calm})
    assert spike.severity.value == "warning" and "loss spike at step 100" in spike.title
    # One wild value in the window does not make the next normal value a spike (median/MAD, not mean/std).
    assert runtime("loss-spike", log_stats={"step": 110, "loss": 2.1, "history": calm + [40.0]}) == []


def test_divergence_is_caught_from_the_second_logged_loss(runtime):
    [finding] = runtime("loss-spike", log_stats={"step": 2, "loss": 42.4, "history": [5.77]})
    assert "diverging" in finding.title and "7.3x" in finding.title


def test_fp16_loss_scale_stuck_or_skipping_but_not_during_warm_up(runtime):
    assert runtime("fp16-loss-scale", scale_stats={"step": 10, "scale": 1.0, "skipped": 9, "window": 10}) == []
    [stuck] = runtime("fp16-loss-scale", scale_stats={"step": 400, "scale": 1.0, "skipped": 40, "window": 100})
    assert stuck.severity.value == "error" and "minimum" in stuck.title
    [skips] = runtime("fp16-loss-scale", scale_stats={"step": 400, "scale": 512.0, "skipped": 70, "window": 100})
    assert skips.severity.value == "warning"
    assert runtime("fp16-loss-scale", scale_stats={"step": 400, "scale": 65536.0, "skipped": 2, "window": 100}) == []


def report(step, phase=TRAINING_PHASE, where="graph.py:829 _engine_run_backward"):
    return {"step": step, "phase": phase, "stalled_s": 300.0, "where": where}


def rank_1_behind(timeout_s, stacks, ranks, **more):
    """The watchdog's hang fact: no progress for `timeout_s`, rank 1 behind; `ranks` their reports."""
    return {"timeout_s": timeout_s, "behind": [1], "stacks": stacks, **more, "ranks": ranks}


def test_hang_finding_names_the_rank_and_where_each_rank_is(runtime):
    [finding] = runtime(
        "nccl-timeout", hang=rank_1_behind(300, "runs/x/stacks", {"0": report(7), "1": report(6, where="io.py:5 read")})
    )
    assert finding.title == "hang: no progress for 300 s; behind: rank 1"
    assert "rank 1: step 6" in finding.detail and "io.py:5 read" in finding.detail and "runs/x/stacks" in finding.detail


def test_hang_finding_says_which_collective_from_the_flight_recorder(runtime):
    from sftdoctor.facts.flight_recorder import read

    fr = read(FLIGHT_RECORDER / "gloo-hang-drill", 2, {"0": [0, 1], "1": [0, 1]})
    [finding] = runtime(
        "nccl-timeout", hang=rank_1_behind(8, "s", {"0": report(3), "1": report(3, "drill")}, flight_recorder=fr)
    )
    assert (
        finding.title
        == "hang: no progress for 8 s; behind: rank 1; rank 1 never entered broadcast #31 on default_pg [[16]] Float"
    )
    assert "rank 0 is in broadcast #31" in finding.detail and "rank-dependent branch" in finding.fix


def test_a_zero_or_tiny_history_is_not_a_crash(runtime):
    assert runtime("loss-spike", log_stats={"step": 4, "loss": 2.0, "history": [0.0]}) == []
    assert runtime("loss-spike", log_stats={"step": 4, "loss": 2.0, "history": []}) == []
