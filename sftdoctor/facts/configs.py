"""The run's config files, read into facts: the trainer's TOML, the model's config.json, the DeepSpeed JSON.
No check opens a file: they read these facts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, InputErrors, loads_finite, parse_problem, read_text
from sftdoctor.facts.catalogue import DEEPSPEED, MODEL, RUN_CONFIG, fact
from sftdoctor.facts.packages import module_file
from sftdoctor.run.shape import NEEDED


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from a file, strictly: duplicate keys and comments are errors, as for
    transformers/accelerate, which read DeepSpeed and model configs with `json.load`; so is NaN or Infinity
    anywhere (json.load reads them, and the run would train with them)."""
    text = read_text(path, what)

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        for key in keys:
            if keys.count(key) > 1:
                raise InputError(
                    path, f"duplicate key: {what}s are read with json.load, which keeps only the last", key=key
                )
        return dict(pairs)

    try:
        data = loads_finite(text, path, object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise InputError(path, f"not valid JSON ({parse_problem(exc)}); expected a {what}") from None
    if not isinstance(data, dict):
        raise InputError(path, f"expected a JSON object ({what}), got {type(data).__name__}")
    return data


# ---------------------------------------------------------------- run config (TOML)


@fact(
    "run",
    "the run config (RunConfig)",
    inputs=RUN_CONFIG,
    why_missing="no run config given (--config)",
    is_object=False,
)
def probe_run_config(facts):
    """The typed run config (sftdoctor.run.RunConfig)."""
    if facts.inputs.config is None:
        return None
    from sftdoctor.run.config import load_run_config

    return load_run_config(facts.inputs.config)


@fact(
    "plan",
    "the run's settings, decided once (run.resolve's Plan)",
    inputs=RUN_CONFIG,
    why_missing="no run config given (--config)",
    is_object=False,
    needs=("run",),
)
def probe_plan(facts, run):
    """The run's settings, decided once by sftdoctor.run.decide from the run config and the other facts."""
    from sftdoctor.run import decide  # here, past the run config: a plain `check` imports no resolver

    return decide(run, facts)


# ---------------------------------------------------------------- model config.json

# transformers >= 4.56 (PR #39782) writes "dtype"; earlier versions wrote "torch_dtype", which
# v5 still reads (`dtype` wins when both are set). A config carrying "torch.bfloat16" or "auto" is refused
# (dtype_problem): transformers 5.24-5.25 cannot load it.
DTYPES = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "auto": "auto",
}
DTYPE_KEYS = ("dtype", "torch_dtype")
SUB_CONFIGS = ("text_config", "llm_config", "language_config")  # a multimodal model's language part
# what run.shape's closed form needs, and what the checks read beside it
_SHAPE_KEYS = (*NEEDED, "num_key_value_heads", "tie_word_embeddings", "max_position_embeddings")


