"""The run config (TOML) of `sftdoctor train`: schema, validation, path resolution.

Validation reports every problem at once, one line each: file, [section].key, what was
expected, and a did-you-mean for unknown names. Importing this module is cheap.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
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
    path: bool = False  # resolved relative to the config file's folder
    local_or_hub: bool = False  # a folder next to the config file if one exists, else kept (hub id)
    doc: str = ""


def _one_of(*choices: Any) -> Key:
    return Key("one of " + ", ".join(map(str, choices)), lambda v: v in choices, default=choices[0])


def _int(low: int | None = None, high: int | None = None, auto: bool = False) -> Callable[[Any], bool]:
    def accepts(v: Any) -> bool:
        if auto and v == "auto":
            return True
        return isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low) and (high is None or v <= high)

    return accepts


def _str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


SCHEMA: dict[str, dict[str, Key]] = {
    "model": {
        "path": Key("a local folder or a hub id", _str, required=True, local_or_hub=True,
                    doc="model to fine-tune: a local folder with config.json, or a hub id"),
        "precision": Key("one of auto, bf16, fp16, fp32", lambda v: v in ("auto", "bf16", "fp16", "fp32"),
                         default="auto", doc="auto = bf16 where every GPU has it (compute capability >= 8.0), else fp16"),
        "attn_implementation": Key("one of auto, flash_attention_2, sdpa, eager",
                                   lambda v: v in ("auto", "flash_attention_2", "sdpa", "eager"), default="auto"),
        "trust_remote_code": Key("true or false", _bool, default=False),
    },
    "deepspeed": {
        "config": Key("a path to a DeepSpeed JSON", _str, path=True,
                      doc="use this DeepSpeed JSON as is (\"auto\" values are filled from the run)"),
        "zero_stage": Key("an integer 0 to 3", _int(0, 3), doc="generate a DeepSpeed JSON for this ZeRO stage"),
        "offload_optimizer": Key("true or false", _bool, default=False, doc="ZeRO-Offload optimizer states to CPU"),
        "offload_params": Key("true or false", _bool, default=False, doc="ZeRO-3: offload parameters to CPU"),
    },
    "launch": {
        "nproc_per_node": Key('a positive integer or "auto"', _int(1, auto=True), default="auto"),
        "nnodes": Key("a positive integer", _int(1), default=1),
        "node_rank": Key("an integer >= 0", _int(0), default=0),
        "master_addr": Key("a host name or address", _str, default="127.0.0.1"),
        "master_port": Key('a port 1-65535 or "auto"', _int(1, 65535, auto=True), default=29500),
        "max_restarts": Key("an integer >= 0", _int(0), default=0),
    },
}


def _resolve(spec: Key, value: Any, folder: Path) -> Any:
    if spec.path or (spec.local_or_hub and (folder / value).exists()):
        return str(folder / value)
    return value


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
                out[key] = _resolve(spec, value, path.parent)
        for key, spec in keys.items():
            if key in out:
                continue
            if spec.required:
                errors.append(InputError(path, f"missing; expected {spec.expected}", key=f"[{section}].{key}"))
            elif spec.default is not None:
                out[key] = spec.default
        resolved[section] = out
    deepspeed = resolved.get("deepspeed", {})
    if "config" in deepspeed and "zero_stage" in deepspeed:
        errors.append(InputError(path, "give either config (a JSON) or zero_stage, not both", key="[deepspeed]"))
    if errors:
        raise InputErrors(errors)
    return resolved
