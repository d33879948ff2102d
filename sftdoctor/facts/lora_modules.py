"""The model's linear layers and what peft's LoRA makes of them, without loading a weight: the architecture
built on PyTorch's meta device from config.json and wrapped by peft itself with the run's [lora] settings,
in a child process (so `check` never imports torch), kept in the probe cache. The trainable parameter count
is peft's own, whatever the architecture (embeddings, fused MoE experts, layer-indexed names).

Layer paths are grouped with every number replaced by `*` ("model.layers.*.self_attn.q_proj": one entry of
32 layers). A stack of more than MAX_BUILT_LAYERS layers is listed from one and two layers: each layer of such
a stack is alike, so its count is c1 + (layers - 1) x (c2 - c1).

    python -m sftdoctor.facts.lora_modules '{"config": "CONFIG.json", "trust": false, "lora": {"r": 16, ...}}'
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import MODEL, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.model_shape import MAX_BUILT_LAYERS, _with_layers
from sftdoctor.facts.probe_cache import cached, folder_files
from sftdoctor.run.shape import ALIASES

TIMEOUT_S = 300
NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


@fact(
    "lora_modules",
    "the model's linear layers as peft sees them, and the adapters [lora] builds",
    inputs=MODEL,
    why_missing="no [lora] in the run config, or no model config.json to list its layers from",
    needs=("run", "model_config"),
)
def probe_lora_modules(facts, run, model) -> dict[str, Any] | None:
    if run.lora is None or not isinstance(model.get("config"), dict):
        return None
    request, folder = build_request(run, model)
    return cached("lora-modules", {**request, "config": None}, folder_files(folder), lambda: _child(request))


def build_request(run, model: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """What a child process builds the run's model from (its config.json, trust_remote_code, [lora] or None), and
    the model's folder, whose files key the probe cache."""
    path = Path(model["path"])
    folder = path.parent if path.name == "config.json" else path
    lora = run.lora
    request = {
        "config": str(folder / "config.json"),
        "trust": run.model.trust_remote_code,
        "lora": None
        if lora is None
        else {
            "r": lora.r,
            "target_modules": lora.target_modules
            if isinstance(lora.target_modules, str)
            else list(lora.target_modules),
            "modules_to_save": list(lora.modules_to_save),
            "use_dora": lora.use_dora,
        },
    }
    return request, folder


def _child(request: dict[str, Any]) -> dict[str, Any]:
    return in_child("sftdoctor.facts.lora_modules", request, "listing the model's layers on the meta device", TIMEOUT_S)


def pattern(name: str) -> str:
    return NUMBER.sub("*", name)


def _listed(config: dict[str, Any], folder: str, trust: bool, lora: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=trust) if trust else None
    if cfg is None:
        fields = {k: v for k, v in config.items() if not k.startswith("_")}
        model_type = fields.pop("model_type", None)
        if not isinstance(model_type, str):
            raise ValueError("config.json has no model_type naming the architecture")
        cfg = transformers.AutoConfig.for_model(model_type, **fields)

    def build():
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust)

    model = build()
    output = model.get_output_embeddings()
    linear, modules = {}, {}
    for name, module in model.named_modules():
        if not name:
            continue
        leaf = name.rsplit(".", 1)[-1]  # what modules_to_save names; its parameters are trained in full
        if not leaf.isdecimal():
            modules[leaf] = modules.get(leaf, 0) + sum(p.numel() for p in module.parameters())
        shape = _linear_shape(module)
        if shape is None:
            continue
        entry = linear.setdefault(
            pattern(name),
            {"pattern": pattern(name), "count": 0, "in": shape[0], "out": shape[1], "output": module is output},
        )
        entry["count"] += 1
    parameters = sum(p.numel() for p in model.parameters())
    out = {
        "linear": sorted(linear.values(), key=lambda e: e["pattern"]),
        "modules": dict(sorted(modules.items())),
        "parameters": parameters,
        "model_type": cfg.model_type,
    }
    if lora is not None:
        out["adapters"] = adapters(build, lora)
    return out


