"""A straggler: a rank that keeps the others waiting at every step. What each rank measures of itself, how it
reaches rank 0, and the watcher that hands it to the `straggler` check (sftdoctor.checks.straggler: the rule).

What can name it. Under DDP and DeepSpeed ZeRO every rank meets the others in each step's gradient all-reduce,
so the wall time of a step is the same on every rank: the fast ranks wait inside the collective for the slow
one. Step time cannot tell which rank is slow; the waiting is the mirror image of the slowness. What differs is
each rank's own work before it waits, measured here per optimizer step:
- data time: the host time to fetch the step's batches (`next()` on the train dataloader's iterator, in
  `get_batch_samples`, which the Trainer calls once per optimizer step; transformers 5.24-5.25). The first fetch
  of each epoch is left out: accelerate 1.16's DataLoaderShard broadcasts the sampler generator's state from rank
  0 before its first batch (`synchronize_rng_states`), a collective in which the fast ranks wait.
- forward time: the rank's own forward passes, timed by hooks on the unwrapped model (`trainer.model`). DDP's
  buffer broadcast runs in its own forward, before it calls this module, and its gradient all-reduce in the
  backward: neither is inside. The backward is not timed, as that is where the all-reduce overlaps it; a slow GPU
  slows forward and backward alike, so the forward says it. On CUDA the host's clock would time kernel launches,
  not kernels: two CUDA events per forward are recorded on the stream and read at the logging interval only once
  they have completed (`query()`, no sync); one still pending is read at the next interval. A host that is late
  to launch (starved CPUs) shows in them too, as the GPU idles between the events.
- Under FSDP or ZeRO-3 each layer's forward all-gathers its weights from every rank, so a fast rank's forward
  waits for the slow one: the forward time is not the rank's own and is not judged (said in the fact), and data
  time alone is.
The first optimizer step of each launch is left out of both (allocator warm-up, lazy initialisation). Rank 0's
extra work (logs, checkpoints, evaluation) runs between steps, outside both windows.

Cost: two `perf_counter()` reads per fetch and two per forward (two CUDA events on a GPU), no sync; the times
travel in the all_gather the metrics already make once per logging interval (callbacks.Metrics.enrich), and the
host and GPU of each rank in one all_gather_object at the start of training.
"""

from __future__ import annotations

import collections
import math
import socket
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from sftdoctor.checks.straggler import INTERVALS, MIN_STEPS
from sftdoctor.run import Plan

DRILL_MIN_S = 0.5  # the slow drills' least delay per step
DRILL_KINDS = {"slow": "forward", "slow-data": "data"}


def forward_unjudged(plan: Plan) -> str | None:
    """Why a rank's forward time is not its own under this plan, or None."""
    if plan.fsdp is not None:
        return "FSDP all-gathers each layer's weights in the forward pass: a fast rank's forward waits for the slow one"
    if plan.deepspeed and plan.zero_stage == 3:
        return (
            "ZeRO-3 all-gathers each layer's weights in the forward pass: a fast rank's forward waits for the slow one"
        )
    return None


def identity(cuda: bool) -> dict[str, str]:
    """This rank's host and GPU, as the finding names them: "cuda:INDEX NAME (GPU-UUID)" (the UUID is what
    `nvidia-smi -i` takes whatever CUDA_VISIBLE_DEVICES renumbered), or "CPU"."""
    host = socket.gethostname()
    if not cuda:
        return {"host": host, "gpu": "CPU"}
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    uuid = uuid if not uuid or uuid.startswith("GPU-") else f"GPU-{uuid}"
    return {"host": host, "gpu": f"cuda:{index} {props.name}" + (f" ({uuid})" if uuid else "")}


class Timed:
    """The epoch iterator, each `next()` timed into the clock."""

    def __init__(self, clock: RankClock, iterator: Iterator, step: int):
        self.clock, self.iterator, self.step = clock, iterator, step

    def __iter__(self):
        return self

    def __next__(self):
        began = time.perf_counter()
        batch = next(self.iterator)
        self.clock.drag("data", self.step, began)
        self.clock.fetched(self.iterator, time.perf_counter() - began)
        return batch


class TimedBatches:
    """Trainer mixin: each fetch of the step's batches timed into the trainer's `sftdoctor_clock`. transformers
    5.24-5.25 call `get_batch_samples(epoch_iterator, num_batches, device)` once per optimizer step and take the
    step's batches from the iterator with next(); what follows (counting the step's items, an all_reduce when
    averaging tokens across devices) stays outside the timed fetches."""

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        clock = getattr(self, "sftdoctor_clock", None)
        if clock is not None:
            epoch_iterator = clock.batches(epoch_iterator, self.state.global_step + 1)
        return super().get_batch_samples(epoch_iterator, num_batches, device)


