"""What `sftdoctor train` prints of its plan before it starts, and how to load what it wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sftdoctor.facts import Facts
from sftdoctor.run import Plan
from sftdoctor.run.data_source import STREAM_SHUFFLE_BUFFER, named
from sftdoctor.run.resolve import FSDP_GENERATED


def schedule(plan: Plan) -> str:
    floor = ", ".join(f"{k}={v:g}" for k, v in plan.lr_scheduler_kwargs.items()) or "no floor"
    ((key, value),) = plan.warmup.items()
    warm = f"{value:.0%} of the run" if key == "warmup_ratio" or value < 1 else f"{int(value)} steps"
    return f"{floor}; warmup {warm}"


def memory_summary(plan: Plan, facts: Facts) -> str:
    from sftdoctor.plan.render import summary
    from sftdoctor.run.gpus import devices, smallest_memory
    from sftdoctor.run.resolve import memory_fit
    from sftdoctor.run.shape import Shape

    shape, gpus = facts.get("model_shape"), facts.get("gpus")
    if not devices(gpus) or not smallest_memory(gpus):
        return (
            "memory          not planned: no GPU of known memory here "
            "(sftdoctor plan --gpu-memory plans for another machine)"
        )
    if shape is None or "error" in shape:
        return f"memory          not planned: {(shape or {}).get('error') or facts.why_missing('model_shape')}"
    return summary(memory_fit(plan, Shape(**shape), smallest_memory(gpus)))


def adapters_line(lora: dict) -> str:
    from sftdoctor.train.adapters import describe

    line = describe(lora)
    if lora.get("trainable_params") and lora.get("base_params"):
        share = lora["trainable_params"] / lora["base_params"]
        line += f": {lora['trainable_params']:,} trainable of {lora['base_params']:,} ({share:.2%})"
    return line + ("; merged at the end" if lora["merge"] else "")


def loading(plan: Plan, run_dir: Path) -> list[str]:
    """How to load what the run wrote: the model, or the adapter (and the merged model)."""
    from sftdoctor.train.adapters import MERGED

    final = os.path.normpath(run_dir / "final")
    if plan.lora is None:
        return [f"load it: AutoModelForCausalLM.from_pretrained({final!r})"]
    lines = [f"load it: peft.AutoPeftModelForCausalLM.from_pretrained({final!r}) (base + adapter)"]
    if plan.lora["merge"]:
        lines.append(f"or merged: AutoModelForCausalLM.from_pretrained({os.path.normpath(run_dir / MERGED)!r})")
    return lines


def sharding(plan: Plan) -> str:
    """The sharding engine in one line: DeepSpeed's ZeRO stage, FSDP2's settings, or none (DDP)."""
    if plan.deepspeed is not None:
        return f"DeepSpeed ZeRO-{plan.zero_stage} ({plan.deepspeed_source})"
    if plan.fsdp is None:
        return "none (DDP)" if plan.world_size > 1 else "none"
    fsdp, reasons = plan.fsdp, plan.reasons
    if plan.fsdp_source != FSDP_GENERATED:
        return f"FSDP{fsdp.get('version', 2)} ({plan.fsdp_source})"
    parts = [
        reasons.get("fsdp_sharding", "full"),
        "reshard after forward" if fsdp.get("reshard_after_forward") else "no reshard after forward",
        "CPU offload" if fsdp.get("cpu_offload") else None,
        "FSDP's activation checkpointing" if fsdp.get("activation_checkpointing") else None,
        "shards filled from rank 0's weights" if fsdp.get("cpu_ram_efficient_loading") else None,
        "checkpoints sharded, final model whole",
    ]
    return "FSDP2: " + "; ".join(p for p in parts if p)


def data_line(plan: Plan) -> str:
    """A hub dataset's name, subset, split and revision, the rows, and whether they are streamed."""
    files = len(plan.train_files)
    where = named(plan.data_source) if plan.data_source else f"{files} file{'s' if files != 1 else ''}"
    streamed = f", streamed (shuffled within {STREAM_SHUFFLE_BUFFER:,} rows)" if plan.streaming else ""
    return f"{where}: {plan.data_rows or '?'} rows{streamed}"


def describe(plan: Plan) -> str:
    accumulation = plan.gradient_accumulation_steps or "no whole"
    loss = (
        "assistant turns only"
        if plan.assistant_only_loss
        else "completions only"
        if plan.data_shape == "prompt_completion"
        else "every token"
    )
    lines = [
        f"world size      {plan.world_size} ({plan.nproc_per_node} per node x {plan.nnodes} node"
        f"{'s' if plan.nnodes > 1 else ''})",
        f"global batch    {plan.global_batch_size} = {plan.per_device_batch_size} per device x {accumulation} "
        f"accumulation x {plan.world_size}",
        f"tokens per step <= {plan.tokens_per_step_max:,} (max_length {plan.max_length})",
        f"packing         {'on' if plan.packing else 'off'} ({plan.reasons.get('packing')})",
        f"checkpointing   {'on' if plan.checkpointing else 'off'} ({plan.reasons.get('checkpointing')})",
        f"precision       {plan.precision} (weights loaded in {plan.load_dtype}); "
        f"attention {plan.attn_implementation}; "
        f"liger-kernel {'on' if plan.liger_kernel else 'off'}",
        f"schedule        {schedule(plan)}",
        f"loss            {loss}" + (f"; chat template {Path(plan.chat_template).name}" if plan.chat_template else ""),
        f"sharding        {sharding(plan)}",
        f"run directory   {os.path.normpath(plan.output_dir)}",
    ]
    if plan.lora is not None:
        lines.insert(-2, f"adapters        {adapters_line(plan.lora)}")
    if plan.data_source or plan.streaming:
        lines.insert(-1, f"data            {data_line(plan)}")
    if "global_batch_size" in plan.reasons:
        lines.insert(1, f"                {plan.reasons['global_batch_size']}")
    if plan.deepspeed is not None:
        lines.append("deepspeed json  " + json.dumps(plan.deepspeed))
    if plan.world_size > 1:
        lines.insert(1, f"rendezvous      {plan.master_addr}:{plan.master_port} ({plan.reasons.get('master_port')})")
    if plan.nnodes > 1:
        lines.insert(1, f"node rank       {plan.node_rank} ({plan.reasons.get('node_rank')})")
    return "\n".join(lines)
