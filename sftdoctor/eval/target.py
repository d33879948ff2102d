"""What `sftdoctor eval TARGET` evaluates: a run directory (its final model: the adapter or the full model),
a checkpoint, a model folder, or a hub id; resolved without importing the training stack, loaded in the
command that needs it.

An adapter (peft's adapter_config.json) is loaded onto the base its config names (sftdoctor writes the
run's base there: the model path, or RUN_DIR/base for a random-init base) and merged in memory, so the
harness sees one plain model with the adapter's exact outputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sftdoctor.errors import InputError
from sftdoctor.facts.configs import hub_cache_config, is_hub_id, read_json_object

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class Target:
    given: str  # as the user wrote it
    path: str  # the folder (or hub id) that is loaded
    kind: str  # "model" | "adapter" | "hub"
    run_dir: Path | None  # the run it belongs to, if any
    base: str | None  # an adapter's base
    tokenizer: str  # where its tokenizer is read from

    def to_json(self) -> dict:
        return {
            "given": self.given,
            "path": self.path,
            "kind": self.kind,
            "base": self.base,
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "tokenizer": self.tokenizer,
        }


def resolve_target(given: str, option: str = "TARGET") -> Target:
    path = Path(given)
    if path.is_dir():
        run_dir = (
            path
            if (path / "resolved.json").is_file()
            else (path.parent if (path.parent / "resolved.json").is_file() else None)
        )
        folder = path / "final" if path == run_dir else path
        if path == run_dir and not folder.is_dir():
            raise InputError(
                given,
                "a run directory without final/ (the run has not finished): give one of its "
                "checkpoint-N folders instead",
                key=option,
            )
        return _folder(given, folder, run_dir, option)
    if is_hub_id(given):
        if hub_cache_config(given) is None:
            raise InputError(given, "not a folder here and not in the local Hugging Face cache", key=option)
        return Target(given, given, "hub", None, None, given)
    raise InputError(given, "no such model folder, run directory or cached hub id", key=option)


def _folder(given: str, folder: Path, run_dir: Path | None, option: str) -> Target:
    adapter = folder / "adapter_config.json"
    if adapter.is_file():
        base = read_json_object(adapter, "peft adapter_config.json").get("base_model_name_or_path")
        if not isinstance(base, str) or not base:
            raise InputError(adapter, "names no base model (base_model_name_or_path)")
        return Target(given, str(folder), "adapter", run_dir, base, _tokenizer(folder, run_dir, base))
    if not (folder / "config.json").is_file():
        raise InputError(
            given, "a folder with neither config.json (a model) nor adapter_config.json (an adapter)", key=option
        )
    read_json_object(folder / "config.json", "model config.json")  # before minutes of loading, not after
    return Target(given, str(folder), "model", run_dir, None, _tokenizer(folder, run_dir, str(folder)))


def _tokenizer(folder: Path, run_dir: Path | None, fallback: str) -> str:
    """The folder's own tokenizer (sftdoctor saves it into final/ and checkpoints), else the run's."""
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return str(folder)
    if run_dir is not None:
        try:
            return json.loads((run_dir / "resolved.json").read_text(encoding="utf-8"))["tokenizer_path"]
        except (OSError, ValueError, KeyError):
            pass
    return fallback


def load(target: Target, device: str, dtype: str = "auto"):
    """(model, tokenizer) ready for the harness: an adapter merged onto its base in memory."""
    import torch
    from transformers import AutoTokenizer

    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(target.tokenizer)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(target.tokenizer, f"its tokenizer cannot be loaded ({_first_line(exc)})") from None
    from safetensors import SafetensorError  # a cut or corrupt .safetensors file

    try:
        model = _model(target, torch_dtype)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as exc:  # config, weights, adapter
        raise InputError(target.path, f"cannot be loaded ({_first_line(exc)})") from None
    return model.to(device).eval(), tokenizer


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


def _model(target: Target, torch_dtype):
    from transformers import AutoModelForCausalLM

    if target.kind == "adapter":
        import warnings

        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(target.base, dtype=torch_dtype)
        with warnings.catch_warnings():  # peft 0.21 reads transformers 5.24's deprecated is_gradient_checkpointing
            warnings.filterwarnings(
                "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            model = PeftModel.from_pretrained(base, target.path).merge_and_unload()
        return model
    return AutoModelForCausalLM.from_pretrained(target.path, dtype=torch_dtype)
