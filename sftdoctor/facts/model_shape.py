"""The model's shape for memory planning: closed-form for the Llama/Qwen families, in this process and
without torch; for other architectures, counted on PyTorch's meta device in a child process (no weights
are loaded or allocated: transformers 5.x `AutoModelForCausalLM.from_config` under `torch.device("meta")`),
only where there are GPUs to plan for, so `sftdoctor check` never imports torch.

    python -m sftdoctor.facts.model_shape CONFIG.json     prints {"parameters": N, "largest": M}
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError
from sftdoctor.facts.catalogue import MODEL, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.configs import read_json_object
from sftdoctor.run.gpus import devices
from sftdoctor.run.shape import ALIASES, GATED_MLP, Shape, closed_form, dimension_problem, from_counts

TIMEOUT_S = 300


MAX_BUILT_LAYERS = 256  # beyond this (no real model has as many), count 1 and 2 layers and extrapolate


def count_on_meta_device(config: dict[str, Any]) -> tuple[int, int]:
    """(all parameters, the largest single parameter tensor) of the model `config` describes. A config of
    more layers than MAX_BUILT_LAYERS is counted from one and two layers (every layer of such a stack is
    the same; 10^7 layers would otherwise take minutes and gigabytes even on the meta device)."""
    layers_key = next((k for k in ("num_hidden_layers", *ALIASES["num_hidden_layers"]) if k in config), None)
    layers = config.get(layers_key) if layers_key else None
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_BUILT_LAYERS:
        (one, largest), (two, _) = (_count(_with_layers(config, layers_key, n)) for n in (1, 2))
        return one + (layers - 1) * (two - one), largest
    return _count(config)


def _with_layers(config: dict[str, Any], key: str, layers: int) -> dict[str, Any]:
    out = {**config, key: layers}
    if isinstance(config.get("layer_types"), list):
        out["layer_types"] = config["layer_types"][:layers]
    return out


def _count(config: dict[str, Any]) -> tuple[int, int]:
    import torch
    import transformers

    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if not model_type:
        raise ValueError("config.json has no model_type")
    if not isinstance(model_type, str):
        raise ValueError(f"config.json's model_type is {model_type!r}; expected a string naming the architecture")
    cfg = transformers.AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    sizes = [p.numel() for p in model.parameters()]  # a tied embedding is one parameter, counted once
    return sum(sizes), max(sizes)


def shape_in_child(path: str) -> tuple[Shape | None, str | None]:
    """(shape, why not) with the meta-device count run by a child process."""
    try:
        config = read_json_object(Path(path), "model config.json")
    except InputError as exc:
        return None, exc.message if exc.key is None else f"{exc.key}: {exc.message}"
    if config.get("model_type") is None:
        return None, "config.json has no model_type"
    if not isinstance(config["model_type"], str) or (config["model_type"] in GATED_MLP and dimension_problem(config)):
        return None, dimension_problem(config)  # a family we size (or no family at all): say which key
    counts = in_child("sftdoctor.facts.model_shape", config, "counting parameters on the meta device", TIMEOUT_S)
    if "error" in counts:
        return None, counts["error"]
    shape = from_counts(config, counts["parameters"], counts["largest"])
    return (shape, None) if shape else (None, dimension_problem(config))


@fact(
    "model_shape",
    "parameters and largest tensor, counted on the meta device",
    inputs=MODEL,
    why_missing="no model config, or an architecture sftdoctor counts only where there are GPUs",
    needs=("model_config",),
)
def probe_model_shape(facts, summary) -> dict[str, Any] | None:
    if not isinstance(summary.get("config"), dict):
        return None
    shape = closed_form(summary["config"])
    if shape is None and devices(facts.get("gpus")):
        shape, why = shape_in_child(summary["path"])
        if shape is None:
            return {"error": why}
    return asdict(shape) if shape else None


def _counts(config: dict[str, Any]) -> dict[str, int]:
    params, largest = count_on_meta_device(config)
    return {"parameters": params, "largest": largest}


if __name__ == "__main__":
    serve(_counts)
