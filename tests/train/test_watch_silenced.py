"""The runtime watchers silence as the gate does: a finding of an id the plan silences (--disable, [checks]
disable) is printed marked silenced, recorded `"silenced": true` in findings.jsonl, and never acts: a silenced
nan-loss or hang does not stop the run. Without training: the Reporter, and the watchers' paths, called directly."""

import json
import types

import pytest

from sftdoctor.errors import RunStopped
from sftdoctor.train import watch

SPIKE = {"step": 9, "loss": 50.0, "history": [1.0] * 10, "factor": 6.0, "grad_norm": 1.0, "lr": 1e-5}
SCALE = {"step": 60, "scale": 1.0, "skipped": 9, "window": 10, "min_scale": 1.0}  # stuck-at-minimum, an error


@pytest.fixture
def rank0(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "findings.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("ids", [("loss-spike",), ("loss-spike/diverging",)])
def test_a_silenced_runtime_finding_is_published_marked_silenced(tmp_path, capsys, rank0, ids):
    reporter = watch.Reporter(tmp_path, plugins=False, silenced=ids)
    [finding] = reporter.check(log_stats=SPIKE)
    reporter.publish([finding], 9)
    assert capsys.readouterr().out.startswith("~  loss-spike/diverging  silenced warning: loss diverging at step 9")
    [record] = records(tmp_path)
    assert (record["id"], record["silenced"], record["phase"]) == ("loss-spike/diverging", True, "runtime")


def test_only_the_silenced_message_of_a_check_is_silenced(tmp_path, rank0):
    reporter = watch.Reporter(tmp_path, plugins=False, silenced=("fp16-loss-scale/skipping",))
    [stuck] = reporter.check(scale_stats=SCALE)
    assert (stuck.id, stuck.silenced) == ("fp16-loss-scale/stuck-at-minimum", False)
    assert reporter.acts(stuck.id) and not reporter.acts("fp16-loss-scale/skipping")


def guard(tmp_path, silenced):
    """A Guard on no trainer: only what its non-finite path reads (the plan, a learning rate, the reporter)."""
    g = watch.Guard.__new__(watch.Guard)
    g.plan = types.SimpleNamespace(
        on_nan="stop", max_skips=3, deepspeed=None, fsdp=None, precision="bf16", silenced=silenced
    )
    g.trainer = types.SimpleNamespace(lr_scheduler=types.SimpleNamespace(get_last_lr=lambda: [1e-5]))
    g.run_dir, g.reporter = tmp_path, watch.Reporter(tmp_path, plugins=False, silenced=silenced)
    g.last_finite, g.skips, g.skip_next = {"loss": 2.0, "grad_norm": 1.0}, 0, False
    return g


def test_a_silenced_nan_loss_drops_the_update_and_never_stops_the_run(tmp_path, capsys, rank0):
    g = guard(tmp_path, ("nan-loss",))
    for step in (4, 5, 6, 7):  # past max_skips too: the user accepted every non-finite step
        g._non_finite(types.SimpleNamespace(global_step=step), float("nan"), [0])
    assert g.skip_next and not (tmp_path / "stopped.json").exists()
    said = records(tmp_path)
    assert [(r["id"], r["silenced"], r["step"]) for r in said] == [("nan-loss", True, s) for s in (5, 6, 7, 8)]
    assert said[0]["title"] == "non-finite loss at step 5: update skipped; nan-loss silenced: the run goes on"
    assert "~  nan-loss  silenced error: non-finite loss at step 5" in capsys.readouterr().out


def test_an_unsilenced_nan_loss_still_stops_the_run(tmp_path, rank0):
    g = guard(tmp_path, ("loss-spike",))
    g.watchdog = types.SimpleNamespace(beat=lambda *a, **k: None, stop=lambda: None)
    with pytest.raises(RunStopped):
        g._non_finite(types.SimpleNamespace(global_step=4), float("nan"), [0])
    [record] = records(tmp_path)
    assert record["silenced"] is False and record["title"].startswith("non-finite loss at step 5: stopped")


class Exited(Exception):
    pass


@pytest.mark.parametrize("ids, exits", [(("nccl-timeout",), False), ((), True)])
def test_a_silenced_hang_is_reported_once_and_the_watchdog_does_not_end_the_run(
    tmp_path, monkeypatch, rank0, ids, exits
):
    def exit_(code):
        raise Exited(code)

    monkeypatch.setattr(watch.os, "_exit", exit_)  # the watchdog's own exit would end pytest
    monkeypatch.setattr(watch.time, "sleep", lambda s: None)
    dog = watch.HangWatchdog(5.0, watch.Reporter(tmp_path, plugins=False, silenced=ids), tmp_path)
    if exits:
        with pytest.raises(Exited):
            dog.fire(6.0)
    else:
        dog.fire(6.0)
        assert dog.done.is_set()  # reported once: the watchdog looks no more
    [record] = records(tmp_path)
    assert (record["id"], record["silenced"]) == ("nccl-timeout", not exits)
    assert (tmp_path / "stopped.json").exists() == exits


@pytest.mark.slow
def test_a_nan_drill_with_nan_loss_disabled_runs_to_the_end_and_says_it_silenced(tmp_path, tiny_data):
    from trainrun import config, metrics, train

    cfg = config(tmp_path, tiny_data["text"], training={"max_steps": 6, "save_steps": 3})  # on_nan = "stop"
    proc = train(cfg, "--drill", "nan-loss@3", "--disable", "nan-loss")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "drill-nan-loss"
    [finding] = [r for r in records(run_dir) if r["phase"] == "runtime"]
    assert (finding["id"], finding["step"], finding["silenced"]) == ("nan-loss", 3, True)
    assert "~  nan-loss  silenced error: non-finite loss at step 3: update skipped; nan-loss silenced" in proc.stdout
    steps = metrics(run_dir)
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6] and all(m["loss"] == m["loss"] for m in steps[3:])
    assert (run_dir / "final").is_dir() and not (run_dir / "stopped.json").exists()
