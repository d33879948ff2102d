"""What a check says: a severity, a one-line verdict, the numbers behind it and the fix."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Severity(str, enum.Enum):
    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.OK: 0, Severity.INFO: 1, Severity.WARNING: 2, Severity.ERROR: 3}


@dataclass(frozen=True)
class Finding:
    """One verdict of one check. `id` and `explain` default to the check's own: `id` may be a message of it,
    CHECK/slug (declared in its `@check(messages=...)`), and `explain` a section of a topic, TOPIC#section.
    `silenced`: the user turned this id off (--disable, [checks] disable); shown as such, never counted."""

    severity: Severity
    title: str
    detail: str = ""
    fix: str = ""
    explain: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    silenced: bool = False

    @property
    def explain_command(self) -> str:
        """What to type to read its topic, or its section (TOPIC#slug is `sftdoctor explain TOPIC/slug`)."""
        return f"sftdoctor explain {self.explain.replace('#', '/', 1)}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.value
        return data


def ok(title: str, detail: str = "", **kw: Any) -> Finding:
    return Finding(Severity.OK, title, detail, **kw)


def info(title: str, detail: str = "", fix: str = "", **kw: Any) -> Finding:
    return Finding(Severity.INFO, title, detail, fix, **kw)


def warning(title: str, detail: str = "", fix: str = "", **kw: Any) -> Finding:
    return Finding(Severity.WARNING, title, detail, fix, **kw)


def error(title: str, detail: str = "", fix: str = "", **kw: Any) -> Finding:
    return Finding(Severity.ERROR, title, detail, fix, **kw)
