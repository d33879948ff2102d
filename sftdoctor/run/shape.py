"""What the memory and time of a run depend on, read from a model's config.json.

For the Llama/Qwen/Mistral families (gated MLP decoders) the parameter count is closed-form and exact:
equal to the model transformers 5.24 builds on the meta device (tests/run/test_shape.py compares them on
real configs). Other architectures are counted on the meta device in a child process (facts/model_shape.py),
so no command that only checks ever imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Decoders whose layer is attention + gated MLP (gate, up, down) + two norms, as transformers builds them.
GATED_MLP = {"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "olmo2", "granite", "cohere"}
NEEDED = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads")


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
    parameters: int  # exact
    largest_layer: int  # parameters of the largest single tensor (ZeRO-3 gathers it whole)
    counted_by: str = "closed form"  # or "meta device"

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal configs nest it under `text_config`)."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


# Older and non-Llama configs name the same dimensions differently (GPT-2: n_embd, n_layer, n_head, n_inner;
# T5/OPT-style: d_model, num_layers, num_heads, ffn_dim), as their transformers classes' attribute_map says.
ALIASES = {
    "hidden_size": ("n_embd", "d_model"),
    "num_hidden_layers": ("n_layer", "num_layers"),
    "num_attention_heads": ("n_head", "num_heads"),
    "intermediate_size": ("n_inner", "ffn_dim"),
}


def _canonical(config: dict[str, Any]) -> dict[str, Any]:
    out = dict(config)
    for name, aliases in ALIASES.items():
        if out.get(name) is None:
            out[name] = next((config[a] for a in aliases if config.get(a) is not None), None)
    return out


def _positive_ints(config: dict[str, Any], names: tuple[str, ...]) -> bool:
    return all(isinstance(config.get(k), int) and not isinstance(config.get(k), bool) and config[k] > 0 for k in names)


def dimension_problem(config: dict[str, Any]) -> str | None:
    """What makes config.json describe no model sftdoctor can size, naming the key; None when it is fine."""
    if not isinstance(config.get("model_type"), (str, type(None))):
        return f"model_type is {config['model_type']!r}; expected a string naming the architecture"
    text = _canonical(text_config(config))
    for name in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"):
        value = text.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return f"{name} is {value!r}; expected a positive integer"
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    for name in ("num_key_value_heads", "head_dim", "intermediate_size"):
        value = text.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            return f"{name} is {value!r}; expected a positive integer"
    kv = text.get("num_key_value_heads") or heads
    if heads % kv:
        return f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}"
    if not text.get("head_dim") and hidden % heads:
        return f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} (and no head_dim is given)"
    return None


def dimensions(config: dict[str, Any]) -> dict[str, int] | None:
    """h, L, I, V, heads, kv heads and head_dim, or None when config.json lacks them (see dimension_problem)."""
    if dimension_problem(config) is not None:
        return None
    text = _canonical(text_config(config))
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    return {
        "hidden": hidden,
        "layers": text["num_hidden_layers"],
        "intermediate": text.get("intermediate_size") or 4 * hidden,
        "vocab": text["vocab_size"],
        "heads": heads,
        "kv_heads": text.get("num_key_value_heads") or heads,
        "head_dim": text.get("head_dim") or hidden // heads,
    }


def closed_form(config: dict[str, Any]) -> Shape | None:
    """Exact shape of a gated-MLP decoder from config.json, without torch; None for other families.
    Qwen2 has q/k/v biases, `attention_bias`/`mlp_bias` add the others, Qwen3 a q/k RMSNorm per layer."""
    model_type = config.get("model_type")
    dims = dimensions(config)
    if (
        not isinstance(model_type, str)
        or model_type not in GATED_MLP
        or dims is None
        or not _positive_ints(config, NEEDED)
    ):
        return None
    h, layers, inter, vocab = dims["hidden"], dims["layers"], dims["intermediate"], dims["vocab"]
    q, kv = dims["heads"] * dims["head_dim"], dims["kv_heads"] * dims["head_dim"]
    attention = 2 * h * q + 2 * h * kv
    if config.get("attention_bias"):
        attention += q + 2 * kv + h
    elif model_type == "qwen2":
        attention += q + 2 * kv
    if model_type == "qwen3":
        attention += 2 * dims["head_dim"]
    mlp = 3 * h * inter + ((2 * inter + h) if config.get("mlp_bias") else 0)
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    params = layers * (attention + mlp + 2 * h) + embeddings + h
    return Shape(model_type=model_type, parameters=params, largest_layer=max(vocab * h, h * inter, h * q), **dims)


def from_counts(config: dict[str, Any], parameters: int, largest: int) -> Shape | None:
    """The shape with counts measured elsewhere (the meta-device model)."""
    dims = dimensions(config)
    if dims is None:
        return None
    return Shape(
        model_type=str(config.get("model_type", "?")),
        parameters=parameters,
        largest_layer=largest,
        counted_by="meta device",
        **dims,
    )
