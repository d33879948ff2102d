"""Reading GPU facts: compute capability, bf16, memory. Shared by the plan's decisions and the checks."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

BF16_MIN_CC = (8, 0)  # bf16 and tf32 tensor cores arrived with Ampere
FLASH_MIN_CC = (8, 0)  # flash-attn 2.x: "FlashAttention only supports Ampere GPUs or newer."


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """ "12.4" -> (12, 4); "2.5.1+cu124" -> (2, 5, 1); None or junk -> None."""
    if not version:
        return None
    match = re.match(r"(\d+(?:\.\d+)*)", str(version))
    return tuple(int(part) for part in match[1].split(".")) if match else None


def devices(gpus: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list((gpus or {}).get("devices") or [])


def capability(device: dict[str, Any]) -> tuple[int, int] | None:
    cc = version_tuple(device.get("compute_capability"))
    return (cc[0], cc[1] if len(cc) > 1 else 0) if cc else None


def describe_gpus(found: list[dict[str, Any]]) -> str:
    """ "8x NVIDIA A100-SXM4-80GB (compute capability 8.0)"; mixed boxes list each model."""
    counts = Counter((d.get("name") or "unknown GPU", d.get("compute_capability") or "?") for d in found)
    return ", ".join(f"{n}x {name} (compute capability {cc})" for (name, cc), n in counts.items())


def lacking(found: list[dict[str, Any]], minimum: tuple[int, int]) -> list[dict[str, Any]]:
    """Devices whose known compute capability is below `minimum`."""
    return [d for d in found if (cc := capability(d)) is not None and cc < minimum]


def bf16_capable(gpus: dict[str, Any] | None) -> bool | None:
    """True when every GPU has bf16, False when one lacks it, None without GPUs or with unknown ones."""
    found = devices(gpus)
    if not found or any(capability(d) is None for d in found):
        return None
    return not lacking(found, BF16_MIN_CC)


def smallest_memory(gpus: dict[str, Any] | None) -> int:
    """Bytes of the smallest GPU (0 when none or unknown)."""
    return min((d.get("memory_total_mib") or 0 for d in devices(gpus)), default=0) * 2**20
