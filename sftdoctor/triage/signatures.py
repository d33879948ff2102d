"""The log signatures that kb topics declare in their front matter (`[[signatures]]`).

id        unique name
needle    a literal the line must hold (searched in the raw bytes, case-sensitive), or a list
          of literals of which it must hold one
regex     what to match in the decoded line (Python syntax, named groups = specifics;
          NAME_2, NAME_3 fill NAME, for alternatives); the escaped needle when left out
role      root     a cause in itself (a CUDA OOM, a version mismatch)
          symptom  a finding, but often the consequence of a root found before it
          context  feeds a summariser (loss values, torchrun's failure block), no finding alone
          cascade  what follows a failure (ChildFailedError, SIGTERM to the others): counted
          benign   looks alarming, is not: the line is dropped before the others are tried
severity  of the finding: error, warning, or info (an advisory or a deprecation notice: shown, never a
          run's root cause, no problem for the exit status)
title     one line; `{group}` fields are filled from the first match
fix       one line
only_if   words of which the line must also hold one (for frequent needles: a Trainer dict is
          looked at only if it holds a nan or an inf); the other lines are counted and the last
          few handed to the summariser with the next line that is looked at
wraps     N (1 or 2): the message may wrap onto the next N lines; the regex sees them joined by spaces
summariser  which of summaries.py's summarisers turns the matches into findings; default: one finding
          per signature
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

ROLES = ("root", "symptom", "context", "cascade", "benign")


@dataclass(frozen=True)
class Signature:
    id: str
    topic: str
    needle: str | tuple[str, ...]
    regex: re.Pattern
    role: str
    severity: str = "error"
    title: str = ""
    fix: str = ""
    summariser: str = ""
    wraps: int = 0
    only_if: tuple[str, ...] = ()


def _signature(topic: str, entry: dict) -> Signature:
    known = {"id", "needle", "regex", "role", "severity", "title", "fix", "summariser", "wraps", "only_if"}
    if unknown := set(entry) - known:
        raise ValueError(f"kb topic {topic}: signature {entry.get('id')!r} has unknown keys {sorted(unknown)}")
    if entry["role"] not in ROLES:
        raise ValueError(f"kb topic {topic}: signature {entry['id']!r}: role must be one of {ROLES}")
    if entry.get("severity", "error") not in ("error", "warning", "info"):
        raise ValueError(f"kb topic {topic}: signature {entry['id']!r}: severity must be error, warning or info")
    needles = [entry["needle"]] if isinstance(entry["needle"], str) else list(entry["needle"])
    source = entry.get("regex") or re.escape(needles[0])
    if len(needles) > 1 and "regex" not in entry:
        raise ValueError(f"kb topic {topic}: signature {entry['id']!r}: several needles need a regex")
    for needle in needles:
        # The needle is the prefilter: a regex that can match without it would never be tried.
        if needle not in source.replace("\\", ""):
            raise ValueError(
                f"kb topic {topic}: signature {entry['id']!r}: the regex must contain {needle!r} literally"
            )
    entry = {
        **entry,
        "needle": needles[0] if len(needles) == 1 else tuple(needles),
        "only_if": tuple(entry.get("only_if", ())),
    }
    if entry.get("wraps", 0) not in (0, 1, 2):
        raise ValueError(f"kb topic {topic}: signature {entry['id']!r}: wraps must be 0, 1 or 2 (lines)")
    regex = re.compile(source)
    return Signature(topic=topic, regex=regex, **{k: v for k, v in entry.items() if k != "regex"})


@cache
def signatures() -> tuple[Signature, ...]:
    from sftdoctor import kb

    found = [_signature(t.name, entry) for t in kb.topics() for entry in t.meta.get("signatures", [])]
    ids = [s.id for s in found]
    if duplicated := {i for i in ids if ids.count(i) > 1}:
        raise ValueError(f"kb: signature ids declared twice: {sorted(duplicated)}")
    return tuple(found)
