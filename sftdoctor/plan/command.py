"""`sftdoctor plan RUN.toml`: from the run config to the plan, its memory fit and its timing.

Planning for another machine (--gpu-memory, --gpus, --nodes) changes the facts and the run config the
one decide() sees, so precision, batch and accumulation are decided exactly as for a run there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError
from sftdoctor.facts import Facts, Inputs, Overlay
from sftdoctor.facts.model_shape import shape_in_child
from sftdoctor.plan.render import render, timing, to_json
from sftdoctor.plan.tokens import dataset_tokens, steps_and_tokens
from sftdoctor.run import Plan, decide
from sftdoctor.run.gpus import devices, smallest_memory
from sftdoctor.run.memory import Fit
from sftdoctor.run.resolve import memory_fit
from sftdoctor.run.shape import Shape


def target_gpus(found: dict[str, Any], count: int, gpu_memory: int | None) -> dict[str, Any]:
    """The GPUs to plan for: the ones found, or `count` of `gpu_memory` bytes each (of the model found here,
    when there is one)."""
    if gpu_memory is None:
        return found
    model = (devices(found) or [{}])[0]
    return {
        **found,
        "devices": [
            {
                "index": i,
                "name": model.get("name"),
                "compute_capability": model.get("compute_capability"),
                "memory_total_mib": gpu_memory // 2**20,
            }
            for i in range(count)
        ],
    }


def make(
    config: Path,
    gpu_memory: int | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    mfu: float = 0.4,
    peak_tflops: float | None = None,
    tokens_per_second: float | None = None,
) -> tuple[Plan, Fit, dict[str, Any]]:
    facts = Facts(Inputs(config=config))
    run, summary = facts.get("run"), facts.get("model_config")
    if summary is None:
        raise InputError(
            config,
            "the model's config.json was not found (a local folder, or a hub id in the HF cache)",
            key="[model].path",
        )
    found = facts.get("gpus") or {}
    if gpu_memory is None and not devices(found):
        raise InputError("plan", "no NVIDIA GPU found here: give --gpu-memory (and --gpus) to plan for another machine")
    if gpus_per_node:
        run = run.with_values("launch", nproc_per_node=gpus_per_node)
    if nodes:
        run = run.with_values("launch", nnodes=nodes)
    count = run.launch.nproc_per_node if isinstance(run.launch.nproc_per_node, int) else max(1, len(devices(found)))
    gpus = target_gpus(found, count, gpu_memory)
    plan = decide(run, Overlay(facts, run=run, gpus=gpus))
    shape_fact = facts.get("model_shape")
    shape = Shape(**shape_fact) if shape_fact and "error" not in shape_fact else None
    if shape is None:
        shape, why = shape_in_child(summary["path"])
        if shape is None:
            raise InputError(summary["path"], f"cannot count the model's parameters: {why}")
    fitted = memory_fit(plan, shape, smallest_memory(gpus))
    counted = steps_and_tokens(dataset_tokens(plan), plan)
    names = [d.get("name") for d in devices(gpus)]
    return plan, fitted, timing(fitted, counted, names[0] if names else None, mfu, peak_tflops, tokens_per_second)


def main(config: Path, as_json: bool = False, **what_if) -> int:
    """Exit 0: the run fits; 1: it does not. `what_if`: make()'s machine and speed to plan for. Bad input raises
    InputError(s)."""
    if as_json:
        text, code = json_text(config, **what_if)
        sys.stdout.write(text)
        return code
    _, fitted, timed = make(config, **what_if)
    print(render(fitted, timed))
    return 0 if fitted.current.fits else 1


def json_text(config: Path, **what_if) -> tuple[str, int]:
    """What `plan --json` prints, and its exit code (for `sftdoctor mcp`, which prints nothing)."""
    import json

    _, fitted, timed = make(config, **what_if)
    return json.dumps(to_json(fitted, timed), indent=2) + "\n", 0 if fitted.current.fits else 1
