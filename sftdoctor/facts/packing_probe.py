"""Does packing keep samples apart on the installed stack? Prove it, don't trust a version table.

Builds a tiny model of the run's architecture (config.json shrunk to two small layers, random
weights), feeds two samples alone and then packed exactly as TRL's padding-free collator packs
them (one row, position_ids restarting at each sample, no attention mask, use_cache=False as
SFTTrainer.compute_loss sets it), and compares each sample's logits. Runs in a child process so
the caller imports neither torch nor CUDA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached, folder_files

TIMEOUT_S = 600
TOLERANCE = 1e-4  # float32 logits of a 2-layer model: equal up to kernel rounding when isolated


@fact(
    "packing_probe",
    "packed batches built by the real collator: isolated or not",
    inputs=RUN_CONFIG,
    why_missing="packing is off, or no run config / model config to probe",
    needs=("run", "model_config"),
)
def probe_packing(facts, run, model) -> dict[str, Any] | None:
    if run.training.packing is False:
        return None
    from sftdoctor.run.resolve import attn_implementation  # past the run config: `facts` alone needs no resolver

    attn = attn_implementation(run, facts.get("gpus"), facts.get("packages") or {})
    request = {"config": model["path"], "attn_implementation": attn, "trust_remote_code": run.model.trust_remote_code}
    path = Path(model["path"])
    folder = path.parent if path.name == "config.json" else path
    return cached("packing", {**request, "config": None}, folder_files(folder), lambda: _child(request))


def _child(request: dict[str, Any]) -> dict[str, Any]:
    answer = in_child("sftdoctor.facts.packing_probe", request, "the packing probe", TIMEOUT_S)
    if "error" in answer:  # not judged: the packing check says so
        return {"isolated": None, "attn_implementation": request["attn_implementation"], **answer}
    return answer


def shrink(config, vocab_size: int | None = 512) -> None:
    """Same architecture, two small layers: keeps the model type, attention and MLP kinds, GQA ratio.
    `vocab_size=None` keeps the vocabulary (to train with the real tokenizer)."""
    heads = 4
    ratio = max(
        1,
        getattr(config, "num_attention_heads", heads) // max(1, getattr(config, "num_key_value_heads", heads) or heads),
    )
    for name, value in (
        ("num_hidden_layers", 2),
        ("hidden_size", 64),
        ("intermediate_size", 128),
        ("num_attention_heads", heads),
        ("num_key_value_heads", max(1, heads // ratio)),
        ("head_dim", 16),
        ("vocab_size", vocab_size),
        ("max_window_layers", 2),
    ):
        if hasattr(config, name) and value is not None:
            setattr(config, name, value)
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:2]
    config.use_cache = False


def measure(request: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # TRL 1.16's padding-free collator

    attn = request["attn_implementation"]
    device = "cuda" if attn.startswith("flash") else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        return {"isolated": None, "attn_implementation": attn, "error": f"{attn} needs a CUDA GPU to be probed"}
    path = Path(request["config"])
    config = AutoConfig.from_pretrained(
        str(path.parent if path.name == "config.json" else path),
        trust_remote_code=request.get("trust_remote_code", False),
    )
    shrink(config)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype).to(device).eval()
    samples = [torch.randint(3, 500, (n,)).tolist() for n in (7, 5, 9)]
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    batch = collator([{"input_ids": ids} for ids in samples])
    batch.pop("labels")
    diff = max_packed_diff(model, samples, batch, device)
    tolerance = TOLERANCE if dtype == torch.float32 else 2e-2
    return {
        "isolated": diff <= tolerance,
        "max_abs_diff": diff,
        "tolerance": tolerance,
        "attn_implementation": attn,
        "model_type": config.model_type,
        "device": device,
        "batch_keys": sorted(batch),
    }


def max_packed_diff(model, samples: list[list[int]], batch: dict[str, Any], device: str) -> float:
    """Largest |logit difference| between each sample packed in `batch` and the same sample alone."""
    import torch

    with torch.no_grad():
        inputs = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        packed = model(**inputs, use_cache=False).logits[0]
        diff, start = 0.0, 0
        for ids in samples:
            alone = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0]
            diff = max(diff, (packed[start : start + len(ids)] - alone).abs().max().item())
            start += len(ids)
    return diff


if __name__ == "__main__":
    serve(measure)
