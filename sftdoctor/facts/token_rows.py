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
import os
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, read_text, regular_file
from sftdoctor.facts.catalogue import MODEL, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached, folder_files
from sftdoctor.facts.tokenizer import read_template, special_tokens, tokenizer_folder

REFERENCE_ROWS = 256
TIMEOUT_S = 300
EMBEDDING_SUFFIXES = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "tok_embeddings.weight",
    "embed_in.weight",
)
OUTPUT_SUFFIXES = ("lm_head.weight", "embed_out.weight", "output.weight")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")  # safetensors' names of what a trained row holds


@fact(
    "token_rows",
    "the base checkpoint's embedding rows of the tokens the chat template writes (safetensors slices)",
    inputs=MODEL,
    why_missing="needs a run config whose model has pretrained safetensors weights here and a chat template that "
    "writes added tokens",
    needs=("run", "model_config"),
)
def probe_token_rows(facts, run, model) -> dict[str, Any] | None:
    if run.model.weights != "pretrained":
        return None
    path = Path(model["path"])
    folder = path.parent if path.name == "config.json" else path
    tokens_folder = tokenizer_folder(run.model.tokenizer or run.model.path)
    if tokens_folder is None:
        return None
    asked = template_tokens(tokens_folder, Path(run.model.chat_template) if run.model.chat_template else None)
    if not asked:
        return None
    tensors = weight_files(folder)
    if isinstance(tensors, dict) or not tensors:  # a file that cannot be read: said, never skipped
        return tensors or None
    request = {"files": [str(p) for p in tensors], "tokens": asked}
    return cached(
        "token-rows",
        {"tokens": asked},
        [*folder_files(folder), *tensors],
        lambda: in_child("sftdoctor.facts.token_rows", request, "reading the embedding rows", TIMEOUT_S),
    )


def weight_files(folder: Path) -> list[Path] | dict[str, str]:
    """The checkpoint's safetensors files that hold its embedding and output head (an index names its shards);
    [] when it has none; {"error", "file"} when one of them is missing or not a regular file (a FIFO, a device,
    unreadable): never opened, never silently left out."""
    index = folder / "model.safetensors.index.json"
    if not os.path.lexists(index):
        single = folder / "model.safetensors"
        return _readable([single]) if os.path.lexists(single) else []
    try:
        weight_map = json.loads(read_text(index, "safetensors index"))["weight_map"]
        names = {str(k): str(v) for k, v in weight_map.items()}
    except InputError as exc:
        return {"error": exc.message, "file": str(index)}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"error": "expected a JSON object with a 'weight_map' object", "file": str(index)}
    held = {shard for name, shard in names.items() if name.endswith(EMBEDDING_SUFFIXES + OUTPUT_SUFFIXES)}
    return _readable([folder / shard for shard in sorted(held or set(names.values()))])


def _readable(files: list[Path]) -> list[Path] | dict[str, str]:
    for file in files:
        try:
            regular_file(file, "safetensors shard")
        except InputError as exc:
            return {"error": exc.message, "file": str(file)}
    return files


def template_tokens(folder: Path, chat_template: Path | None) -> dict[str, int]:
    """{token: id} of the added tokens the chat template writes, and the EOS and BOS tokens."""
    file = folder / "tokenizer.json"
    if not os.path.lexists(file):
        return {}
    try:
        added = json.loads(read_text(file, "tokenizer file")).get("added_tokens") or []
    except (ValueError, AttributeError):
        return {}
    ids = {
        t["content"]: t["id"]
        for t in added
        if isinstance(t, dict)
        and isinstance(t.get("content"), str)
        and isinstance(t.get("id"), int)
        and not isinstance(t.get("id"), bool)
    }
    template = read_text(chat_template, "chat template") if chat_template else read_template(folder)
    named = set(special_tokens(folder).get(k) for k in ("eos_token", "bos_token"))  # a pad row is masked out anyway
    return {token: i for token, i in ids.items() if (template and token in template) or token in named}


def read_rows(files: list[str], tokens: dict[str, int]) -> dict[str, Any]:
    """In the child: each token's row statistics, input embedding and (untied) output head, and the median
    norm of ordinary rows. A file that cannot be read is named with why: its rows are not judged."""
    import torch
    from safetensors import safe_open

    found: dict[str, Any] = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    kind = (
                        "input"
                        if name.endswith(EMBEDDING_SUFFIXES)
                        else "output"
                        if name.endswith(OUTPUT_SUFFIXES)
                        else None
                    )
                    if kind and kind not in found:
                        found[kind] = {**_rows(f.get_slice(name), name, tokens, torch), "tensor": name, "file": file}
        except Exception as exc:  # a header that lies, a dtype torch cannot read, a truncated file
            return {"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}", "file": file}
    if "input" not in found:
        return {
            "error": "no input embedding among the checkpoint's tensors (" + ", ".join(EMBEDDING_SUFFIXES) + ")",
            "file": files[0] if len(files) == 1 else ", ".join(files),
        }
    return found


def _rows(table, name: str, tokens: dict[str, int], torch) -> dict[str, Any]:
    shape, dtype = table.get_shape(), table.get_dtype()
    if len(shape) != 2:
        raise ValueError(f"{name} has shape {list(shape)}, not a (rows, width) matrix")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} is {dtype}, not a floating-point type")
    vocab = shape[0]

    def stats(i: int) -> dict[str, Any]:
        values = table[i : i + 1].to(torch.float64)[0]
        bad = int((~torch.isfinite(values)).sum())
        if bad:
            return {"id": i, "non_finite": bad}
        largest = float(values.abs().max()) if values.numel() else 0.0
        norm = largest * float((values / largest).norm()) if largest > 0 else 0.0  # scaled: no overflow
        return {"id": i, "max_abs": largest, "norm": norm}

    picked = [round(k * (vocab - 1) / (REFERENCE_ROWS - 1)) for k in range(REFERENCE_ROWS)] if vocab else []
    ordinary = [stats(i) for i in dict.fromkeys(picked) if i not in set(tokens.values())]
    norms = sorted(r["norm"] for r in ordinary if "norm" in r)
    rows = {token: stats(i) if 0 <= i < vocab else {"id": i, "outside": vocab} for token, i in tokens.items()}
    return {
        "rows": rows,
        "median_norm": norms[len(norms) // 2] if norms else 0.0,
        "vocab": vocab,
        "non_finite_rows": [r["id"] for r in ordinary if "non_finite" in r],
    }


if __name__ == "__main__":
    serve(lambda asked: read_rows(asked["files"], asked["tokens"]))
