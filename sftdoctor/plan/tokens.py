"""The dataset's token count, estimated by tokenizing a sample of rows the way the trainer will
(the chat template for `messages`, prompt + completion, or text), so the plan can count steps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sftdoctor.facts.trainer_inputs import row_text

SAMPLE = 256


def dataset_tokens(plan, sample: int = SAMPLE) -> dict[str, Any] | None:
    """{'rows', 'mean_tokens', 'tokens'} over the train files, or None when no tokenizer can be loaded."""
    from sftdoctor.facts.data import first_rows_and_count, to_messages

    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(plan.tokenizer_path, trust_remote_code=plan.trust_remote_code)
    except Exception:  # offline hub id, no tokenizer files: the plan falls back to an upper bound
        return None
    lengths, rows = [], 0
    for path in plan.train_files:
        head, count = first_rows_and_count(Path(path), sample)
        if plan.data_format in ("sharegpt", "alpaca"):  # trained as messages: counted as messages
            head = [{"messages": to_messages(r, plan.data_format)} for r in head]
        rows += count
        lengths += [
            min(
                len(tokenizer(row_text(r, tokenizer, plan.data_shape), add_special_tokens=False)["input_ids"]),
                plan.max_length,
            )
            for r in head
            if isinstance(r, dict)
        ]
    if not lengths or not any(lengths):  # transformers 5 builds an empty tokenizer from a bare config.json
        return None
    mean = sum(lengths) / len(lengths)
    return {"rows": rows, "sampled_rows": len(lengths), "mean_tokens": mean, "tokens": int(mean * rows)}


def steps_and_tokens(tokens: dict[str, Any] | None, plan) -> dict[str, Any]:
    """Optimizer steps and real tokens per step: packed rows are full rows of max_length; unpacked rows
    keep their length. Without a token count, every row counts as max_length (an upper bound)."""
    max_length, global_batch, rows = plan.max_length, plan.global_batch_size, plan.data_rows
    if tokens is None:
        per_step, rows_per_epoch, basis = global_batch * max_length, rows, "rows x max_length (an upper bound)"
    elif plan.packing:
        per_step, rows_per_epoch = global_batch * max_length, math.ceil(tokens["tokens"] / max_length)
        basis = (
            f"{tokens['tokens']:,} tokens packed into rows of {max_length} "
            f"(from {tokens['sampled_rows']} rows tokenized)"
        )
    else:
        per_step, rows_per_epoch = int(global_batch * tokens["mean_tokens"]), tokens["rows"]
        basis = f"{tokens['mean_tokens']:.0f} tokens per row on average (from {tokens['sampled_rows']} rows tokenized)"
    held_out = 1 - plan.eval_fraction
    steps = plan.max_steps or (
        math.ceil(plan.epochs * rows_per_epoch * held_out / global_batch) if rows_per_epoch else None
    )
    return {"tokens_per_step": per_step, "steps": steps, "token_basis": basis}
