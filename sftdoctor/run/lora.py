"""LoRA's arithmetic on the model's layers (facts/lora_modules.py): which layers target_modules wraps,
which names match nothing, and how many parameters the adapters train. Where the fact holds what peft
itself built on the meta-device model, that is the answer; the rule below is the estimate for a listing
without it (the memory model's closed-form Llama/Qwen shapes).

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


def _peft(modules: dict[str, Any], target_modules, lora: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What peft itself built on the meta-device model (facts/lora_modules.py), when it could and for these
    same settings (a listing recorded for other ones says nothing about these)."""
    found = modules.get("adapters")
    if not isinstance(found, dict) or "trainable" not in found:
        return None
    asked = found.get("settings") or {}
    same = _names(asked.get("target_modules")) == _names(target_modules) and all(
        asked.get(k) == (list(v) if isinstance(v, tuple) else v)
        for k, v in (lora or {}).items()
        if k in ("r", "modules_to_save", "use_dora")
    )
    return found if same else None


def _names(value) -> str | list[str]:
    return value if isinstance(value, str) or value is None else list(value)


def targeted(modules: dict[str, Any], target_modules: str | tuple[str, ...]) -> list[dict[str, Any]]:
    """The layer groups LoRA wraps: peft's own answer, else by its matching rule over the linear layers."""
    if (peft := _peft(modules, target_modules)) is not None:
        return peft["wrapped"]
    layers = modules.get("linear") or []
    if target_modules == "all-linear":
        return [e for e in layers if not e.get("output")]
    return [e for e in layers if any(_matches(e["pattern"], name) for name in target_modules)]


def unmatched(modules: dict[str, Any], target_modules: str | tuple[str, ...]) -> list[str]:
    """target_modules names that wrap no linear layer of this model."""
    if (peft := _peft(modules, target_modules)) is not None:
        return peft["unmatched"]
    if target_modules == "all-linear":
        return []
    layers = modules.get("linear") or []
    return [name for name in target_modules if not any(_matches(e["pattern"], name) for e in layers)]


def adapter_parameters(modules: dict[str, Any], lora: dict[str, Any]) -> int:
    """Parameters the run trains: peft's own count, else the adapters of every wrapped layer plus
    modules_to_save in full (an estimate from the linear layers alone)."""
    if (peft := _peft(modules, lora["target_modules"], lora)) is not None:
        return peft["trainable"]
    total = 0
    for entry in targeted(modules, lora["target_modules"]):
        per_layer = lora["r"] * (entry["in"] + entry["out"]) + (entry["out"] if lora.get("use_dora") else 0)
        total += entry["count"] * per_layer
    full = modules.get("modules") or {}
    return total + sum(full.get(name, 0) for name in lora.get("modules_to_save") or ())
