"""run/schedule.py against transformers' own schedulers, built for real, step by step."""

import pytest
import torch
from transformers import get_scheduler

from sftdoctor.run import schedule as schedules
from sftdoctor.run.schedule import schedule_of


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("linear", {}),
        ("cosine", {}),
        ("constant_with_warmup", {}),
        ("constant", {}),
        ("cosine_with_min_lr", {"min_lr_rate": 0.1}),
    ],
)
@pytest.mark.parametrize("warmup, total", [(0, 40), (3, 60), (10, 11)])
def test_the_rate_at_every_step_is_transformers_own(name, kwargs, warmup, total):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
    scheduler = get_scheduler(
        name, optimizer, num_warmup_steps=warmup, num_training_steps=total, scheduler_specific_kwargs=kwargs or None
    )
    schedule = {
        "name": name,
        "learning_rate": 2e-4,
        "total_steps": total,
        "warmup_steps": warmup,
        "min_lr_rate": kwargs.get("min_lr_rate", 0.0),
    }
    for step in range(total + 1):
        assert schedules.rate(schedule, step) == pytest.approx(scheduler.get_last_lr()[0], rel=1e-9, abs=1e-15), step
        optimizer.step()
        scheduler.step()


def test_a_plans_schedule_with_its_floor_as_a_rate_or_an_absolute_min_lr():
    plan = {
        "lr_scheduler": "cosine_with_min_lr",
        "learning_rate": 1e-3,
        "total_steps": 100,
        "warmup_steps": 5,
        "lr_scheduler_kwargs": {"min_lr": 1e-4},
    }
    assert schedule_of(plan)["min_lr_rate"] == pytest.approx(0.1)
    assert schedules.floor(schedule_of(plan)) == pytest.approx(1e-4)
    assert schedule_of({**plan, "lr_scheduler": "cosine"})["min_lr_rate"] == 0.0


def test_no_schedule_when_deepspeed_brings_its_own_or_the_length_is_unknown():
    plan = {"lr_scheduler": "linear", "learning_rate": 1e-3, "total_steps": 100, "warmup_steps": 5}
    assert schedule_of({**plan, "deepspeed": {"scheduler": {"type": "WarmupLR"}}}) is None
    assert schedule_of({**plan, "total_steps": None}) is None
    assert schedule_of({**plan, "lr_scheduler": "polynomial"}) is None
