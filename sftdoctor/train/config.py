"""The run config (TOML) of `sftdoctor train`: schema, validation, path resolution.

Validation reports every problem at once, one line each: file, [section].key, what was
expected, and a did-you-mean for unknown names. Paths are relative to the TOML file.
Importing this module is cheap (no torch).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from sftdoctor.errors import InputError, InputErrors, did_you_mean


@dataclass(frozen=True)
class Key:
    expected: str  # said in errors: "one of bf16, fp16, fp32, auto"
    accepts: Callable[[Any], bool]
    default: Any = None
    required: bool = False
    path: str = ""  # "file": must exist, relative to the TOML; "files": one or a list; "dir": output, relative
    local_or_hub: bool = False  # a folder next to the config file if one exists, else kept (hub id)
    doc: str = ""


def _choice(*choices: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v in choices


def _int(low: int | None = None, high: int | None = None, auto: bool = False) -> Callable[[Any], bool]:
    def accepts(v: Any) -> bool:
        if auto and v == "auto":
            return True
        return isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low) and (high is None or v <= high)

    return accepts


def _float(low: float, high: float | None = None, low_open: bool = False) -> Callable[[Any], bool]:
    def accepts(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            return False
        return (v > low if low_open else v >= low) and (high is None or v <= high)

    return accepts


def _str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _strs(v: Any) -> bool:
    return _str(v) or (isinstance(v, list) and len(v) > 0 and all(_str(x) for x in v))


def _auto_or_bool(v: Any) -> bool:
    return v == "auto" or isinstance(v, bool)


SCHEMA: dict[str, dict[str, Key]] = {
    "model": {
        "path": Key("a local folder or a hub id", _str, required=True, local_or_hub=True,
                    doc="model to fine-tune: a folder with config.json (relative to this file), or a hub id"),
        "weights": Key("one of pretrained, random", _choice("pretrained", "random"), default="pretrained",
                       doc="random = initialise from config.json alone (tiny examples, smoke tests)"),
        "tokenizer": Key("a local folder or a hub id", _str, local_or_hub=True, doc="default: the model path"),
        "precision": Key("one of auto, bf16, fp16, fp32", _choice("auto", "bf16", "fp16", "fp32"), default="auto",
                         doc="auto = bf16 where every GPU has it (compute capability >= 8.0), else fp16; fp32 on CPU"),
        "attn_implementation": Key("one of auto, flash_attention_2, sdpa, eager",
                                   _choice("auto", "flash_attention_2", "sdpa", "eager"), default="auto",
                                   doc="auto = flash_attention_2 where installed and every GPU is Ampere or newer, else sdpa"),
        "trust_remote_code": Key("true or false", _bool, default=False),
    },
    "data": {
        "train": Key("a JSONL/JSON/Parquet file or a list of them", _strs, required=True, path="files",
                     doc="rows with `messages` (chat), `prompt`+`completion`, or `text`"),
        "eval": Key("a JSONL/JSON/Parquet file or a list of them", _strs, path="files"),
        "eval_fraction": Key("a number from 0 to 0.5", _float(0.0, 0.5), default=0.0,
                             doc="hold out this share of train as the eval split (instead of `eval`)"),
        "format": Key("one of auto, messages, prompt_completion, text",
                      _choice("auto", "messages", "prompt_completion", "text"), default="auto"),
        "max_length": Key("an integer >= 16", _int(16), default=2048, doc="tokens per sample (per packed row)"),
    },
    "training": {
        "global_batch_size": Key("a positive integer", _int(1),
                                 doc="sequences per optimizer step over all GPUs = per_device x accumulation x world size"),
        "per_device_batch_size": Key("a positive integer", _int(1), default=1),
        "learning_rate": Key("a number > 0", _float(0.0, 1.0, low_open=True), default=2e-5),
        "lr_scheduler": Key("one of cosine_with_min_lr, cosine, linear, constant_with_warmup",
                            _choice("cosine_with_min_lr", "cosine", "linear", "constant_with_warmup"),
                            default="cosine_with_min_lr"),
        "min_lr_rate": Key("a number from 0 to 1", _float(0.0, 1.0),
                           doc="cosine_with_min_lr floor as a share of learning_rate (default 0.1)"),
        "min_lr": Key("a number >= 0", _float(0.0), doc="cosine_with_min_lr floor as an absolute rate"),
        "warmup_ratio": Key("a number from 0 up to (not including) 1", lambda v: _float(0.0, 1.0)(v) and v < 1,
                            doc="default 0.03 (unless warmup_steps)"),
        "warmup_steps": Key("an integer >= 0", _int(0)),
        "weight_decay": Key("a number >= 0", _float(0.0), default=0.0),
        "max_grad_norm": Key("a number >= 0", _float(0.0), default=1.0, doc="0 turns clipping off"),
        "epochs": Key("a number > 0", _float(0.0, low_open=True), default=1),
        "max_steps": Key("a positive integer", _int(1), doc="overrides epochs"),
        "gradient_checkpointing": Key("true or false", _bool, default=True, doc="non-reentrant activation checkpointing"),
        "packing": Key('true, false or "auto"', _auto_or_bool, default="auto",
                       doc="auto = on when a probe proves packed samples stay isolated on this stack"),
        "liger_kernel": Key('true, false or "auto"', _auto_or_bool, default="auto", doc="auto = on CUDA when installed"),
        "seed": Key("an integer", _int(), default=42),
        "logging_steps": Key("a positive integer", _int(1), default=10),
        "save_steps": Key("a positive integer", _int(1), default=500),
        "save_total_limit": Key("a positive integer", _int(1), default=2),
        "eval_steps": Key("a positive integer", _int(1), doc="default: save_steps"),
        "output_dir": Key("a folder path", _str, path="dir", doc="the run directory (default runs/<config name>)"),
    },
    "deepspeed": {
        "config": Key("a path to a DeepSpeed JSON", _str, path="file",
                      doc="use this DeepSpeed JSON as is (\"auto\" values are filled from the run)"),
        "zero_stage": Key("an integer 0 to 3", _int(0, 3), doc="generate a DeepSpeed JSON for this ZeRO stage"),
        "offload_optimizer": Key("true or false", _bool, default=False, doc="ZeRO-Offload optimizer states to CPU"),
        "offload_params": Key("true or false", _bool, default=False, doc="ZeRO-3: offload parameters to CPU"),
    },
    "launch": {
        "nproc_per_node": Key('a positive integer or "auto"', _int(1, auto=True), default="auto",
                              doc="auto = every visible GPU (1 on a CPU-only machine)"),
        "nnodes": Key("a positive integer", _int(1), default=1),
        "node_rank": Key("an integer >= 0", _int(0), default=0),
        "master_addr": Key("a host name or address", _str, default="127.0.0.1"),
        "master_port": Key('a port 1-65535 or "auto"', _int(1, 65535, auto=True), default=29500),
        "max_restarts": Key("an integer >= 0", _int(0), default=0),
        "distributed_check": Key("true or false", _bool, default=True,
                                 doc="with 2+ processes, every rank runs `check --distributed` before training"),
    },
    "report": {
        "to": Key("one of none, tensorboard, wandb", _choice("none", "tensorboard", "wandb"), default="none"),
    },
    "watch": {
        "on_nan": Key("one of stop, skip", _choice("stop", "skip"), default="stop",
                      doc="stop: every rank stops, no checkpoint of poisoned weights; skip: drop that update"),
        "max_skips": Key("an integer >= 1", _int(1), default=10, doc="with on_nan = skip: stop after this many"),
        "hang_timeout_s": Key("a number of seconds >= 5", _float(5.0), default=300,
                              doc="no progress for this long is a hang (NCCL's own timeout is 10 minutes)"),
        "loss_spike_factor": Key("a number > 0", _float(0.0, low_open=True), default=6.0,
                                 doc="a logged loss this many robust deviations above the recent median is a spike"),
    },
}

# Pairs of keys of which at most one may be given.
EXCLUSIVE = (
    ("deepspeed", "config", "zero_stage"),
    ("training", "min_lr_rate", "min_lr"),
    ("training", "warmup_ratio", "warmup_steps"),
)


def load_run_config(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, "run config not found") from None
    except OSError as exc:
        raise InputError(path, f"cannot read run config: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(path, "expected a UTF-8 TOML run config, got binary data") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, f"not valid TOML: {exc}") from None
    return {"path": str(path), **validate(raw, path)}


def _resolve(spec: Key, value: Any, folder: Path, errors: list[InputError], path: Path, where: str) -> Any:
    if spec.local_or_hub:
        return str(folder / value) if (folder / value).exists() else value
    if spec.path == "dir":
        return str(folder / value)
    if spec.path in ("file", "files"):
        files = [value] if isinstance(value, str) else value
        resolved = [folder / f for f in files]
        for given, full in zip(files, resolved):
            if not full.is_file():
                errors.append(InputError(path, f"file not found: {given} (looked for {full})", key=where))
        out = [str(f) for f in resolved]
        return out[0] if spec.path == "file" else out
    return value


def validate(raw: dict[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    """Check every section and key; return the config with defaults filled and paths resolved."""
    errors: list[InputError] = []
    resolved: dict[str, dict[str, Any]] = {}
    for section, value in raw.items():
        if section not in SCHEMA:
            errors.append(InputError(path, f"unknown section; expected one of {', '.join(SCHEMA)}{did_you_mean(section, SCHEMA)}", key=f"[{section}]"))
        elif not isinstance(value, dict):
            errors.append(InputError(path, "expected a table ([section] with keys)", key=section))
    for section, keys in SCHEMA.items():
        given = raw.get(section, {})
        if not isinstance(given, dict):
            continue
        out: dict[str, Any] = {}
        for key, value in given.items():
            spec = keys.get(key)
            where = f"[{section}].{key}"
            if spec is None:
                errors.append(InputError(path, f"unknown key{did_you_mean(key, keys)}; known keys: {', '.join(keys)}", key=where))
            elif not spec.accepts(value):
                errors.append(InputError(path, f"expected {spec.expected}, got {value!r}", key=where))
            else:
                out[key] = _resolve(spec, value, path.parent, errors, path, where)
        for key, spec in keys.items():
            if key in out or (section in raw and isinstance(given, dict) and key in given):
                continue
            if spec.required:
                errors.append(InputError(path, f"missing; expected {spec.expected}", key=f"[{section}].{key}"))
            elif spec.default is not None:
                out[key] = spec.default
        resolved[section] = out
    for section, a, b in EXCLUSIVE:
        given = raw.get(section) if isinstance(raw.get(section), dict) else {}
        if a in given and b in given:
            errors.append(InputError(path, f"give either {a} or {b}, not both", key=f"[{section}]"))
    errors += _cross_checks(raw, resolved, path)
    if errors:
        raise InputErrors(errors)
    resolved["training"].setdefault("output_dir", str(path.parent / "runs" / path.stem))
    return resolved


def _cross_checks(raw: dict[str, Any], cfg: dict[str, dict[str, Any]], path: Path) -> list[InputError]:
    errors = []
    training, data, launch = cfg.get("training", {}), cfg.get("data", {}), cfg.get("launch", {})
    if ("min_lr_rate" in training or "min_lr" in training) and training.get("lr_scheduler") != "cosine_with_min_lr":
        errors.append(InputError(path, "a learning-rate floor needs lr_scheduler = \"cosine_with_min_lr\" "
                                       f"(the {training.get('lr_scheduler')} schedule has none)", key="[training]"))
    if "eval" in data and data.get("eval_fraction"):
        errors.append(InputError(path, "give either eval (files) or eval_fraction, not both", key="[data]"))
    if launch.get("nnodes", 1) > 1 and launch.get("master_port") == "auto":
        errors.append(InputError(path, "master_port = \"auto\" works on one node only: every node must be given "
                                       "the same port", key="[launch].master_port"))
    if launch.get("node_rank", 0) >= launch.get("nnodes", 1):
        errors.append(InputError(path, f"node_rank {launch.get('node_rank')} must be below nnodes {launch.get('nnodes')}",
                                 key="[launch].node_rank"))
    deepspeed = raw.get("deepspeed") if isinstance(raw.get("deepspeed"), dict) else {}
    if deepspeed.get("offload_params") and deepspeed.get("zero_stage") != 3:
        errors.append(InputError(path, "offload_params needs zero_stage = 3", key="[deepspeed].offload_params"))
    if (deepspeed.get("offload_optimizer") or deepspeed.get("offload_params")) and "config" in deepspeed:
        errors.append(InputError(path, "offload settings go with zero_stage; put them in the JSON given as config",
                                 key="[deepspeed]"))
    return errors
