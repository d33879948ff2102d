"""What the installed transformers can do, read from its source files without importing it."""

from __future__ import annotations

import re
from typing import Any

from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.packages import module_file


def _read(*parts: str) -> str:
    path = module_file("transformers", *parts)
    try:
        return path.read_text(encoding="utf-8") if path else ""
    except OSError:
        return ""


@fact(
    "transformers_features",
    "what the installed transformers supports (by feature)",
    why_missing="transformers is not installed",
    shape={str: (bool, str, None)},
)
def probe_transformers_features(facts) -> dict[str, Any] | None:
    optimization = _read("optimization.py")
    training_args = _read("training_args.py")
    if not optimization and not training_args:
        return None
    schedule = re.search(
        r"def get_cosine_with_min_lr_schedule_with_warmup\((.*?)\)\s*(?:->[^:]*)?:", optimization, re.S
    )
    return {
        # transformers >= 4.38 has the schedule; min_lr_rate arrived with it, min_lr a little later.
        "cosine_with_min_lr": schedule is not None,
        "min_lr_rate": bool(schedule and "min_lr_rate" in schedule[1]),
        "min_lr": bool(schedule and re.search(r"\bmin_lr\b", schedule[1])),
        # transformers 5.x renamed gradient_checkpointing -> activation_checkpointing (old name: deprecated alias).
        "checkpointing_arg": "activation_checkpointing"
        if re.search(r"^\s+activation_checkpointing: ", training_args, re.M)
        else "gradient_checkpointing",
        # transformers 5.x dropped warmup_ratio: a warmup_steps below 1 is the ratio instead.
        "warmup_ratio": bool(re.search(r"^\s+warmup_ratio: ", training_args, re.M)),
        # transformers 5.x: train_sampling_strategy="group_by_length" replaced group_by_length=True.
        "length_grouping_arg": "train_sampling_strategy"
        if re.search(r"^\s+train_sampling_strategy: ", training_args, re.M)
        else "group_by_length",
        # include_num_input_tokens_seen="non_padding" counts only real tokens (transformers >= 4.57).
        "non_padding_token_count": '"non_padding"' in training_args,
    }
