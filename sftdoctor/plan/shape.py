"""What the memory and time of a run depend on, read from a model's config.json.

The exact parameter count comes from building the model on PyTorch's meta device (no weights are
loaded or allocated; transformers 5.x `AutoModelForCausalLM.from_config` under `torch.device("meta")`),
so it is right for any architecture transformers knows, tied embeddings included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shape:
    model_type: str
    hidden: int  # h
    layers: int  # L
    intermediate: int  # I, the MLP's inner width
    vocab: int  # V
    heads: int  # attention heads
    kv_heads: int  # key/value heads (GQA)
    head_dim: int
    parameters: int  # exact, from the meta-device model
    largest_layer: int  # parameters of the largest single tensor (ZeRO-3 gathers it whole)

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal configs nest it under `text_config`)."""
    return config.get("text_config") or config


def count_parameters(config: dict[str, Any]) -> tuple[int, int]:
    """(all parameters, the largest single parameter tensor) of the model `config` describes."""
    import torch
    import transformers

    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if not model_type:
        raise ValueError("config.json has no model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    sizes = [p.numel() for p in model.parameters()]  # a tied embedding is one parameter, counted once
    return sum(sizes), max(sizes)


def shape_of(config: dict[str, Any]) -> Shape:
    params, largest = count_parameters(config)
    text = text_config(config)
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    head_dim = text.get("head_dim") or hidden // heads
    return Shape(model_type=config.get("model_type", "?"), hidden=hidden, layers=text["num_hidden_layers"],
                 intermediate=text.get("intermediate_size") or 4 * hidden, vocab=text["vocab_size"], heads=heads,
                 kv_heads=text.get("num_key_value_heads") or heads, head_dim=head_dim,
                 parameters=params, largest_layer=largest)


def probe_model_shape(facts) -> dict[str, Any] | None:
    """The model's shape for memory planning, when there are GPUs to plan for (it imports torch and
    transformers, which `sftdoctor check` on a box without GPUs never needs)."""
    summary, gpus = facts.get("model_config"), facts.get("gpus") or {}
    if not summary or not gpus.get("devices"):
        return None
    import json
    from dataclasses import asdict
    from pathlib import Path

    config = json.loads(Path(summary["path"]).read_text(encoding="utf-8"))
    return asdict(shape_of(config))
