"""zero-resume: the checkpoint `--resume` would load against this launch's world size and ZeRO stage.

DeepSpeed 0.19.8 (runtime/engine.py `_load_zero_checkpoint`) refuses ZeRO optimizer states saved on another number
of data-parallel ranks ("The checkpoint being loaded used a DP world size of 8 but the current world size is 16"),
for stages 1, 2 and 3 alike, unless `"checkpoint": {"load_universal": true}` loads a `ds_to_universal` copy. A
ZeRO-3 engine reads per-rank model states that ZeRO-1/2 never write, and the other way round. transformers 5.25's
`deepspeed_load_checkpoint` raises "Can't find a valid checkpoint" for a folder without a `global_step*` tag.
"""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, info, ok, warning

CONVERT = "python -m deepspeed.checkpoint.ds_to_universal --input_folder {tag} --output_folder {tag}_universal"


@check(
    "zero-resume",
    "a checkpoint to resume was saved on this launch's world size and ZeRO stage",
    messages={
        "optimizer-lost": "a DeepSpeed checkpoint resumed without DeepSpeed: the optimizer state is not restored",
        "saved-without-deepspeed": "a checkpoint saved without DeepSpeed resumed with it",
        "no-latest": "no ZeRO checkpoint tag DeepSpeed can load",
        "other-layout": "a checkpoint saved on another world size or ZeRO stage",
        "universal": "a universal checkpoint loads whatever saved it",
        "no-universal": "load_universal is set but the checkpoint has no universal copy",
    },
)
def zero_resume(resume_checkpoint: dict[str, Any], plan):
    saved, path = resume_checkpoint.get("deepspeed"), resume_checkpoint["path"]
    evidence = {
        **resume_checkpoint,
        "launch": {
            "world_size": plan.world_size,
            "zero_stage": plan.zero_stage,
            "deepspeed": plan.deepspeed is not None,
        },
    }
    if plan.deepspeed is None:
        if saved is None:
            raise NotApplicable("neither the checkpoint nor this launch uses DeepSpeed ZeRO")
        return warning(
            f"{path} was saved by DeepSpeed ({_stage(saved)} on {_ranks(saved['world_size'])}); this launch "
            "runs without DeepSpeed: the optimizer state (Adam moments) will not be restored",
            detail="DeepSpeed keeps it in its own partitions, which plain torch cannot read.",
            fix="resume with the same [deepspeed] settings, or accept a fresh optimizer (add warmup)",
            evidence=evidence,
            id="zero-resume/optimizer-lost",
        )
    if not resume_checkpoint.get("tags") and not resume_checkpoint.get("universal"):
        return error(
            f"{path} was saved without DeepSpeed and this launch uses it: transformers refuses to resume "
            f'("Can\'t find a valid checkpoint at {path}")',
            fix="resume without [deepspeed], as it was saved; or start a new run from its weights "
            f'([model] path = "{path}" and another [training] output_dir)',
            evidence=evidence,
            id="zero-resume/saved-without-deepspeed",
        )
    if (plan.deepspeed.get("checkpoint") or {}).get("load_universal"):
        return _universal(resume_checkpoint, plan, evidence)
    if saved is None:
        names, tags = resume_checkpoint.get("latest") or "nothing", ", ".join(resume_checkpoint["tags"])
        return error(
            f"{path} has no ZeRO checkpoint DeepSpeed can load: its `latest` file names {names}, its tags are {tags}",
            detail="DeepSpeed loads the tag that `latest` names; without one the Trainer stops with "
            '"[deepspeed] failed to resume from checkpoint".',
            fix=f"write the tag to load into {path}/latest (e.g. {resume_checkpoint['tags'][-1]})",
            evidence=evidence,
            id="zero-resume/no-latest",
        )
    return _same_layout(resume_checkpoint, saved, plan, evidence)


def _same_layout(found: dict[str, Any], saved: dict[str, Any], plan, evidence: dict[str, Any]):
    path, tag = found["path"], f"{found['path']}/{found['latest']}"
    here = f"{_stage_of(plan.zero_stage)} on {_ranks(plan.world_size)}"
    then = f"{_stage(saved)} on {_ranks(saved['world_size'])}"
    if saved["world_size"] == plan.world_size and saved["zero3"] == (plan.zero_stage == 3):
        return ok(f"{path}: {then}, as this launch", evidence=evidence)
    what = "world size" if saved["world_size"] != plan.world_size else "ZeRO stage"
    detail = (
        f'DeepSpeed refuses it at the start of the run, after the model has loaded: "The checkpoint being '
        f'loaded used a DP world size of {saved["world_size"]} but the current world size is {plan.world_size}".'
        if what == "world size"
        else "A ZeRO-3 engine reads one model-states file per rank, ZeRO-1/2 one for all: the files this launch "
        "looks for are not there."
    )
    return error(
        f"{path} was saved by {then}; this launch is {here}: DeepSpeed cannot resume it on another {what}",
        detail=detail,
        fix=_fixes(found, saved, tag),
        evidence=evidence,
        id="zero-resume/other-layout",
    )


def _fixes(found: dict[str, Any], saved: dict[str, Any], tag: str) -> str:
    world = saved["world_size"]
    return (
        f"launch on {_ranks(world)} ({_stage(saved)}) to resume it as saved; or convert it once: "
        f'`{CONVERT.format(tag=tag)}` and set "checkpoint": {{"load_universal": true}} in a DeepSpeed JSON '
        f'([deepspeed] config); or start a new run from its weights ([model] path = "{found["path"]}", another '
        "[training] output_dir: the optimizer restarts)"
    )


def _universal(found: dict[str, Any], plan, evidence: dict[str, Any]):
    path = found["path"]
    if found.get("universal"):
        return info(
            f"{path}: the universal copy {found['universal']} loads on {_ranks(plan.world_size)} "
            f"({_stage_of(plan.zero_stage)}), whatever saved it",
            evidence=evidence,
            id="zero-resume/universal",
        )
    tag = f"{path}/{found.get('latest') or (found['tags'] or ['global_stepN'])[-1]}"
    return error(
        f'the DeepSpeed JSON sets "checkpoint": {{"load_universal": true}} but {path} has no universal '
        "copy (no latest_universal file)",
        detail="DeepSpeed looks up the tag in latest_universal and finds none to load.",
        fix=f"convert it: `{CONVERT.format(tag=tag)}`; or remove load_universal to resume as saved",
        evidence=evidence,
        id="zero-resume/no-universal",
    )


def _stage(saved: dict[str, Any]) -> str:
    return "ZeRO-3" if saved["zero3"] else "ZeRO-1/2"


def _stage_of(stage: int) -> str:
    return f"ZeRO-{stage}" if stage else "DeepSpeed without ZeRO"


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"
