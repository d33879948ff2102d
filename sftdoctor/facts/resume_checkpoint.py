"""The checkpoint `sftdoctor train --resume` would load (the newest complete one in the run's output_dir), read
from its file names: whether DeepSpeed saved it, on how many data-parallel ranks and with which ZeRO stage.

DeepSpeed 0.19.8 (runtime/engine.py `_get_ckpt_name`, `_get_rank_zero_ckpt_name`) writes, under the tag that the
checkpoint's `latest` file names (transformers' Trainer: `global_stepN`):
    ZeRO-1/2  mp_rank_00_model_states.pt            + one {bf16_,}zero_pp_rank_R_mp_rank_00_optim_states.pt per rank
    ZeRO-3    zero_pp_rank_R_mp_rank_00_model_states.pt + the same optim states, one of each per rank
and `ds_to_universal` a `latest_universal` file naming the converted tag. No file is opened: a listing is enough,
and `sftdoctor check` never imports torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.run.checkpoints import newest_complete, step_of

_OPTIM = re.compile(r"^(?:bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_ZERO3_MODEL = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$")
_MODEL = re.compile(r"^mp_rank_\d+_model_states\.pt$")


@fact(
    "resume_checkpoint",
    "the checkpoint --resume would load: its DeepSpeed world size and ZeRO stage (file names)",
    inputs=RUN_CONFIG,
    why_missing="no complete checkpoint in the run's output_dir: nothing to resume",
    needs=("plan",),
)
def probe_resume_checkpoint(facts, plan) -> dict[str, Any] | None:
    """None when the run's output_dir holds no complete checkpoint (nothing to resume)."""
    checkpoint = newest_complete(plan.output_dir)
    return describe(checkpoint) if checkpoint is not None else None


def describe(checkpoint: Path) -> dict[str, Any]:
    """What a checkpoint folder holds, as plain JSON."""
    tags = sorted(p.name for p in checkpoint.glob("global_step*") if p.is_dir())
    latest = _read(checkpoint / "latest")
    universal = _read(checkpoint / "latest_universal")
    found = {
        "path": str(checkpoint),
        "step": step_of(checkpoint),
        "tags": tags,
        "latest": latest,
        "optimizer_pt": (checkpoint / "optimizer.pt").is_file(),
        "universal": universal if universal and (checkpoint / universal).is_dir() else None,
    }
    tag = latest if latest in tags else None
    found["deepspeed"] = layout(sorted(p.name for p in (checkpoint / tag).iterdir())) if tag else None
    return found


def layout(names: list[str]) -> dict[str, Any] | None:
    """The data-parallel world size and ZeRO stage that saved a DeepSpeed tag folder, from its file names; None when
    it holds no ZeRO optimizer states."""
    ranks = sorted({int(m[1]) for name in names if (m := _OPTIM.match(name)) and int(m[2]) == 0})
    if not ranks:
        return None
    stage3 = any(_ZERO3_MODEL.match(name) for name in names)
    return {
        "world_size": len(ranks),
        "ranks": ranks,
        "zero3": stage3,
        "model_states": sum(1 for name in names if _ZERO3_MODEL.match(name) or _MODEL.match(name)),
    }


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None
