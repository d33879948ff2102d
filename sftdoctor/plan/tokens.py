"""The dataset's token count, estimated by tokenizing a sample of rows the way the trainer will
(the chat template for `messages`, prompt + completion, or text), so the plan can count steps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

SAMPLE = 256


def row_text(row: dict[str, Any], tokenizer) -> str:
    if "messages" in row:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(row["messages"], tokenize=False)
        return "\n".join(str(m.get("content", "")) for m in row["messages"])
    if "prompt" in row:
        return f"{row['prompt']}{row.get('completion', '')}"
    return str(row.get("text", ""))


def dataset_tokens(run_config: dict[str, Any], sample: int = SAMPLE) -> dict[str, Any] | None:
    """{'rows', 'mean_tokens', 'tokens'} over the train files, or None when no tokenizer can be loaded."""
    from sftdoctor.facts.data import first_rows_and_count

    try:
        from transformers import AutoTokenizer

        model = run_config["model"]
        tokenizer = AutoTokenizer.from_pretrained(model.get("tokenizer") or model["path"],
                                                  trust_remote_code=model.get("trust_remote_code", False))
    except Exception:  # offline hub id, no tokenizer files: the plan falls back to an upper bound
        return None
    files = run_config["data"]["train"]
    lengths, rows = [], 0
    for path in files if isinstance(files, list) else [files]:
        head, count = first_rows_and_count(Path(path), sample)
        rows += count
        max_length = run_config["data"]["max_length"]
        lengths += [min(len(tokenizer(row_text(r, tokenizer), add_special_tokens=False)["input_ids"]), max_length)
                    for r in head if isinstance(r, dict)]
    if not lengths:
        return None
    mean = sum(lengths) / len(lengths)
    return {"rows": rows, "sampled_rows": len(lengths), "mean_tokens": mean, "tokens": int(mean * rows)}


def steps_and_tokens(tokens: dict[str, Any] | None, rows: int | None, run_config: dict[str, Any], global_batch: int,
                     packing: bool) -> dict[str, Any]:
    """Optimizer steps and real tokens per step: packed rows are full rows of max_length; unpacked rows
    keep their length. Without a token count, every row counts as max_length (an upper bound)."""
    training, max_length = run_config["training"], run_config["data"]["max_length"]
    if tokens is None:
        per_step, rows_per_epoch, basis = global_batch * max_length, rows, "rows x max_length (an upper bound)"
    elif packing:
        per_step, rows_per_epoch = global_batch * max_length, math.ceil(tokens["tokens"] / max_length)
        basis = f"{tokens['tokens']:,} tokens packed into rows of {max_length} (from {tokens['sampled_rows']} rows tokenized)"
    else:
        per_step, rows_per_epoch = int(global_batch * tokens["mean_tokens"]), tokens["rows"]
        basis = f"{tokens['mean_tokens']:.0f} tokens per row on average (from {tokens['sampled_rows']} rows tokenized)"
    steps = training.get("max_steps") or (math.ceil(training["epochs"] * rows_per_epoch / global_batch)
                                          if rows_per_epoch else None)
    return {"tokens_per_step": per_step, "steps": steps, "token_basis": basis}
