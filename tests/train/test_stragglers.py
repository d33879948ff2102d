"""What each rank measures of itself for the straggler check: its batch fetches (a real DataLoader) and its forward
passes (a real model), the warm-up step and each epoch's first fetch left out, and the slow drills."""

import dataclasses
import math
import socket
import time
from types import SimpleNamespace

import torch
from conftest import plan_of, run_of
from trainrun import tiny_qwen2

from sftdoctor.train.stragglers import DRILL_MIN_S, RankClock, identity

CPU = SimpleNamespace(device=torch.device("cpu"))


def clock_of(drill=None, rank=0, **sections):
    plan = plan_of(run_of(launch={"nproc_per_node": 2}, **sections))
    return RankClock(dataclasses.replace(plan, drill=drill), rank)


class SlowRows(torch.utils.data.Dataset):
    """Rows that take `seconds` each to read, as a slow disk gives them."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.tensor([i])


def step(clock, number, iterator, model=None):
    """One optimizer step as the Trainer takes it: the fetch, on_step_begin, the forward, on_step_end."""
    batch = next(clock.batches(iterator, number))
    clock.on_step_begin(CPU, SimpleNamespace(global_step=number - 1), None)
    if model is not None:
        model(input_ids=torch.zeros(1, 8, dtype=torch.long) + batch[0, 0] % 4)
    clock.on_step_end(CPU, SimpleNamespace(global_step=number), None)


def test_a_ranks_fetches_and_forwards_are_timed_per_step_without_warm_up_or_the_epochs_first_fetch():
    model = tiny_qwen2().train()
    clock = clock_of()
    clock.on_train_begin(CPU, None, None, model=model)
    loader = torch.utils.data.DataLoader(SlowRows(0.05), batch_size=1)
    epoch = iter(loader)
    step(clock, 1, epoch, model)  # warm-up: not measured
    assert clock.read()[2] == 0 and all(math.isnan(v) for v in clock.read()[:2])
    for number in (2, 3, 4):
        step(clock, number, epoch, model)
    data, forward, steps = clock.read()
    assert steps == 3 and 0.04 < data < 0.5 and 0 < forward < 0.5
    # a new epoch's first fetch holds accelerate's rng broadcast: left out, unknown rather than 0 s
    epoch = iter(torch.utils.data.DataLoader(SlowRows(0.2), batch_size=1))
    step(clock, 5, epoch, model)
    assert math.isnan(clock.read()[0])
    step(clock, 6, epoch, model)
    assert 0.15 < clock.read()[0] < 0.5
    # an evaluation's forward (eval mode) is not the step's
    model.eval()
    model(input_ids=torch.zeros(1, 8, dtype=torch.long))
    assert math.isnan(clock.read()[1])


def test_under_fsdp_the_forward_is_not_judged():
    model = tiny_qwen2().train()
    clock = clock_of(fsdp={})
    assert "FSDP all-gathers" in clock.unjudged["forward"]
    clock.on_train_begin(CPU, None, None, model=model)
    epoch = iter(torch.utils.data.DataLoader(SlowRows(0.0), batch_size=1))
    for number in (1, 2, 3):
        step(clock, number, epoch, model)
    data, forward, steps = clock.read()
    assert steps == 2 and data >= 0 and math.isnan(forward)


def test_the_slow_drills_slow_their_rank_alone_from_their_step():
    model = tiny_qwen2().train()
    drilled = clock_of({"kind": "slow-data", "step": 3, "rank": 1}, rank=1)
    spared = clock_of({"kind": "slow-data", "step": 3, "rank": 1}, rank=0)
    for clock in (drilled, spared):
        clock.on_train_begin(CPU, None, None, model=model)
        epoch = iter(torch.utils.data.DataLoader(SlowRows(0.0), batch_size=1))
        for number in (1, 2, 3, 4):
            step(clock, number, epoch)
    assert drilled.read()[0] > DRILL_MIN_S * 2 / 3 and spared.read()[0] < 0.1  # steps 3 and 4 of 2, 3, 4
    forward = clock_of({"kind": "slow", "step": 2, "rank": 0})
    forward.on_train_begin(CPU, None, None, model=model)
    epoch = iter(torch.utils.data.DataLoader(SlowRows(0.0), batch_size=1))
    for number in (1, 2):
        step(forward, number, epoch, model)
    assert forward.read()[1] >= DRILL_MIN_S


def test_a_rank_names_its_host_and_its_gpu_or_cpu():
    assert identity(cuda=False) == {"host": socket.gethostname(), "gpu": "CPU"}


def test_the_trainer_fetches_a_steps_batches_where_the_clock_times_them():
    """Pinned: transformers 5.24-5.25 take each optimizer step's batches in get_batch_samples(epoch_iterator,
    num_batches, device), with next() on the iterator (the e2e runs show the times arrive)."""
    import inspect

    from transformers import Trainer

    assert list(inspect.signature(Trainer.get_batch_samples).parameters) == [
        "self",
        "epoch_iterator",
        "num_batches",
        "device",
    ]
    assert "next(epoch_iterator)" in inspect.getsource(Trainer.get_batch_samples)


def test_the_watcher_judges_each_interval_once_and_names_a_rank_once(tmp_path):
    import json

    from sftdoctor.train.stragglers import StragglerWatch
    from sftdoctor.train.watch import Reporter

    metrics = SimpleNamespace(rank_times=None)
    watch = StragglerWatch(Reporter(tmp_path, plugins=False), metrics, clock_of())
    watch.ranks = [{"host": "node-a", "gpu": "CPU"}, {"host": "node-b", "gpu": "CPU"}]

    def log(step, logs):
        state = SimpleNamespace(global_step=step)
        watch.on_log(CPU, state, None, logs=logs)

    for step in range(1, 6):
        metrics.rank_times = {"step": step, "steps": 1, "step_time_s": 0.6, "data_s": [0, 0], "forward_s": [0.1, 0.5]}
        log(step, {"loss": 1.0})
    log(5, {"eval_loss": 1.0})  # an evaluation's and the run's closing logs at the same step: not new intervals
    log(5, {"train_runtime": 9.0})
    assert not (tmp_path / "findings.jsonl").exists()  # 5 steps: not yet sustained
    for step in (6, 7, 8):
        metrics.rank_times = {"step": step, "steps": 1, "step_time_s": 0.6, "data_s": [0, 0], "forward_s": [0.1, 0.5]}
        log(step, {"loss": 1.0})
    [named] = [json.loads(line) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    assert named["step"] == 6 and named["id"] == "straggler/forward" and named["evidence"]["host"] == "node-b"