def normalize_dtype(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return DTYPES.get(value.removeprefix("torch."), value.removeprefix("torch."))


def model_dtype(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(dtype, the key it came from). The top-level key is the model's; sub-configs of a
    multimodal model may carry their own (often null) and are consulted only as a fallback."""
    for key, value in _dtype_keys(config):
        if value is not None:
            return normalize_dtype(value), key
    return None, None


def _dtype_keys(config: dict[str, Any]) -> list[tuple[str, Any]]:
    """(key path, value) of every dtype key of the config and of its language sub-configs, the model's first."""
    found = [(key, config[key]) for key in DTYPE_KEYS if key in config]
    for sub in SUB_CONFIGS:
        if isinstance(config.get(sub), dict):
            found += [(f"{sub}.{key}", config[sub][key]) for key in DTYPE_KEYS if key in config[sub]]
    return found


# transformers 5.24-5.25 (PretrainedConfig.__init__) turn a config's dtype string into getattr(torch, value):
# "auto", "bf16" or "torch.bfloat16" there stop AutoConfig.from_pretrained with an AttributeError. These are the
# names that load and that a plan can price (run.memory.SAVED_DTYPES and torch's own aliases of them).
LOADABLE_DTYPES = ("bfloat16", "float16", "half", "float32", "float", "float64", "double")


def dtype_problem(config: dict[str, Any]) -> tuple[str, str] | None:
    """(key, what was expected) for the dtype transformers will read (`dtype`, else `torch_dtype`, at the top and
    in each language sub-config) when it is not a name it loads and a plan can price: a number, a list, an
    8-bit float, "auto". null is absent: the loader then reads the weights' own dtype."""
    levels = [("", config)] + [(f"{sub}.", config[sub]) for sub in SUB_CONFIGS if isinstance(config.get(sub), dict)]
    for prefix, level in levels:
        key = next((k for k in DTYPE_KEYS if level.get(k) is not None), None)
        value = level.get(key) if key else None
        if key is None or value in LOADABLE_DTYPES:
            continue
        said = f"expected one of {', '.join(LOADABLE_DTYPES)}, got {json.dumps(value)[:100]}"
        if isinstance(value, str) and "float8" in value:
            said += (
                "; an fp8 checkpoint keeps its 16-bit dtype here and declares fp8 in quantization_config "
                "(as DeepSeek-V3's does)"
            )
        elif isinstance(value, str):
            said += f" (transformers reads it as torch.{value} and stops with an AttributeError)"
        return prefix + key, said
    return None


def summarize_model_config(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    if found := dtype_problem(config):
        raise InputError(path, found[1], key=found[0])
    dtype, key = model_dtype(config)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    shape = {k: config.get(k, text.get(k)) for k in _SHAPE_KEYS if k in config or k in text}
    return {
        "path": str(path),
        "model_type": config.get("model_type"),
        "architectures": config.get("architectures"),
        "transformers_version": config.get("transformers_version"),
        "dtype": dtype,
        "dtype_key": key,
        "raw_keys": sorted(config),
        **shape,
        "config": config,  # the whole config.json: the model's shape is computed from it
    }


def is_hub_id(path: str) -> bool:
    """ "org/name" that is not a local path: transformers looks it up on the Hugging Face hub."""
    return not Path(path).exists() and path.count("/") == 1 and not path.startswith((".", "/", "~"))


def hub_unreachable(model_id: str, timeout_s: float = 10.0) -> str | None:
    """Why the ranks could not download `model_id` (not cached here), or None when the hub has it for us.
    Asked once, before the checks (facts.launch_inputs), instead of every rank finding out after its imports."""
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:
        return None  # transformers brings huggingface_hub; without it the workers say what is missing
    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).model_info(model_id, timeout=timeout_s)  # read now
    except GatedRepoError:
        return "it is gated: accept its licence on huggingface.co and log in (hf auth login), or give a local folder"
    except RepositoryNotFoundError:
        return "the hub has no such model (or it is private: log in with hf auth login)"
    except Exception as exc:  # noqa: BLE001 - any network failure (httpx, requests, OSError) means the same here
        return (
            f"the Hugging Face hub cannot be reached ({type(exc).__name__}: {str(exc)[:120]}): download it where "
            "there is network (hf download ID) and copy the cache, or give a local folder"
        )
    return None


def hub_cache_dir() -> str:
    """The Hugging Face hub cache, as huggingface_hub finds it, read now (its own constant is read at import)."""
    return os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub"
    )


def hub_cache_config(model_id: str) -> Path | None:
    """config.json of a hub model already in the local Hugging Face cache, if any."""
    snapshots = Path(hub_cache_dir(), "models--" + model_id.replace("/", "--"), "snapshots")
    if not snapshots.is_dir():
        return None
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0] if found else None


def resolve_model_config(path: Path) -> Path:
    return path / "config.json" if path.is_dir() else path


def _given_or_named(facts, field: str, named: Callable[[Any], Any]) -> Any:
    """The file given on the command line for the Inputs `field`, else the one the run config names (`named(run)`,
    None when it names none), else None."""
    path = getattr(facts.inputs, field)
    if path is None:
        run = facts.get("run")
        path = named(run) if run is not None else None
    return path


def _model_config_of(run) -> Path | None:
    """The config.json of the run's [model].path: the local folder, or a hub id's in the local cache (offline)."""
    local = Path(run.model.path)
    return local if local.exists() else hub_cache_config(run.model.path)


@fact(
    "model_config",
    "the model's config.json, summarised",
    inputs=MODEL,
    why_missing="no model config given (--model-config, or [model].path in --config)",
)
def probe_model_config(facts) -> dict[str, Any] | None:
    path = _given_or_named(facts, "model_config", _model_config_of)
    if path is None:
        return None
    path = resolve_model_config(Path(path))
    return summarize_model_config(path, read_json_object(path, "model config.json"))


# ---------------------------------------------------------------- DeepSpeed JSON


@fact(
    "deepspeed_config",
    "the DeepSpeed JSON",
    inputs=DEEPSPEED,
    why_missing="no DeepSpeed config given (--deepspeed, or [deepspeed] config in --config)",
)
def probe_deepspeed_config(facts) -> dict[str, Any] | None:
    path = _given_or_named(facts, "deepspeed", lambda run: run.deepspeed.config or None)
    if path is None:
        return None
    config = read_json_object(Path(path), "DeepSpeed config")
    if module_file("deepspeed", "__init__.py") is not None:  # asked of the installed DeepSpeed itself
        from sftdoctor.facts.deepspeed_probe import problems_in_child

        problems = problems_in_child(Path(path))
        if problems:
            raise InputErrors([InputError(path, problem, key=key or None) for key, problem in problems])
    return {"path": str(path), "config": config}
