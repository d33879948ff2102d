"""Helpers shared by the built-in checks: versions, GPU summaries, the precision a run asks for."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """"12.4" -> (12, 4); "2.5.1+cu124" -> (2, 5, 1); None or junk -> None."""
    if not version:
        return None
    match = re.match(r"(\d+(?:\.\d+)*)", str(version))
    return tuple(int(part) for part in match[1].split(".")) if match else None


def capability(device: dict[str, Any]) -> tuple[int, int] | None:
    cc = version_tuple(device.get("compute_capability"))
    return (cc[0], cc[1] if len(cc) > 1 else 0) if cc else None


def describe_gpus(devices: list[dict[str, Any]]) -> str:
    """"8x NVIDIA A100-SXM4-80GB (compute capability 8.0)"; mixed boxes list each model."""
    counts = Counter((d.get("name") or "unknown GPU", d.get("compute_capability") or "?") for d in devices)
    return ", ".join(f"{n}x {name} (compute capability {cc})" for (name, cc), n in counts.items())


def lacking(devices: list[dict[str, Any]], minimum: tuple[int, int]) -> list[dict[str, Any]]:
    """Devices whose known compute capability is below `minimum`."""
    return [d for d in devices if (cc := capability(d)) is not None and cc < minimum]


BF16_MIN_CC = (8, 0)  # bf16 and tf32 tensor cores arrived with Ampere


def bf16_capable(gpus: dict[str, Any] | None) -> bool | None:
    devices = (gpus or {}).get("devices") or []
    if not devices or any(capability(d) is None for d in devices):
        return None
    return not lacking(devices, BF16_MIN_CC)


def ds_flag(config: dict[str, Any], *sections: str) -> tuple[Any, str | None]:
    """`enabled` of the first present section: True, False, "auto", or None when absent.
    A section present without `enabled` is disabled (DeepSpeed's default)."""
    for section in sections:
        block = config.get(section)
        if isinstance(block, dict):
            return block.get("enabled", False), section
    return None, None


def ds_precision_flags(config: dict[str, Any]) -> dict[str, Any]:
    fp16, _ = ds_flag(config, "fp16")
    # DeepSpeed reads "bf16" and, for old configs, "bfloat16" (runtime/precision_config.py, 0.10-0.19).
    bf16, bf16_key = ds_flag(config, "bf16", "bfloat16")
    return {"fp16": fp16, "bf16": bf16, "bf16_key": bf16_key}


def requested_precision(run_config: dict[str, Any] | None, deepspeed_config: dict[str, Any] | None,
                        gpus: dict[str, Any] | None) -> tuple[str | None, str]:
    """The mixed precision the run will use, and where that was said."""
    precision = ((run_config or {}).get("model") or {}).get("precision")
    if precision and precision != "auto":
        return precision, "[model].precision in the run config"
    if precision == "auto":
        capable = bf16_capable(gpus)
        if capable is not None:
            return ("bf16" if capable else "fp16"), "[model].precision = \"auto\" on these GPUs"
    if deepspeed_config:
        flags = ds_precision_flags(deepspeed_config["config"])
        if flags["bf16"] is True:
            return "bf16", f"{flags['bf16_key']}.enabled in {deepspeed_config['path']}"
        if flags["fp16"] is True:
            return "fp16", f"fp16.enabled in {deepspeed_config['path']}"
    return None, ""
