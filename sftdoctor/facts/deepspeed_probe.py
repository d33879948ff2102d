"""Is a DeepSpeed JSON one the installed DeepSpeed accepts? Asked of DeepSpeed itself, in a child process.

DeepSpeed parses its sections with pydantic models (runtime/config.py and the section configs, 0.19), which
refuse a stage of "two" or 99, an offload device "gpu", a misspelt key inside a section. What they let
through is checked here as DeepSpeed reads it: a misspelt top-level key is silently ignored (so
"zero_optimisation" means no ZeRO), "enabled" of a precision section must be true, false or "auto",
gradient_clipping a number. Values still "auto" are what transformers fills from the run (batch sizes are
checked against the run's plan by the batch-size check, not here).

    python -m sftdoctor.facts.deepspeed_probe DS.json     prints [[key, problem], ...]
"""

from __future__ import annotations

import ast
import difflib
import json
from pathlib import Path
from typing import Any

from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.packages import module_file

OBJECT_SECTIONS = (
    "zero_optimization",
    "fp16",
    "bf16",
    "bfloat16",
    "optimizer",
    "scheduler",
    "activation_checkpointing",
    "flops_profiler",
    "comms_logger",
    "amp",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "aio",
    "checkpoint",
)
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# The pydantic model behind each section, as DeepSpeed 0.19 names them in its validation errors.
MODELS = {
    "DeepSpeedZeroConfig": "zero_optimization",
    "DeepSpeedFP16Config": "fp16",
    "DeepSpeedBF16Config": "bf16",
    "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param",
    "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer",
}
TIMEOUT_S = 120


def known_keys() -> set[str]:
    """Every key DeepSpeed names in its constants and config modules (their upper-case string constants)."""
    init = module_file("deepspeed", "__init__.py")
    found: set[str] = set()
    if init is None:
        return found
    for path in [*init.parent.rglob("constants.py"), *init.parent.rglob("config.py")]:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.isupper()
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                found.add(node.value.value)
    return found


def structure_problems(config: dict[str, Any], known: set[str]) -> list[tuple[str, str]]:
    """What DeepSpeed would ignore or crash on before its models see it."""
    problems = []
    for key in config:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.8) if key not in known else []
        if close:
            problems.append((key, f"unknown key (did you mean {close[0]!r}?): DeepSpeed ignores it"))
    for section in OBJECT_SECTIONS:
        if section in config and not isinstance(config[section], dict):
            problems.append((section, f"expected an object, got {json.dumps(config[section])}"))
    for section in ("fp16", "bf16", "bfloat16"):
        block = config.get(section)
        if isinstance(block, dict) and "enabled" in block and block["enabled"] not in (True, False, "auto"):
            problems.append(
                (f"{section}.enabled", f'expected true, false or "auto", got {json.dumps(block["enabled"])}')
            )
    clipping = config.get("gradient_clipping")
    if (
        clipping is not None
        and clipping != "auto"
        and (isinstance(clipping, bool) or not isinstance(clipping, (int, float)) or clipping < 0)
    ):
        problems.append(("gradient_clipping", f'expected a number >= 0 or "auto", got {json.dumps(clipping)}'))
    for key in BATCH_KEYS:
        value = config.get(key)
        if (
            value is not None
            and value != "auto"
            and (isinstance(value, bool) or not isinstance(value, int) or value < 1)
        ):
            problems.append((key, f'expected a positive integer or "auto", got {json.dumps(value)}'))
    return problems


def model_problems(config: dict[str, Any]) -> list[tuple[str, str]]:
    """What DeepSpeed's own parser refuses, with the run's batch values stood in by 1 (one process here)."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    filled = {**config, "train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    if filled.get("gradient_clipping") == "auto":
        filled["gradient_clipping"] = 1.0
    try:
        DeepSpeedConfig(filled)
    except ValidationError as exc:
        section = MODELS.get(exc.title, "")
        return [(".".join([section, *map(str, err["loc"])]).strip("."), _said(err, exc.title)) for err in exc.errors()]
    except Exception as exc:  # DeepSpeed's own asserts
        return [("", f"DeepSpeed refuses it: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")]
    return []


def _said(err: dict[str, Any], model: str) -> str:
    """pydantic's message with what was found, and a did-you-mean for a misspelt key inside a section."""
    if err.get("type") == "extra_forbidden":
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        fields = DeepSpeedZeroConfig.model_fields if model == "DeepSpeedZeroConfig" else {}
        names = set(fields) | {f.alias for f in fields.values() if f.alias}
        close = difflib.get_close_matches(str(err["loc"][-1]), names, n=1, cutoff=0.6)
        return "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "") + ": DeepSpeed refuses it"
    return f"{err['msg']}, got {json.dumps(err.get('input'), default=str)}"


def problems_in_child(path: Path) -> list[tuple[str, str]]:
    """[(key, problem)] from a child process (importing DeepSpeed loads torch); [] when it cannot say (the
    deepspeed-precision check still reads the JSON)."""
    answer = in_child("sftdoctor.facts.deepspeed_probe", str(path), "DeepSpeed's own validation", TIMEOUT_S)
    return [tuple(p) for p in answer.get("problems", [])]


def main(path: str) -> list[tuple[str, str]]:
    from sftdoctor.facts.configs import read_json_object  # the parent's reader: the same file, the same rules

    config = read_json_object(Path(path), "DeepSpeed config")
    return structure_problems(config, known_keys()) or model_problems(config)


if __name__ == "__main__":
    serve(lambda path: {"problems": main(path)})
