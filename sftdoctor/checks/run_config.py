"""Checks of a run's plan against the installed stack: batch-size, lr-scheduler, gradient-checkpointing, data-rows.
They run in `sftdoctor train`'s gate and in `check --config`; the plan (sftdoctor.run.resolve) decided
every number they judge."""

from __future__ import annotations

import json
import math
from typing import Any

from sftdoctor.checks import check
from sftdoctor.checks._common import BATCH_KEYS, trainer_mismatches
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.data_source import named

BIG_ACCUMULATION = 64


@check(
    "batch-size",
    "global batch = per-device batch x gradient accumulation x world size, exactly",
    messages={
        "not-divisible": "the global batch is not a multiple of per-device batch x world size",
        "deepspeed-hard-coded": "the DeepSpeed JSON hard-codes batch values that differ from the run's",
        "long-accumulation": "many sequential micro-steps of one sequence each",
    },
)
def batch_size(plan):
    target, per_device, world, accum = (
        plan.global_batch_size,
        plan.per_device_batch_size,
        plan.world_size,
        plan.gradient_accumulation_steps,
    )
    evidence = {
        "global_batch_size": target,
        "per_device_batch_size": per_device,
        "world_size": world,
        "nproc_per_node": plan.nproc_per_node,
        "nnodes": plan.nnodes,
        "gradient_accumulation_steps": accum,
    }
    processes = f"{world} process{'es' if world > 1 else ''}"
    if accum is None:
        nearest = plan.nearest_global_batch_sizes
        fixes = [f"[training] global_batch_size = {' or '.join(map(str, reversed(nearest)))}"]
        divisors = [m for m in range(per_device - 1, 0, -1) if target % (m * world) == 0]
        if divisors:
            fixes.append(f"per_device_batch_size = {divisors[0]} (accumulation {target // (divisors[0] * world)})")
        return error(
            f"global batch {target} is not a multiple of {per_device} per device x {processes}",
            detail=f"global = per_device x accumulation x world size; with {processes} "
            f"({plan.nproc_per_node} per node x {plan.nnodes} node{'s' if plan.nnodes > 1 else ''}) the nearest "
            f"that work are {' or '.join(map(str, nearest))}.",
            fix=", or ".join(fixes),
            evidence=evidence,
            id="batch-size/not-divisible",
        )
    line = f"global batch {target} = {per_device} per device x {accum} accumulation x {processes}"
    fixed = trainer_mismatches(plan.deepspeed or {}, plan, BATCH_KEYS)
    if fixed:
        said = ", ".join(
            f"{key} = {json.dumps(value)} (the run: {expected})" for key, (value, expected) in fixed.items()
        )
        return error(
            f"the DeepSpeed JSON ({plan.deepspeed_source}) hard-codes {said}; {line}",
            detail='transformers fills these keys only where they are "auto" and refuses any other value that '
            "differs, at trainer.train() once the model has loaded: 'Please correct the following DeepSpeed "
            "config values that mismatch TrainingArguments values'.",
            fix=f'set {", ".join(fixed)} to "auto" in the DeepSpeed JSON; the run config decides the batch',
            evidence={**evidence, "deepspeed": {k: v for k, (v, _) in fixed.items()}},
            id="batch-size/deepspeed-hard-coded",
        )
    if per_device == 1 and accum > BIG_ACCUMULATION:
        return warning(
            f"{line}: {accum} sequential micro-steps per optimizer step",
            detail="Each micro-step of one sequence leaves the GPU underused; with packing each row already "
            "holds max_length tokens, so a larger per-device batch usually fits and runs faster.",
            fix="raise [training] per_device_batch_size (memory permitting) and keep global_batch_size",
            evidence=evidence,
            id="batch-size/long-accumulation",
        )
    return ok(line, evidence=evidence)


