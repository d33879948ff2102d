"""`sftdoctor diff RUN_A RUN_B`: exit 0 when nothing that changes a run's numbers differs, 1 when something
does, 2 for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sftdoctor.diff.compare import AREAS, Difference, differences, recorded, where_they_part


def main(run_a: Path, run_b: Path, as_json: bool = False) -> int:
    a, b = recorded(run_a), recorded(run_b)
    found = differences(a, b)
    parted = where_they_part(a.path, b.path)
    missing = [str(r.path) for r in (a, b) if r.facts is None]
    if as_json:
        print(json.dumps({"a": str(a.path), "b": str(b.path), "curves": parted, "not_recorded": missing,
                          "differences": [d.__dict__ for d in found]}, indent=2, default=str))
    else:
        print("\n".join(lines(a.path, b.path, found, parted, missing)))
    return 1 if found else 0


def lines(a: Path, b: Path, found: list[Difference], parted: dict[str, Any], missing: list[str]) -> list[str]:
    out = [f"A  {a}", f"B  {b}", ""]
    if "error" in parted:
        out.append(f"curves  not compared: {parted['error']}")
    elif parted["step"] is None:
        out.append(f"curves  the train losses agree at every one of {parted['common_steps']} common steps")
    else:
        (sa, va), (sb, vb) = parted["last"]["a"], parted["last"]["b"]
        out.append(f"curves  the train losses part at step {parted['step']}: {parted['a']:.4f} (A) vs {parted['b']:.4f} "
                   f"(B); last {va:.4f} at step {sa} (A) vs {vb:.4f} at step {sb} (B)")
    for d in found:
        out.append(f"{d.area:<7} {d.what}: {_shown(d.a)} (A) vs {_shown(d.b)} (B)")
    for path in missing:
        out.append(f"note    {path} has no facts.json (trained elsewhere, or before sftdoctor kept it): its stack, "
                   "GPUs, environment and data files were not compared")
    counts = ", ".join(f"{sum(d.area == area for d in found)} {area}" for area in AREAS if any(d.area == area for d in found))
    out.append(f"\n{len(found)} difference{'' if len(found) == 1 else 's'}" + (f" ({counts})" if counts else "")
               + ("; the most likely causes first" if found else ""))
    return out


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 200 else text[:197] + "..."
