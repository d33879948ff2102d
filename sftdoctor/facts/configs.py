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


# ---------------------------------------------------------------- accelerate FSDP YAML

FSDP = ("config", "fsdp")
# a YAML value as recorded: a scalar, a mapping, or a list of those (two levels: what accelerate configs hold)
YAML_VALUE = (str, float, bool, None, {}, [(str, float, bool, None, {}, [object])])


def _yaml_loader(yaml):
    """yaml.SafeLoader (what accelerate's ClusterConfig.from_yaml_file reads with, 0.x-1.16) that refuses an alias
    (*name): a few lines of aliases expand to billions of values once the fact is written as JSON, and `accelerate
    config` never writes one."""

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"a YAML alias (*name) at line {mark.line + 1}: write the value out")
            return super().compose_node(parent, index)

    return NoAliases


def _yaml_problem(exc: Exception) -> str:
    """One line of what the YAML parser met, with its line."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
    if "integer string conversion" in what:
        return "a number of more than 4300 digits"
    return f"{what} at line {mark.line + 1}" if mark is not None else what.splitlines()[0]


def _plain_yaml(value: Any, path: Path, key: str) -> Any:
    """A parsed YAML value as plain JSON, or an InputError naming its key: a date, bytes or a set are no setting
    accelerate reads, a non-string key no argument name, NaN or infinity no number a run means."""
    import math

    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InputError(path, f"expected a key name, got {k!r}", key=f"{key}.{k}" if key else str(k))
            out[k] = _plain_yaml(v, path, f"{key}.{k}" if key else k)
        return out
    if isinstance(value, list):
        return [_plain_yaml(v, path, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(path, f"expected a finite number, got {value}", key=key)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise InputError(path, f"expected a string, number, boolean, list or mapping, got {type(value).__name__}", key=key)


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML mapping from a file, read as accelerate reads its config (yaml.safe_load), as plain JSON."""
    try:
        import yaml
    except ImportError:  # a declared dependency; an install without it says so instead of a traceback
        raise InputError(path, f"reading a {what} needs PyYAML: pip install pyyaml") from None
    text = read_text(path, what)
    try:
        data = yaml.load(text, Loader=_yaml_loader(yaml))  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise InputError(path, f"not valid YAML ({_yaml_problem(exc)}); expected a {what}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise InputError(path, f"expected a YAML mapping ({what}), got {got}")
    return _plain_yaml(data, path, "")


def fsdp_keys(block: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """(settings by name without the fsdp_ prefix, each name as written). accelerate 1.16 commands/launch.py
    _validate_launch_command adds the prefix to a key without it; transformers 5.25 training_args.py
    _process_fsdp_args strips it: either way `fsdp_version` and `version` name one setting, given once."""
    keys: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in block.items():
        name = key.removeprefix("fsdp_")
        if name in keys:
            raise InputError(path, f"{written[name]} and {key} name one setting: keep one", key=f"fsdp_config.{key}")
        keys[name], written[name] = value, key
    return keys, written


def fsdp_version(keys: dict[str, Any], written: dict[str, str], path: Path) -> int:
    """The FSDP version accelerate runs: 1 when absent (accelerate 1.6-1.16 utils/dataclasses.py
    FullyShardedDataParallelPlugin.__post_init__, int(os.environ.get("FSDP_VERSION", "1"))); the launcher passes
    str(value), so 2 and "2" are the same and anything but 1 or 2 is refused or runs as neither."""
    value = keys.get("version", 1)
    number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if number not in (1, 2) or isinstance(number, bool):
        key = f"fsdp_config.{written.get('version', 'fsdp_version')}"
        raise InputError(path, f"expected 1 or 2 (FSDP1 or FSDP2), got {json.dumps(value)[:60]}", key=key)
    return int(number)


def summarize_fsdp_config(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """An accelerate FSDP config (`accelerate config`'s YAML), or an InputError naming what makes it none."""
    kind = doc.get("distributed_type")
    if kind != "FSDP":
        said = "absent" if kind is None else json.dumps(kind)[:60]
        raise InputError(path, f"expected FSDP (an accelerate FSDP config), got {said}", key="distributed_type")
    block = doc.get("fsdp_config")
    if not isinstance(block, dict):
        said = "absent" if block is None else type(block).__name__
        raise InputError(path, f"expected a mapping of fsdp_* settings, got {said}", key="fsdp_config")
    keys, written = fsdp_keys(block, path)
    return {
        "path": str(path),
        "version": fsdp_version(keys, written, path),
        "fsdp": keys,
        "written": written,
        "top": {k: v for k, v in doc.items() if k != "fsdp_config"},
    }


def _fsdp_config_of(run) -> str | None:
    """[fsdp] config of the run config, where this sftdoctor's run config has that section."""
    return getattr(getattr(run, "fsdp", None), "config", None) or None


@fact(
    "fsdp_config",
    "the accelerate FSDP config (YAML): its fsdp_* settings without the prefix, the FSDP version, the top-level keys",
    inputs=FSDP,
    why_missing="no FSDP config given (--fsdp, or [fsdp] config in --config)",
    shape={"path": str, "version": int, "fsdp": {str: YAML_VALUE}, "written": {str: str}, "top": {str: YAML_VALUE}},
    required=("path", "version", "fsdp", "written", "top"),
)
def probe_fsdp_config(facts) -> dict[str, Any] | None:
    path = _given_or_named(facts, "fsdp", _fsdp_config_of)
    if path is None:
        return None
    return summarize_fsdp_config(Path(path), read_yaml_mapping(Path(path), "accelerate FSDP config"))
