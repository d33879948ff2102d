"""SIGTERM (Slurm's time limit or pre-emption, `scancel`, `docker stop`, Kubernetes): every rank stops at the
same step, with a checkpoint when one can finish within the plan's grace (`[launch] stop_grace_s`), else
without one, keeping the newest complete checkpoint. The requeued or resumed run goes on from it.

Agreeing on the step: the first rank that sees the signal at a step's end publishes "stop after step s + 2,
save or not" in the process group's store (compare_set: the first writer wins); every rank looks for it
at each step's end (one store round trip, no collective, no device sync). Ranks are never more than one
optimizer step apart (each step's gradient all-reduce holds them together), so none has passed s + 2.
Before the handler is installed (imports, model load) SIGTERM ends a rank at once: nothing new to save.
"""

from __future__ import annotations

import collections
import json
import signal
import time
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback

from sftdoctor.run import Plan
from sftdoctor.train import compat

KEY = "sftdoctor/stop"
AHEAD = 2  # steps between the first rank seeing the signal and the step every rank stops after
MARGIN = 1.25  # the save must fit the grace left with this much to spare
ASSUMED_WRITE_BPS = 250e6  # before this run has saved once: a network file system's rate for one client
ADAM_STATE_BYTES = 8  # AdamW's two fp32 moments per trainable parameter


def save_fits(left_s: float, steps: int, step_s: float, save_s: float) -> bool:
    """Whether `steps` more steps and a save end within `left_s`, with the margin."""
    return MARGIN * (steps * step_s + save_s) <= left_s


def checkpoint_bytes(model, zero_stage: int, world: int) -> float:
    """What the busiest rank writes: the trained weights (rank 0; an adapter's alone under LoRA) and its share of
    the optimizer state (all of it without ZeRO). ZeRO-3 parameters are empty outside a forward: their size is
    `ds_numel`."""
    weights = trainable = 0
    for p in model.parameters():
        if p.requires_grad:
            numel = getattr(p, "ds_numel", None) or p.numel()
            weights += numel * p.element_size()
            trainable += numel
    optimizer = ADAM_STATE_BYTES + (4 if zero_stage else 0)  # DeepSpeed keeps fp32 master weights too
    return weights + trainable * optimizer / (world if zero_stage >= 1 else 1)


def _rank() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class SaveOnSignal(TrainerCallback):
    """Installed by the recipe just before training; `stopped` tells main() the run ended on SIGTERM."""

    def __init__(self, trainer, plan: Plan):
        self.trainer, self.grace_s = trainer, float(plan.stop_grace_s)
        self.zero_stage = plan.zero_stage if plan.deepspeed else 0
        self.asked: float | None = None  # monotonic time of the first SIGTERM
        self.decision: dict[str, Any] | None = None
        self.stopped = False
        self.step_times: collections.deque = collections.deque(maxlen=20)
        self.step_began = self.save_began = None
        self.save_s: float | None = None  # the slowest save of this run so far
        signal.signal(signal.SIGTERM, self._signalled)

    def _signalled(self, signum, frame) -> None:
        if self.asked is None:
            self.asked = time.monotonic()

    # -- timing
    def on_step_begin(self, args, state, control, **kwargs):
        self.step_began = time.monotonic()

    def on_save(self, args, state, control, **kwargs):
        if self.save_began is not None:  # CompleteCheckpoints' barrier ran first: every rank's part is written
            took = time.monotonic() - self.save_began
            self.save_s = max(self.save_s or 0.0, took)
            self.save_began = None
            if self.stopped and state.is_world_process_zero:
                print(f"sftdoctor: SIGTERM: checkpoint-{state.global_step} saved in {took:.1f} s", flush=True)

    def _save_estimate(self) -> float:
        if self.save_s is not None:
            return self.save_s
        rank, world = _rank()
        return checkpoint_bytes(self.trainer.model, self.zero_stage, world) / ASSUMED_WRITE_BPS

    # -- the stop
    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        if self.step_began is not None:
            self.step_times.append(now - self.step_began)
        if self.decision is None:
            self.decision = self._agreed(state.global_step, now)
        if self.decision is not None and state.global_step >= self.decision["step"] and not self.stopped:
            self.stopped = True
            control.should_training_stop = True
            control.should_save = control.should_save or self.decision["save"]
            if control.should_save:
                self.save_began = now
            if state.is_world_process_zero:
                print(self._line(state.global_step), flush=True)

    def _agreed(self, step: int, now: float) -> dict[str, Any] | None:
        """The stop every rank follows, once one rank has seen the signal; None until then."""
        rank, world = _rank()
        store = compat.default_store() if world > 1 else None
        if self.asked is None:
            if store is None or not store.check([KEY]):
                return None
            return json.loads(store.get(KEY))
        ahead = AHEAD if store is not None else 0
        step_s = sum(self.step_times) / len(self.step_times) if self.step_times else 0.0
        left_s = self.grace_s - (now - self.asked)
        save_s = self._save_estimate()
        mine = {
            "step": step + ahead,
            "save": save_fits(left_s, ahead, step_s, save_s),
            "rank": rank,
            "left_s": round(left_s, 1),
            "save_s": round(save_s, 1),
        }
        if store is None:
            return mine
        return json.loads(store.compare_set(KEY, "", json.dumps(mine)))  # the first writer's, whoever it is

    def _line(self, step: int) -> str:
        d = self.decision
        head = f"sftdoctor: SIGTERM (seen first by rank {d['rank']}): every rank stops after step {step}"
        if d["save"]:
            return (
                f"{head} with a checkpoint (saving takes about {d['save_s']:.1f} s; {d['left_s']:.0f} s of grace left)"
            )
        return (
            f"{head} without a checkpoint: saving takes about {d['save_s']:.1f} s and only {d['left_s']:.0f} s of "
            "grace are left; the newest complete checkpoint is kept"
        )
