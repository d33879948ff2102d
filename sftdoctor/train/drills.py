"""`--drill`: a fault injected on purpose (a non-finite loss, a rank that hangs, a rank that straggles) to prove
the alarms fire."""

from __future__ import annotations

import re
from typing import Any

from sftdoctor.errors import InputError
from sftdoctor.run import Plan

KINDS = ("nan-loss", "nan-row", "hang", "desync", "slow", "slow-data")
SLOW = ("slow", "slow-data")  # a rank that keeps the others waiting (train.stragglers)


def parse_drill(text: str) -> dict[str, Any]:
    """ "nan-loss@5" -> a non-finite loss at step 5 on every rank; "hang@3:1" -> rank 1 blocks at step 3;
    "desync@3:1" -> at step 3 rank 1 calls a broadcast where the other ranks all-reduce their gradients;
    "nan-row@5:1" -> at step 5 the first sequence of rank 1's batch gets inf embeddings, wherever it is run;
    "slow@3:1" / "slow-data@3:1" -> from step 3 on, rank 1's forward pass / batch fetch takes three times as long
    (and at least half a second more) at every step. Without a rank, hang, desync and the slow drills act on
    rank 0."""
    kind, _, where = text.partition("@")
    step, _, rank = where.partition(":")
    if (
        kind not in KINDS
        or not re.fullmatch(r"[0-9]+", step)
        or int(step) < 1
        or (rank and not re.fullmatch(r"[0-9]+", rank))
    ):
        raise InputError(
            "--drill",
            "expected nan-loss@STEP[:RANK], nan-row@STEP[:RANK], hang@STEP[:RANK], desync@STEP[:RANK], "
            f"slow@STEP[:RANK] or slow-data@STEP[:RANK], got {text!r}",
        )
    return {"kind": kind, "step": int(step), "rank": int(rank) if rank else None}


def check_drill(drill: dict[str, Any] | None, plan: Plan) -> None:
    """A drill that can never fire is bad input: a rank the run does not have, a step after its end."""
    if drill is None:
        return
    if drill["kind"] == "desync" and plan.world_size < 2:
        raise InputError("--drill", "desync needs two processes or more: one process has no other rank to part from")
    if drill["kind"] in SLOW and plan.world_size < 2:
        raise InputError(
            "--drill", f"{drill['kind']} needs two processes or more: a straggler is slower than the other ranks"
        )
    if drill["kind"] == "slow" and (plan.fsdp is not None or (plan.deepspeed and plan.zero_stage == 3)):
        raise InputError(
            "--drill",
            "slow slows a rank's forward pass, which FSDP and ZeRO-3 fill with all-gathers of the weights, so the "
            "straggler check does not judge it there: use slow-data@STEP:RANK",
        )
    if drill["rank"] is not None and drill["rank"] >= plan.world_size:
        raise InputError(
            "--drill",
            f"rank {drill['rank']} does not exist: the run has {plan.world_size} "
            f"process{'es' if plan.world_size > 1 else ''} (ranks 0-{plan.world_size - 1})",
        )
    if plan.total_steps and drill["step"] > plan.total_steps:
        raise InputError("--drill", f"step {drill['step']} comes after the run's last step ({plan.total_steps})")