@check(
    "lr-scheduler",
    "the learning-rate schedule the installed transformers/DeepSpeed will really run",
    messages={
        "deepspeed-scheduler": "the DeepSpeed JSON's scheduler replaces the run's",
        "no-cosine-with-min-lr": "the installed transformers has no cosine_with_min_lr",
        "absolute-min-lr": "an absolute min_lr under DeepSpeed crashes with this transformers",
        "warmup-too-long": "warmup as long as the whole run",
    },
)
def lr_scheduler(plan, transformers_features: dict[str, Any] | None = None):
    kind, kwargs, total, warmup = plan.lr_scheduler, plan.lr_scheduler_kwargs, plan.total_steps, plan.warmup_steps
    evidence = {
        "lr_scheduler": kind,
        "kwargs": kwargs,
        "warmup_steps": warmup,
        "total_steps": total,
        "features": transformers_features,
    }
    ds = plan.deepspeed or {}
    if isinstance(ds.get("scheduler"), dict):
        return warning(
            f"the DeepSpeed JSON's scheduler ({ds['scheduler'].get('type')}) replaces {kind}",
            detail='transformers hands scheduling to DeepSpeed when its JSON has a "scheduler" block '
            "(integrations/deepspeed.py, 4.x-5.x): [training] lr_scheduler, its floor and warmup are ignored.",
            fix='delete the "scheduler" block from the DeepSpeed JSON',
            evidence=evidence,
            id="lr-scheduler/deepspeed-scheduler",
        )
    if kind == "cosine_with_min_lr" and transformers_features and not transformers_features.get("cosine_with_min_lr"):
        return error(
            "the installed transformers has no cosine_with_min_lr schedule (added in 4.38)",
            fix="pip install -U 'transformers>=4.38', or lr_scheduler = \"cosine\"",
            evidence=evidence,
            id="lr-scheduler/no-cosine-with-min-lr",
        )
    if "min_lr" in kwargs and plan.deepspeed is not None:
        return error(
            "an absolute min_lr under DeepSpeed crashes at train start with this transformers",
            detail="transformers' get_cosine_with_min_lr_schedule_with_warmup reads optimizer.defaults['lr'] for an "
            "absolute floor; DeepSpeed's ZeRO optimizer has no defaults: both ranks die with AttributeError "
            "(transformers 5.24 x DeepSpeed 0.19). This transformers has no min_lr_rate to pass instead.",
            fix="pip install -U 'transformers>=4.38' (min_lr_rate), or lr_scheduler = \"cosine\"",
            evidence=evidence,
            id="lr-scheduler/absolute-min-lr",
        )
    if total is not None and warmup is not None and warmup >= total:
        return error(
            f"warmup of {warmup} steps is as long as the whole run ({total} steps)",
            detail="The learning rate would never reach its peak, and the schedule never decays.",
            fix="lower [training] warmup_steps, or use warmup_ratio = 0.03",
            evidence=evidence,
            id="lr-scheduler/warmup-too-long",
        )
    floor = ""
    if kwargs:
        key, value = next(iter(kwargs.items()))
        floor = f" to a floor of {value:g}" + (" x learning_rate" if key == "min_lr_rate" else "") + f" ({key})"
    steps = f"; warmup {warmup} of ~{total} steps" if total and warmup is not None else ""
    return ok(f"{kind} from {plan.learning_rate:g}{floor}{steps}", evidence=evidence)


@check(
    "gradient-checkpointing",
    "activation checkpointing: on, non-reentrant, under the name the installed transformers reads",
    messages={
        "off": "activation checkpointing is off",
        "deepspeed-block": "the DeepSpeed JSON's activation_checkpointing block does nothing for HF models",
    },
)
def gradient_checkpointing(plan):
    ds = plan.deepspeed or {}
    findings = []
    if plan.checkpointing:
        kind = (
            "reentrant (use_reentrant=True)" if plan.checkpointing_reentrant else "non-reentrant (use_reentrant=False)"
        )
        adapters = ""
        if plan.lora is not None:
            adapters = (
                " With frozen embeddings, reentrant checkpointing alone sees inputs that need no gradient "
                '("None of the inputs have requires_grad=True. Gradients will be None") and the adapters '
                "never learn: TRL 1.16 calls enable_input_require_grads() for PEFT with checkpointing, so "
                "gradients reach them."
            )
            if plan.checkpointing_reentrant:
                adapters += " Under ZeRO-3 TRL forces reentrant checkpointing for PEFT, and sftdoctor asks for it."
        findings.append(
            ok(
                f"on, {kind}, passed as TrainingArguments.{plan.checkpointing_arg}"
                + ("; gradients reach the adapters (enable_input_require_grads)" if plan.lora is not None else ""),
                detail="transformers 5 renamed gradient_checkpointing to activation_checkpointing (the old name is a "
                "deprecated alias); sftdoctor passes the name the installed version reads." + adapters,
                evidence={"argument": plan.checkpointing_arg, "use_reentrant": plan.checkpointing_reentrant},
            )
        )
    else:
        findings.append(
            info(
                f"off ({plan.reasons.get('checkpointing', 'as asked')}): every layer's activations stay "
                "in memory (fastest, most memory)",
                fix="[training] gradient_checkpointing = true if memory runs short",
                id="gradient-checkpointing/off",
            )
        )
    if "activation_checkpointing" in ds:
        findings.append(
            warning(
                'the DeepSpeed JSON\'s "activation_checkpointing" block does nothing for Hugging Face models',
                detail="It configures deepspeed.checkpointing, which only Megatron-style model code calls; "
                "transformers models checkpoint through TrainingArguments instead.",
                fix="remove the block; use [training] gradient_checkpointing = true",
                evidence={"deepspeed": ds["activation_checkpointing"]},
                id="gradient-checkpointing/deepspeed-block",
            )
        )
    return findings