def adapters(build, lora: dict[str, Any]) -> dict[str, Any]:
    """What peft itself builds on the meta-device model for these settings (no weights: the adapters' own
    matrices are small): the trainable parameters, the layers it wrapped, and the target names it matched
    to nothing. peft's own rules hold: embeddings, MoE experts converted to target_parameters
    (transformers 5), modules_to_save left without an adapter, layer-indexed names."""
    import warnings

    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        return {"error": "peft is not installed"}
    names = lora["target_modules"]

    def wrap(targets):
        config = LoraConfig(
            r=lora["r"],
            target_modules=targets,
            modules_to_save=lora["modules_to_save"] or None,
            use_dora=lora["use_dora"],
            task_type="CAUSAL_LM",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecations and "pattern keys did not match": not the user's
            return get_peft_model(build(), config)

    try:
        wrapped_model = wrap(names)
    except ValueError as exc:  # peft's "Target modules ... not found in the base model"
        return {
            "trainable": 0,
            "wrapped": [],
            "unmatched": [] if isinstance(names, str) else list(names),
            "error": (str(exc).strip().splitlines() or [""])[0][:300],
        }
    tuner = wrapped_model.base_model
    targeted = list(getattr(tuner, "targeted_module_names", [])) + list(getattr(tuner, "targeted_parameter_names", []))
    groups: dict[str, int] = {}
    for name in targeted:
        groups[pattern(name)] = groups.get(pattern(name), 0) + 1
    trainable = sum(p.numel() for p in wrapped_model.parameters() if p.requires_grad)
    return {
        "settings": lora,
        "trainable": trainable,
        "wrapped": [{"pattern": k, "count": v} for k, v in sorted(groups.items())],
        "unmatched": [] if isinstance(names, str) else _unmatched(names, targeted, wrap, trainable),
    }


def _trainable(wrap, names: list[str]) -> int:
    try:
        return sum(p.numel() for p in wrap(names).parameters() if p.requires_grad) if names else 0
    except ValueError:
        return 0


def _unmatched(names: list[str], targeted: list[str], wrap, trainable: int) -> list[str]:
    """The names that wrap nothing: by peft's suffix rule on what it wrapped, and, for a name that rule does not
    place (MoE names peft converts, e.g. Mixtral's w1/w2/w3 into fused experts), by whether leaving it out
    changes what peft trains."""

    def placed(name: str) -> bool:
        return any(t == name or t.endswith("." + name) for t in targeted)

    return [
        name for name in names if not placed(name) and _trainable(wrap, [n for n in names if n != name]) == trainable
    ]


def _linear_shape(module) -> tuple[int, int] | None:
    """(in, out) of a layer peft's LoRA wraps as a linear one: torch.nn.Linear and GPT-2's Conv1D."""
    import torch

    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "weight"):
        rows, cols = module.weight.shape  # Conv1D stores (in, out)
        return int(rows), int(cols)
    return None


def list_modules(path: str, trust: bool, lora: dict[str, Any] | None = None) -> dict[str, Any]:
    config = json.loads(Path(path).read_text(encoding="utf-8"))
    folder = str(Path(path).parent)
    key = next((k for k in ("num_hidden_layers", *ALIASES["num_hidden_layers"]) if k in config), None)
    layers = config.get(key) if key else None
    if not (isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_BUILT_LAYERS) or trust:
        return _listed(config, folder, trust, lora)
    one, two = (_listed(_with_layers(config, key, n), folder, False, lora) for n in (1, 2))

    def grown(a: int, b: int) -> int:
        return a + (layers - 1) * (b - a)

    for kind in ("linear", "wrapped"):
        small = {
            e["pattern"]: e["count"] for e in (one.get("adapters", {}) if kind == "wrapped" else one).get(kind, [])
        }
        for entry in (two.get("adapters", {}) if kind == "wrapped" else two).get(kind, []):
            entry["count"] = grown(small.get(entry["pattern"], 0), entry["count"])
    two["parameters"] = grown(one["parameters"], two["parameters"])
    two["modules"] = {k: grown(one["modules"].get(k, 0), v) for k, v in two["modules"].items()}
    if "trainable" in two.get("adapters", {}):
        two["adapters"]["trainable"] = grown(one["adapters"]["trainable"], two["adapters"]["trainable"])
    return two


if __name__ == "__main__":
    serve(lambda asked: list_modules(asked["config"], asked.get("trust", False), asked.get("lora")))
