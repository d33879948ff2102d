"""The model's linear layers, as peft will see them, without loading a weight: the architecture built on
PyTorch's meta device from config.json, in a child process (so `check` never imports torch), kept in the
probe cache. LoRA's target_modules name these layers, and its trainable parameters are r x (in + out) of
each one it wraps.

Layer paths are grouped with every number replaced by `*` ("model.layers.*.self_attn.q_proj": one entry of
32 layers). A stack of more than MAX_BUILT_LAYERS layers is listed from one and two layers: each layer of such
a stack is alike, so its count is c1 + (layers - 1) x (c2 - c1).

    python -m sftdoctor.facts.lora_modules CONFIG.json [trust_remote_code]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from sftdoctor.facts.model_shape import MAX_BUILT_LAYERS, _with_layers
from sftdoctor.facts.probe_cache import cached, folder_files
from sftdoctor.run.shape import ALIASES

TIMEOUT_S = 300
NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


def probe_lora_modules(facts) -> dict[str, Any] | None:
    run, model = facts.get("run"), facts.get("model_config")
    if run is None or run.lora is None or not model or not isinstance(model.get("config"), dict):
        return None
    path = Path(model["path"])
    folder = path.parent if path.name == "config.json" else path
    trust = run.model.trust_remote_code
    return cached("lora-modules", {"trust_remote_code": trust}, folder_files(folder),
                  lambda: _child(str(folder / "config.json"), trust))


def _child(config: str, trust: bool) -> dict[str, Any]:
    try:
        proc = subprocess.run([sys.executable, "-m", "sftdoctor.facts.lora_modules", config, str(trust)],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"listing the model's layers on the meta device took over {TIMEOUT_S} s"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"listing the model's layers failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}"}


def pattern(name: str) -> str:
    return NUMBER.sub("*", name)


def _listed(config: dict[str, Any], folder: str, trust: bool) -> dict[str, Any]:
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=trust) if trust else None
    if cfg is None:
        fields = {k: v for k, v in config.items() if not k.startswith("_")}
        model_type = fields.pop("model_type", None)
        if not isinstance(model_type, str):
            raise ValueError("config.json has no model_type naming the architecture")
        cfg = transformers.AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust)
    output = model.get_output_embeddings()
    linear, modules = {}, {}
    for name, module in model.named_modules():
        if not name:
            continue
        leaf = name.rsplit(".", 1)[-1]  # what modules_to_save names; its parameters are trained in full
        if not leaf.isdigit():
            modules[leaf] = modules.get(leaf, 0) + sum(p.numel() for p in module.parameters())
        shape = _linear_shape(module)
        if shape is None:
            continue
        entry = linear.setdefault(pattern(name), {"pattern": pattern(name), "count": 0, "in": shape[0],
                                                  "out": shape[1], "output": module is output})
        entry["count"] += 1
    parameters = sum(p.numel() for p in model.parameters())
    return {"linear": sorted(linear.values(), key=lambda e: e["pattern"]), "modules": dict(sorted(modules.items())),
            "parameters": parameters, "model_type": cfg.model_type}


def _linear_shape(module) -> tuple[int, int] | None:
    """(in, out) of a layer peft's LoRA wraps as a linear one: torch.nn.Linear and GPT-2's Conv1D."""
    import torch

    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "weight"):
        rows, cols = module.weight.shape  # Conv1D stores (in, out)
        return int(rows), int(cols)
    return None


def list_modules(path: str, trust: bool) -> dict[str, Any]:
    config = json.loads(Path(path).read_text(encoding="utf-8"))
    folder = str(Path(path).parent)
    key = next((k for k in ("num_hidden_layers", *ALIASES["num_hidden_layers"]) if k in config), None)
    layers = config.get(key) if key else None
    if not (isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_BUILT_LAYERS) or trust:
        return _listed(config, folder, trust)
    one, two = (_listed(_with_layers(config, key, n), folder, False) for n in (1, 2))
    counts = {e["pattern"]: e["count"] for e in one["linear"]}
    for entry in two["linear"]:
        c1 = counts.get(entry["pattern"], 0)
        entry["count"] = c1 + (layers - 1) * (entry["count"] - c1)
    two["parameters"] = one["parameters"] + (layers - 1) * (two["parameters"] - one["parameters"])
    two["modules"] = {k: one["modules"].get(k, 0) + (layers - 1) * (v - one["modules"].get(k, 0))
                      for k, v in two["modules"].items()}
    return two


if __name__ == "__main__":
    try:
        print(json.dumps(list_modules(sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "True")))
    except Exception as exc:  # reported as a fact, never a crash of the caller
        print(json.dumps({"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"}))