class RankClock(TrainerCallback):
    """This rank's data and forward time since the last read, per optimizer step (module docstring)."""

    def __init__(self, plan: Plan, rank: int):
        self.unjudged = {"forward": why} if (why := forward_unjudged(plan)) else {}
        drill = plan.drill or {}
        slowed = drill.get("kind") in DRILL_KINDS and (drill.get("rank") or 0) == rank
        self.drill = {"where": DRILL_KINDS[drill["kind"]], "step": drill["step"], "rank": rank} if slowed else None
        self.cuda, self.step, self.warm, self.said = False, 0, False, False
        self.epoch: Iterator | None = None
        self.began: Any = None  # the running forward's start: a CUDA event, or the host's clock
        self.began_host = 0.0
        self._reset()

    def _reset(self) -> None:
        self.data, self.forward, self.steps = 0.0, 0.0, 0
        self.fetches, self.skipped = 0, 0  # fetches timed, and left out (an epoch's first)
        self.pending: list[tuple[int, Any, Any]] = []  # CUDA: (step, start event, end event)
        self.timed: set[int] = set()  # the steps whose forward time is in self.forward

    # -- the trainer's moments
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.cuda = args.device.type == "cuda"
        if model is not None and "forward" not in self.unjudged:
            model.register_forward_pre_hook(self._forward_began)
            model.register_forward_hook(self._forward_ended)
        self.warm = False
        self._reset()

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1

    def on_step_end(self, args, state, control, **kwargs):
        if not self.warm:  # the launch's first step: warm-up, not the rank's pace
            self.warm = True
            self._reset()
            return
        self.steps += 1

    # -- measuring
    def batches(self, iterator: Iterator, step: int) -> Timed:
        return Timed(self, iterator, step)

    def fetched(self, iterator: Iterator, seconds: float) -> None:
        if iterator is not self.epoch:  # an epoch's first fetch holds accelerate's rng broadcast (module docstring)
            self.epoch = iterator
            self.skipped += 1
            return
        self.data += seconds
        self.fetches += 1

    def _forward_began(self, module, args) -> None:
        if not module.training:
            return
        self.began_host = time.perf_counter()
        if self.cuda:
            self.began = torch.cuda.Event(enable_timing=True)
            self.began.record()
        else:
            self.began = self.began_host

    def _forward_ended(self, module, args, output) -> None:
        if not module.training or self.began is None:
            return
        self.drag("forward", self.step, self.began_host)
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pending.append((self.step, self.began, end))
        else:
            self.forward += time.perf_counter() - self.began
            self.timed.add(self.step)
        self.began = None

    def read(self) -> tuple[float, float, int]:
        """(data s per step, forward s per step, steps measured) since the last read; NaN where nothing was measured;
        the clock starts again. CUDA events still pending stay for the next read."""
        done = [p for p in self.pending if p[2].query()]
        forward = self.forward + sum(start.elapsed_time(end) / 1000 for _, start, end in done)
        timed = self.timed | {step for step, _, _ in done}
        waiting = [p for p in self.pending if p not in done]
        # per step: the timed fetches' mean, times the fetches a step takes (one left out is one not timed, not 0 s)
        fetches = self.fetches + self.skipped
        data = self.data / self.fetches * fetches / self.steps if self.steps and self.fetches else math.nan
        per_forward = forward / len(timed) if timed and "forward" not in self.unjudged else math.nan
        steps = self.steps
        self._reset()
        self.pending = waiting
        return data, per_forward, steps

    # -- the slow drills
    def drag(self, where: str, step: int, began: float) -> None:
        """The slow drills: this rank's forward pass (slow) or batch fetch (slow-data) takes at least three times
        its own time, and at least DRILL_MIN_S more, at every step from the drill's on."""
        drill = self.drill
        if drill is None or drill["where"] != where or step < drill["step"]:
            return
        if self.cuda and where == "forward":
            torch.cuda.synchronize()  # the drilled rank alone: its forward's real length, to triple it
        delay = max(DRILL_MIN_S, 2 * (time.perf_counter() - began))
        if not self.said:
            self.said = True
            what = "forward pass" if where == "forward" else "batch fetch"
            print(
                f"sftdoctor: drill: rank {drill['rank']}'s {what} slowed by {delay:.2f} s or more at every step "
                f"from step {drill['step']}",
                flush=True,
            )
        time.sleep(delay)


class StragglerWatch(TrainerCallback):
    """At each logging step, the interval's per-rank times (callbacks.Metrics gathered them) join a window of the
    last few intervals, and the `straggler` check judges it; rank 0 prints and records what it finds. Each rank
    and signal is named once."""

    def __init__(self, reporter, metrics, clock: RankClock):
        self.reporter, self.metrics, self.clock = reporter, metrics, clock
        self.window: collections.deque = collections.deque(maxlen=max(INTERVALS, MIN_STEPS))
        self.ranks: list[dict[str, str] | None] = []
        self.reported: set[str] = set()

    def on_train_begin(self, args, state, control, **kwargs):
        mine = identity(args.device.type == "cuda")
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self.ranks = [None] * dist.get_world_size()
            dist.all_gather_object(self.ranks, mine)  # once per launch: host names are text
        else:
            self.ranks = [mine]

    def on_log(self, args, state, control, logs=None, **kwargs):
        interval = getattr(self.metrics, "rank_times", None)
        if not logs or "loss" not in logs or not interval or interval["step"] != state.global_step:
            return  # an evaluation's or the run's closing log: no interval of its own
        if len(self.ranks) < 2 or not interval["steps"] or interval is (self.window[-1] if self.window else None):
            return  # one process; the launch's first step alone (warm-up); an interval already judged
        self.window.append(interval)
        facts = {
            "step": state.global_step,
            "ranks": self.ranks,
            "intervals": list(self.window),
            "unjudged": self.clock.unjudged,
            "reported": sorted(self.reported),
        }
        findings = self.reporter.check(rank_times=facts)  # third-party checks of rank_times too
        self.reported |= {
            str(f.evidence["key"]) for f in findings if isinstance(f.evidence, dict) and "key" in f.evidence
        }
        self.reporter.publish(findings, state.global_step)
