"""LoRA's arithmetic on the model's linear layers (facts/lora_modules.py): which layers target_modules
wraps, which names match nothing, and how many parameters the adapters train.

peft (0.13-0.21, `check_target_module_exists`) matches a target_modules name against each module's full
path: equal, or a suffix after a dot ("q_proj" wraps "model.layers.0.self_attn.q_proj"). A list whose
names match nothing at all is peft's error; names that match nothing beside others that do are silently
ignored. "all-linear" wraps every linear layer but the output head. A LoRA layer of rank r trains
A (r x in) and B (out x r); DoRA adds a magnitude vector of `out`.
"""

from __future__ import annotations

import re
from typing import Any

DIGITS = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


def _matches(pattern: str, name: str) -> bool:
    name = DIGITS.sub("*", name)  # "layers.0.self_attn.q_proj" names every layer's, as far as counts go
    return pattern == name or pattern.endswith("." + name)


def targeted(modules: dict[str, Any], target_modules: str | tuple[str, ...]) -> list[dict[str, Any]]:
    """The linear-layer groups LoRA wraps."""
    layers = modules.get("linear") or []
    if target_modules == "all-linear":
        return [e for e in layers if not e.get("output")]
    return [e for e in layers if any(_matches(e["pattern"], name) for name in target_modules)]


def unmatched(modules: dict[str, Any], target_modules: str | tuple[str, ...]) -> list[str]:
    """target_modules names that wrap no linear layer of this model."""
    if target_modules == "all-linear":
        return []
    layers = modules.get("linear") or []
    return [name for name in target_modules if not any(_matches(e["pattern"], name) for e in layers)]


def adapter_parameters(modules: dict[str, Any], lora: dict[str, Any]) -> int:
    """Parameters the run trains: the adapters of every wrapped layer, plus modules_to_save in full."""
    total = 0
    for entry in targeted(modules, lora["target_modules"]):
        per_layer = lora["r"] * (entry["in"] + entry["out"]) + (entry["out"] if lora.get("use_dora") else 0)
        total += entry["count"] * per_layer
    full = modules.get("modules") or {}
    return total + sum(full.get(name, 0) for name in lora.get("modules_to_save") or ())
