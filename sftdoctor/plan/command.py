"""`sftdoctor plan RUN.toml`: from the run config to the plan and its timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError
from sftdoctor.plan import Planned, plan_run
from sftdoctor.plan.report import timing
from sftdoctor.plan.shape import shape_of
from sftdoctor.plan.tokens import dataset_tokens, steps_and_tokens


def make(config: Path, gpu_memory: int | None = None, gpus_per_node: int | None = None, nodes: int | None = None,
         mfu: float = 0.4, peak_tflops: float | None = None, tokens_per_second: float | None = None
         ) -> tuple[Planned, dict[str, Any]]:
    from sftdoctor.facts import Facts, Inputs
    from sftdoctor.train import resolve

    facts = Facts(Inputs(config=config))
    run_config, summary = facts.get("run_config"), facts.get("model_config")
    if summary is None:
        raise InputError(config, "the model's config.json was not found (a local folder, or a hub id in the HF cache)",
                         key="model.path")
    gpus, packages = facts.get("gpus") or {}, facts.get("packages") or {}
    if gpu_memory is None and not gpus.get("devices"):
        raise InputError("plan", "no NVIDIA GPU found here: give --gpu-memory (and --gpus) to plan for another machine")
    nproc, nnodes = resolve.world(run_config, gpus)
    model = json.loads(Path(summary["path"]).read_text(encoding="utf-8"))
    planned = plan_run(run_config, shape_of(model), gpus, packages, facts.get("deepspeed_config"),
                       gpu_memory=gpu_memory, world=(gpus_per_node or nproc, nodes or nnodes))
    rows = ((facts.get("data") or {}).get("train") or {}).get("rows")
    packing = run_config["training"]["packing"] is not False  # "auto" packs where the stack isolates samples
    counted = steps_and_tokens(dataset_tokens(run_config), rows, run_config, planned.global_batch, packing)
    names = [d.get("name") for d in gpus.get("devices") or []]
    return planned, timing(planned, counted, names[0] if names else None, mfu, peak_tflops, tokens_per_second)
