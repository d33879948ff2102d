"""`sftdoctor diff RUN_A RUN_B`: exit 0 when everything was compared and nothing that changes a run's numbers
differs, 1 when something does or could not be compared (each such part is named), 2 for bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sftdoctor.diff.compare import AREAS, Difference, Gap, differences, not_compared, recorded, where_they_part
from sftdoctor.facts.run_records import json_safe, said, shown


def main(run_a: Path, run_b: Path, as_json: bool = False) -> int:
    if as_json:
        text, code = json_text(run_a, run_b)
        print(text, end="")
        return code
    a, b = recorded(run_a), recorded(run_b)
    found, gaps = differences(a, b), not_compared(a, b)
    print("\n".join(lines(a.path, b.path, found, where_they_part(a.path, b.path), gaps)))
    return 1 if found or gaps else 0


def json_text(run_a: Path, run_b: Path) -> tuple[str, int]:
    """What `diff --json` prints, and its exit code (for `sftdoctor mcp`, which prints nothing)."""
    a, b = recorded(run_a), recorded(run_b)
    found, gaps = differences(a, b), not_compared(a, b)
    doc = {
        "a": str(a.path),
        "b": str(b.path),
        "curves": where_they_part(a.path, b.path),
        "not_recorded": [str(r.path) for r in (a, b) if r.facts is None],
        "not_compared": [{"run": label, "areas": list(gap.areas), "why": gap.why} for label, gap in gaps],
        "differences": [d.__dict__ for d in found],
    }
    return json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n", 1 if found or gaps else 0


def lines(a: Path, b: Path, found: list[Difference], parted: dict[str, Any], gaps: list[tuple[str, Gap]]) -> list[str]:
    out = [f"A  {a}", f"B  {b}", ""] + curve_lines(parted)
    for d in found:
        out.append(f"{d.area:<7} {d.what}: {_shown(d.a)} (A) vs {_shown(d.b)} (B)")
    for label, gap in gaps:
        out.append(f"note    not compared: {', '.join(gap.areas)}: {label} {gap.why}")
    return out + ["", summary(found, parted, gaps)]


def _number(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else shown(value)


def curve_lines(parted: dict[str, Any]) -> list[str]:
    """Where the train losses part; a loss that stopped being a number is said, never compared as one."""
    if "error" in parted:
        return [f"curves  not compared: {parted['error']}"]
    (sa, va), (sb, vb) = parted["last"]["a"], parted["last"]["b"]
    last = f"last {_number(va)} at step {sa} (A) vs {_number(vb)} at step {sb} (B)"
    if parted["step"] is not None:
        out = [
            f"curves  the train losses part at step {parted['step']}: {_number(parted['a'])} (A) vs "
            f"{_number(parted['b'])} (B); {last}"
        ]
    elif parted["both_non_finite"] is not None:
        both = parted["both_non_finite"]  # two NaNs are no agreement
        out = [f"curves  both train losses are non-finite at step {both}: nothing from there on is compared; {last}"]
    elif gone := [label.upper() for label, lost in parted["non_finite"].items() if lost]:
        # a NaN at a common step parts the runs above: this one fell where the other logged nothing
        out = [
            f"curves  the train losses agree at the {parted['common_steps']} common steps, where both are numbers; "
            f"the non-finite loss of {' and '.join(gone)} is at steps the other run did not log"
        ]
    else:
        out = [f"curves  the train losses agree at every one of {parted['common_steps']} common steps"]
    return out + [
        f"curves  {label.upper()}: the train loss is {said(gone)}"
        for label, gone in parted["non_finite"].items()
        if gone
    ]


def summary(found: list[Difference], parted: dict[str, Any], gaps: list[tuple[str, Gap]]) -> str:
    """ "N differences", or what was compared and what was not: "0 differences" only when everything was
    compared and every loss was a number."""
    skipped = [area for area in AREAS if any(area in gap.areas for _, gap in gaps)]
    skipped += ["curves"] if "error" in parted else []
    odd = [label.upper() for label, gone in (parted.get("non_finite") or {}).items() if gone]
    if found:
        counts = ", ".join(
            f"{sum(d.area == area for d in found)} {area}" for area in AREAS if any(d.area == area for d in found)
        )
        text = f"{len(found)} difference{'' if len(found) == 1 else 's'} ({counts}); the most likely causes first"
    elif not skipped and not odd:
        return "0 differences"
    else:
        compared = [area for area in AREAS if area not in skipped]
        text = f"no difference in {', '.join(compared)}" if compared else "nothing compared"
    if skipped:
        text += f"; not compared: {', '.join(skipped)}"
    if odd:
        text += f"; non-finite train loss in {' and '.join(odd)}"
    return text


def _shown(value: Any) -> str:
    text = json.dumps(json_safe(value)) if not isinstance(value, str) else value
    return text if len(text) <= 200 else text[:197] + "..."