@check(
    "data-rows",
    "the data holds rows, and enough of them for one global batch",
    messages={
        "one-object": "a data file that is one JSON object: one row",
        "no-global-batch": "the rows counted, with no whole global batch to compare",
        "fewer-than-batch": "fewer training rows than one global batch",
    },
)
def data_rows(data: dict[str, Any], plan):
    """Verdicts on the rows the data probe counted (bad rows were refused as bad input before any check ran)."""
    findings = [
        warning(
            f"{name} is one JSON object: the datasets library reads it as one row",
            detail="A file of rows is JSON Lines (one object a line) or a JSON array of objects; a file "
            "that is one object trains on that single example.",
            fix="write the rows as JSON Lines, or as a JSON array [{...}, {...}]",
            evidence={"file": name},
            id="data-rows/one-object",
        )
        for part in ("train", "eval")
        for name in (data.get(part) or {}).get("one_object", ())
    ]
    rows = (data.get("split") or {}).get("train", data["train"]["rows"])
    held = (data.get("split") or {}).get("eval", (data.get("eval") or {}).get("rows"))
    batch, accum = plan.global_batch_size, plan.gradient_accumulation_steps
    evidence = {"train_rows": rows, "eval_rows": held, "global_batch_size": batch}
    counted = (
        f"{rows} training row{'s' if rows != 1 else ''}"
        + (f" of {named(plan.data_source)}" if plan.data_source else "")
        + (f" ({held} eval)" if held else "")
    )
    if accum is None:  # batch-size says what is wrong with the batch
        findings.append(
            info(f"{counted}; no whole global batch to compare with", evidence=evidence, id="data-rows/no-global-batch")
        )
    elif rows < batch:
        steps = (
            f"; the run's {plan.max_steps} steps pass over the same {rows} rows {plan.max_steps} times"
            if plan.max_steps
            else f"; the whole run ({plan.epochs:g} epochs) is {math.ceil(plan.epochs)} "
            f"optimizer step{'s' if plan.epochs > 1 else ''}"
        )
        findings.append(
            warning(
                f"{counted}, fewer than one global batch of {batch} ({plan.per_device_batch_size} per device x {accum} "
                f"accumulation x {plan.world_size}): each epoch is one optimizer step on a partial batch of {rows}",
                detail="transformers' Trainer (set_initial_training_values, 5.x) rounds a short epoch up to one step: "
                "every step averages the same few rows, and the learning rate chosen for a batch of "
                f"{batch} is applied to {rows}"
                + steps
                + (" (packed, fewer sequences still)." if plan.packing else "."),
                fix=f"add training rows, or set [training] global_batch_size to at most {rows}",
                evidence=evidence,
                id="data-rows/fewer-than-batch",
            )
        )
    else:
        full, rest = divmod(rows, batch)
        findings.append(
            ok(
                f"{counted}: {full} full global batch{'es' if full != 1 else ''} of {batch} per epoch"
                + (f" and a partial one of {rest}" if rest else ""),
                evidence=evidence,
            )
        )
    return findings
