"""The embedding rows of the tokens a run's chat template trains on, read from the base checkpoint.

Base models released before their chat template often never saw its tokens (`<|im_start|>`, `<|eot_id|>`,
added tokens): their rows are still all zeros, so the model starts each turn from nothing, the loss on them
starts at noise and the first updates can blow up. Which tokens: the tokenizer's added tokens (tokenizer.json
`added_tokens`) that the chat template writes, and its EOS and BOS tokens (not the pad token: padding is
masked, and embeddings built with a padding_idx start that row at zero). Their rows, and for
reference the rows of 256 ordinary tokens spread over the vocabulary, are read with safetensors' slices in a
child process (torch): a 70B checkpoint's embedding is never loaded whole.

Which rows are untrained is decided once, in sftdoctor.run.embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached, folder_files
from sftdoctor.facts.tokenizer import read_template, special_tokens, tokenizer_folder

REFERENCE_ROWS = 256
TIMEOUT_S = 300
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight",
                      "embed_in.weight")
OUTPUT_SUFFIXES = ("lm_head.weight", "embed_out.weight", "output.weight")


def probe_token_rows(facts) -> dict[str, Any] | None:
    run, model = facts.get("run"), facts.get("model_config")
    if run is None or run.model.weights != "pretrained" or not model:
        return None
    path = Path(model["path"])
    folder = path.parent if path.name == "config.json" else path
    tensors = weight_files(folder)
    tokens_folder = tokenizer_folder(run.model.tokenizer or run.model.path)
    if not tensors or tokens_folder is None:
        return None
    asked = template_tokens(tokens_folder, Path(run.model.chat_template) if run.model.chat_template else None)
    if not asked:
        return None
    request = {"files": [str(p) for p in tensors], "tokens": asked}
    return cached("token-rows", {"tokens": asked}, [*folder_files(folder), *tensors],
                  lambda: in_child("sftdoctor.facts.token_rows", request, "reading the embedding rows", TIMEOUT_S))


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files (an index names its shards); [] when it has none."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            return []
        return [folder / s for s in shards if (folder / s).is_file()]
    return [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else []


def template_tokens(folder: Path, chat_template: Path | None) -> dict[str, int]:
    """{token: id} of the added tokens the chat template writes, and the EOS and BOS tokens."""
    try:
        added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
    except (OSError, ValueError, AttributeError):
        return {}
    ids = {t["content"]: t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("content"), str)
           and isinstance(t.get("id"), int)}
    template = chat_template.read_text(encoding="utf-8", errors="replace") if chat_template else read_template(folder)
    named = set(special_tokens(folder).get(k) for k in ("eos_token", "bos_token"))  # a pad row is masked out anyway
    return {token: i for token, i in ids.items() if (template and token in template) or token in named}


def read_rows(files: list[str], tokens: dict[str, int]) -> dict[str, Any]:
    """In the child: each token's row statistics, input embedding and (untied) output head, and the median
    norm of ordinary rows."""
    import torch
    from safetensors import safe_open

    found: dict[str, Any] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                kind = "input" if name.endswith(EMBEDDING_SUFFIXES) else "output" if name.endswith(OUTPUT_SUFFIXES) else None
                if kind and kind not in found:
                    found[kind] = _rows(f.get_slice(name), tokens, torch)
    if "input" not in found:
        return {"error": "no input embedding among the checkpoint's tensors (" + ", ".join(EMBEDDING_SUFFIXES) + ")"}
    return found


def _rows(table, tokens: dict[str, int], torch) -> dict[str, Any]:
    vocab = table.get_shape()[0]

    def row(i: int):
        return table[i:i + 1].to(torch.float32)[0]

    picked = [round(k * (vocab - 1) / (REFERENCE_ROWS - 1)) for k in range(REFERENCE_ROWS)]
    ordinary = [i for i in dict.fromkeys(picked) if i not in set(tokens.values())]
    norms = sorted(float(row(i).norm()) for i in ordinary)
    median = norms[len(norms) // 2] if norms else 0.0
    rows = {}
    for token, i in tokens.items():
        if not 0 <= i < vocab:
            rows[token] = {"id": i, "outside": vocab}
            continue
        values = row(i)
        rows[token] = {"id": i, "max_abs": float(values.abs().max()), "norm": float(values.norm())}
    return {"rows": rows, "median_norm": median, "vocab": vocab}


if __name__ == "__main__":
    serve(lambda asked: read_rows(asked["files"], asked["tokens"]))
