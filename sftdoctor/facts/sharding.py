"""What the fsdp-config check reads beside the FSDP YAML (facts/configs.py fsdp_config): the model's module classes
and `_no_split_modules`, built on PyTorch's meta device in a child process (no weight is read or allocated, and
`check` never imports torch), and what the installed accelerate and transformers do with gradients FSDP2 leaves on
several meshes, read from their source files.

    python -m sftdoctor.facts.sharding '{"config": "CONFIG.json", "trust": false}'   prints the classes as JSON
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.configs import FSDP
from sftdoctor.facts.model_shape import MAX_BUILT_LAYERS, _with_layers
from sftdoctor.facts.packages import module_file
from sftdoctor.facts.probe_cache import cached, folder_files
from sftdoctor.facts.shapes import OPT_COUNT, OPT_STR
from sftdoctor.run.shape import ALIASES

TIMEOUT_S = 300


@fact(
    "model_classes",
    "the model's module class names and _no_split_modules, built on the meta device (with an FSDP config only)",
    inputs=(*FSDP, "model_config"),
    why_missing="no FSDP config, or no model config.json to build the model from",
    shape={
        "architecture": OPT_STR,
        "classes": ([str], None),
        "no_split_modules": ([str], None),
        "parameters": OPT_COUNT,
        "error": OPT_STR,
    },
    needs=("fsdp_config", "model_config"),
)
def probe_model_classes(facts, _fsdp, model) -> dict[str, Any] | None:
    if not isinstance(model.get("config"), dict):
        return None
    run = facts.get("run")
    path = Path(model["path"])  # the config.json the model_config fact read (any name, with --model-config FILE)
    request = {"config": str(path), "trust": bool(run and run.model.trust_remote_code)}
    return cached("model-classes", request, folder_files(path.parent), lambda: _child(request))


def _child(request: dict[str, Any]) -> dict[str, Any]:
    return in_child("sftdoctor.facts.sharding", request, "building the model on the meta device", TIMEOUT_S)


def _auto_config(config: dict[str, Any], folder: str, trust: bool):
    import transformers

    if trust:
        return transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ValueError("config.json has no model_type naming the architecture")
    return transformers.AutoConfig.for_model(model_type, **fields)


def _on_meta(cfg, trust: bool):
    """The model the run trains (a causal LM), else the bare architecture (an encoder such as BERT has no causal
    LM head in every release), on the meta device."""
    import torch
    import transformers

    with torch.device("meta"):
        try:
            return transformers.AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust)
        except ValueError:  # "Unrecognized configuration class ... for this kind of AutoModel"
            return transformers.AutoModel.from_config(cfg, trust_remote_code=trust)


def list_classes(path: str, trust: bool) -> dict[str, Any]:
    """Every module class name the model holds, its `_no_split_modules` (accelerate's default wrap classes) and its
    parameter count. A stack of more than MAX_BUILT_LAYERS layers is built with two: its layers are alike, so the
    classes are the same (and the count is left out)."""
    config = json.loads(Path(path).read_text(encoding="utf-8"))
    key = next((k for k in ("num_hidden_layers", *ALIASES["num_hidden_layers"]) if k in config), None)
    layers = config.get(key) if key else None
    shrunk = isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_BUILT_LAYERS and not trust
    model = _on_meta(
        _auto_config(_with_layers(config, key, 2) if shrunk else config, str(Path(path).parent), trust), trust
    )
    no_split = getattr(model, "_no_split_modules", None)
    return {
        "architecture": type(model).__name__,
        "classes": sorted({type(m).__name__ for m in model.modules()}),
        "no_split_modules": sorted(no_split) if no_split is not None else None,
        "parameters": None if shrunk else sum(p.numel() for p in model.parameters()),
    }


def _source(package: str, *parts: str) -> str | None:
    path = module_file(package, *parts)
    try:
        return path.read_text(encoding="utf-8") if path else None
    except OSError:
        return None


@fact(
    "fsdp_stack",
    "what the installed accelerate and transformers do with FSDP2 gradients on several meshes (source files)",
    why_missing="neither accelerate nor transformers is installed",
    shape={"accelerate_clips_per_mesh": (bool, None), "trainer_clips_per_mesh": (bool, None)},
)
def probe_fsdp_stack(facts) -> dict[str, Any] | None:
    """accelerate 1.16 accelerator.py Accelerator.clip_grad_norm_ sends FSDP2 to _clip_grad_norm_dtensor_aware (one
    norm per device mesh, plain tensors apart; accelerate 1.10-1.14 called torch.nn.utils.clip_grad_norm_ on the mix);
    transformers 5.25 trainer.py Trainer._clip_grad_norm goes to _mixed_mesh_grad_norm when its gradients are on
    several meshes. None: that package is not installed."""
    accelerator = _source("accelerate", "accelerator.py")
    trainer = _source("transformers", "trainer.py")
    if accelerator is None and trainer is None:
        return None
    return {
        "accelerate_clips_per_mesh": None
        if accelerator is None
        else "def _clip_grad_norm_dtensor_aware" in accelerator,
        "trainer_clips_per_mesh": None if trainer is None else "def _mixed_mesh_grad_norm" in trainer,
    }


if __name__ == "__main__":
    serve(lambda asked: list_classes(asked["config"], bool(asked.get("trust", False))))
