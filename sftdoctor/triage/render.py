"""A diagnosis for people (the root cause first, the cascade counted) and for machines (JSON)."""

from __future__ import annotations

import json
import sys
from typing import Any

from sftdoctor import __version__
from sftdoctor.render import render_table
from sftdoctor.triage import Diagnosis


def render_diagnosis(diagnosis: Diagnosis, out=None) -> None:
    out = out or sys.stdout
    out.write(
        f"{diagnosis.source}: {diagnosis.lines:,} line{'' if diagnosis.lines == 1 else 's'}, "
        f"{diagnosis.bytes / 2**20:.1f} MiB\n"
    )
    out.write(verdict_line(diagnosis) + "\n")
    render_table([loc.finding for loc in diagnosis.findings], [], out=out, with_summary=False)
    if diagnosis.cascade:
        total = sum(diagnosis.cascade.values())
        kinds = ", ".join(f"{name} ×{count}" for name, count in diagnosis.cascade.most_common())
        out.write(f"ignored {total} cascade line{'s' if total != 1 else ''} ({kinds}); `sftdoctor explain crash-log`\n")


def verdict_line(diagnosis: Diagnosis) -> str:
    """The one line that says what the log shows: its root cause, a failure no signature explains, or nothing (a log
    that shows no failure and no known problem; advisories at most)."""
    verdict, root = diagnosis.verdict, diagnosis.root
    if verdict == "root-cause":
        rank = root.finding.evidence.get("rank")
        at = f"at line {root.line}" if root.line else "in the flight-recorder dumps beside the log"
        return f"root cause: {root.finding.id} {at}" + (f" (rank {rank})" if rank is not None else "")
    if verdict == "failed-unrecognised":
        return "failed: cause not recognised (no known failure signature explains it; the failure is quoted below)"
    return "nothing recognised: no failure and no known problem in this log"


def diagnosis_json(diagnosis: Diagnosis) -> dict[str, Any]:
    return {
        "sftdoctor": __version__,
        "log": diagnosis.source,
        "bytes": diagnosis.bytes,
        "lines": diagnosis.lines,
        "verdict": diagnosis.verdict,
        "failed": diagnosis.failed,
        "root_cause": diagnosis.root.finding.id if diagnosis.verdict == "root-cause" else None,
        "root_cause_line": diagnosis.root.line if diagnosis.verdict == "root-cause" else None,
        "findings": [{**loc.finding.to_json(), "line": loc.line, "role": loc.role} for loc in diagnosis.findings],
        "ignored": {"cascade": dict(diagnosis.cascade), "benign": diagnosis.benign},
        "signatures": dict(diagnosis.matched),
    }


def render_diagnosis_json(diagnosis: Diagnosis) -> None:
    sys.stdout.write(diagnosis_json_text(diagnosis))


def diagnosis_json_text(diagnosis: Diagnosis) -> str:
    """What `explain --log FILE --json` prints, newline included."""
    return json.dumps(diagnosis_json(diagnosis), indent=2, default=str) + "\n"
