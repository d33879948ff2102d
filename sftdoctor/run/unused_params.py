"""What kind of parameter a name is, for the trainable parameters that a step leaves without a gradient: the
probe that finds them before a run (facts.unused_params), the check that judges them (checks.ddp) and the log
triage that reads DDP's list of them (`Parameters which did not receive grad for rank N: ...`) name them alike.

The kinds are read from parameter names as transformers, peft and the VLM/MoE code that users paste write them
(`model.vision_tower.…`, `visual.blocks.…`, `lm_q.vpm.…`, `…mlp.experts.3.down_proj.weight`,
`…q_proj.lora_A.default.weight`, `…modules_to_save.default.weight`, `model.mtp_layers.…`)."""

from __future__ import annotations

import re

# What a parameter is, read from its name: the module it belongs to, and whether it is an adapter peft added.
PLACES = (
    (
        "vision tower",
        re.compile(
            r"(?:^|\.)(?:vision_tower|vision_model|visual|vision|vpm|vit|image_encoder|"
            r"multi_modal_projector|mm_projector|vision_projection|patch_embed\w*)(?:\.|$)"
        ),
    ),
    ("audio tower", re.compile(r"(?:^|\.)(?:audio_tower|audio_model|audio|speech_encoder|whisper)(?:\.|$)")),
    ("MoE experts", re.compile(r"(?:^|\.)(?:experts?|shared_experts?|block_sparse_moe)(?:\.|$)")),
    ("multi-token prediction layers", re.compile(r"(?:^|\.)(?:mtp\w*|nextn\w*)(?:\.|$)")),
)
ADDED = (
    ("LoRA adapters", re.compile(r"(?:^|\.)lora_(?:A|B|embedding_A|embedding_B|magnitude_vector)\b")),
    ("modules_to_save copies", re.compile(r"(?:^|\.)modules_to_save\.")),
)
NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


def kind(name: str) -> str:
    """What parameter `name` is: "vision tower", "LoRA adapters", "LoRA adapters in the vision tower", ...,
    or "other" when its name says nothing known."""
    place = next((label for label, found in PLACES if found.search(name)), None)
    added = next((label for label, found in ADDED if found.search(name)), None)
    if added and place:
        return f"{added} in the {place}"
    return added or place or "other"


def kinds(names) -> list[str]:
    """The kinds of `names`, each once, in first-seen order ("other" last)."""
    found = list(dict.fromkeys(kind(n) for n in names))
    return [k for k in found if k != "other"] + (["other"] if "other" in found else [])


def pattern(name: str) -> str:
    """`model.layers.3.mlp.experts.7.w1.weight` -> `model.layers.*.mlp.experts.*.w1.weight`."""
    return NUMBER.sub("*", name)


def grouped(names) -> list[dict]:
    """[{"pattern", "count", "kind"}] in first-seen order: a stack of like layers is one entry."""
    groups: dict[str, dict] = {}
    for name in names:
        entry = groups.setdefault(pattern(name), {"pattern": pattern(name), "count": 0, "kind": kind(name)})
        entry["count"] += 1
    return list(groups.values())
