"""The learning rate a run's schedule gives at each step, as transformers computes it (optimization.py,
verified against 5.24; the same lambdas since 4.2x). One place for the formula: the lr-curve check compares
the logged curve with it and the report draws it.

Which step a logged value belongs to moved: transformers 4.51 and later log the rate the step just taken used
(lambda(step - 1), PR #36973), earlier versions the one after the scheduler stepped (lambda(step)); an fp16
step skipped on overflow does not step the scheduler, so the log lags one more step. Readers allow these.
Checked against 14 real Trainer logs (tests/fixtures/curves), 4.27 to 4.57.
"""

from __future__ import annotations

import math
from typing import Any

SCHEDULES = ("linear", "cosine", "cosine_with_min_lr", "constant_with_warmup", "constant")


def trainer_warmup(warmup: dict[str, float], total: int) -> int:
    """The warmup steps the Trainer derives from its arguments (`TrainingArguments.get_warmup_steps`): 5.x reads
    a warmup_steps below 1 as a ratio of the run's steps, 4.x had warmup_ratio for that."""
    ((key, value),) = warmup.items()
    return math.ceil(total * value) if key == "warmup_ratio" or value < 1 else int(value)


def schedule_of(plan: Any, total: int | None = None) -> dict[str, Any] | None:
    """The schedule a Plan (or its JSON) configures over `total` steps (default: the plan's estimate; the
    Trainer's own count, logged with every record, is exact where packing changes it), or None when the
    Trainer's is not the one applied (a DeepSpeed `scheduler` block replaces it) or the length is unknown."""
    get = plan.get if isinstance(plan, dict) else lambda key, default=None: getattr(plan, key, default)
    name, total = get("lr_scheduler"), total or get("total_steps")
    if name not in SCHEDULES or not total or "scheduler" in (get("deepspeed") or {}):
        return None
    kwargs = get("lr_scheduler_kwargs") or {}
    peak = float(get("learning_rate"))
    floor = kwargs.get("min_lr_rate")
    if floor is None and kwargs.get("min_lr") is not None:
        floor = kwargs["min_lr"] / peak
    return {
        "name": name,
        "learning_rate": peak,
        "total_steps": int(total),
        "warmup_steps": trainer_warmup(get("warmup"), int(total)) if get("warmup") else int(get("warmup_steps") or 0),
        "min_lr_rate": float(floor) if name == "cosine_with_min_lr" else 0.0,
    }


def factor(schedule: dict[str, Any], step: float) -> float:
    """lambda(step): the multiplier of the peak rate after `step` scheduler steps."""
    name, total, warm = schedule["name"], schedule["total_steps"], schedule["warmup_steps"]
    if name == "constant":
        return 1.0
    if step < warm:
        return step / max(1, warm)
    if name == "constant_with_warmup":
        return 1.0
    progress = (step - warm) / max(1, total - warm)
    if name == "linear":
        return max(0.0, (total - step) / max(1, total - warm))
    floor = schedule.get("min_lr_rate", 0.0)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)) * (1 - floor) + floor)


def rate(schedule: dict[str, Any], step: float) -> float:
    return schedule["learning_rate"] * factor(schedule, step)


def floor(schedule: dict[str, Any]) -> float:
    """The rate the schedule ends at."""
    return rate(schedule, schedule["total_steps"])
