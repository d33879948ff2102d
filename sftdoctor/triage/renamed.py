"""The summary of renamed or removed APIs (kb topic api-renames): a `got an unexpected keyword argument`,
`cannot import name` or `has no attribute` whose name is in the rename table (facts/renames.py) becomes a finding
that names the old name, the new one, the releases that deprecated and removed it, the versions the log printed
and, marked as such, the version installed where `explain --log` runs. A name that is not in the table makes no
finding: the crash verdict quotes it.

Registered in triage/registry.py."""

from __future__ import annotations

import re
from typing import Any

from sftdoctor.facts.distributions import version as installed_version
from sftdoctor.facts.renames import ARGUMENT, ATTRIBUTE, IMPORT, PAIRS, Rename, lookup
from sftdoctor.findings import Finding, Severity
from sftdoctor.triage.summaries import Located, Summary, _evidence, clip, where

KINDS = {"renamed-keyword-argument": ARGUMENT, "removed-import-name": IMPORT, "removed-attribute": ATTRIBUTE}
# What a message cut by a paste's wrap left on the line before the needle's: the class or object it names.
_OWNER_BEFORE = {
    ARGUMENT: re.compile(r"(?:(?P<owner>[\w.]+)\.)?(?P<func>\w+)\(\)(?: got(?: an)?)?\s*$"),
    ATTRIBUTE: re.compile(r"'(?P<owner>\w+)'(?: object)?\s*$|module '(?P<module>[\w.]+)'\s*$"),
    IMPORT: re.compile(r"cannot\s*$"),
}
# The call a Python < 3.10 TypeError came from (`__init__() got ...` names no class): the traceback's source line.
_CALL = re.compile(r"\b(?P<owner>[A-Z]\w*)\((?:[^()]*)$")
# How the logs print versions: `transformers==4.38.1`, `- TRL version: 0.22.2`, `- Transformers: 4.32.0`,
# `accelerate: 1.9.0`, `my accelerate library is 1.2.1`.
_VERSION = re.compile(
    r"(?i)(?<![\w/.-])(?P<package>trl|transformers|peft|accelerate)(?: version| library is)?"
    r"\s*(?:==|:|=)?\s*v?(?P<version>\d+\.\d+(?:\.\d+)?(?:\.?dev\d*|rc\d+)?)\b"
)


def versions_in(text: str) -> list[tuple[str, str]]:
    return [(m["package"].lower(), m["version"]) for m in _VERSION.finditer(text)]


def rename_of(sig_id: str, line, groups: dict[str, Any]) -> tuple[Rename, str] | None:
    """The table's row for a matched line, and "old" or "new"; None for a name the table does not hold."""
    kind = KINDS[sig_id]
    owner, module = groups.get("owner"), groups.get("module")
    if owner is None and module is None:
        owner, module = _named_before(kind, line)
    if kind == ARGUMENT and owner is None:
        owner = _caller(line)
    return lookup(kind, groups["name"], owner, module)


def _named_before(kind: str, line) -> tuple[str | None, str | None]:
    """The owner a wrapped message left at the end of the line before, if the match starts its line."""
    earlier = line.earlier(1)
    if not earlier or not (match := _OWNER_BEFORE[kind].search(earlier[0])):
        return None, None
    groups = match.groupdict()
    return groups.get("owner"), groups.get("module")


def _caller(line) -> str | None:
    """The class called on the traceback's last source line (`self.accelerator = Accelerator(`), for a TypeError
    that names only `__init__`."""
    for text in line.earlier(3):
        if text.lstrip().startswith("File "):
            return None
        if match := _CALL.search(text):
            return match["owner"]
    return None


class ApiRenames(Summary):
    """The first error whose name is in the rename table, with the versions the log printed."""

    def __init__(self):
        self.first = None
        self.count = 0
        self.versions: dict[str, str] = {}

    def add(self, sig, line, groups):
        if sig.role == "context":
            for package, version in versions_in(line.text):
                self.versions.setdefault(package, version)
            return
        found = rename_of(sig.id, line, groups)
        if found is None:
            return
        self.count += 1
        if self.first is None:
            self.first = (sig, line, found)

    def results(self, ctx):

        if self.first is None:
            return []
        sig, line, (row, side) = self.first
        logged, here = self.versions.get(row.library), installed_version(row.library)
        inside = [(pair, frame) for pair in PAIRS if pair.rename == row and (frame := _frame_in(line, pair.consumer))]
        seen = [
            f"the call is inside {pair.consumer} ({frame}): {pair.consumer} before {pair.fixed_in} uses it itself"
            + _shown(pair.consumer, self.versions)
            for pair, frame in inside
        ]
        times = f"; {self.count} times" if self.count > 1 else ""
        seen += [
            f"the log shows {row.library} {logged}" if logged else f"the log prints no {row.library} version",
            f"installed here: {row.library} {here}" if here else f"{row.library} is not installed here",
            f"first at {where(line)}{times}: {clip(line.text)}",
        ]
        specifics = {
            "library": row.library,
            "owner": row.owner,
            "old": row.old,
            "new": row.replacement,
            "side": side,
            "deprecated_in": row.deprecated,
            "removed_in": row.removed,
            "log_version": logged,
            "installed_here": here,
            "inside": inside[0][0].consumer if inside else None,
            "log_versions": dict(self.versions) or None,
            "source": row.source,
        }
        finding = Finding(
            Severity.ERROR,
            title(row, side),
            "; ".join(seen),
            fix(row, side, [p for p, _ in inside]),
            sig.topic,
            _evidence(sig, line, self.count, set(), specifics),
            sig.topic,
        )
        return [Located(line.number, "root", finding)]


def _frame_in(line, package: str) -> str | None:
    """The traceback's last frame, if it is in `package`'s files (`.../site-packages/transformers/trainer.py`)."""
    for text in line.earlier(4):
        if match := re.search(r'File "([^"]+)"', text) or re.search(r"^File (\S+\.py)", text.strip()):
            path = match[1].replace("\\", "/")
            return "/".join(path.split("/")[-2:]) if f"/{package}/" in path else None
    return None


def _shown(package: str, versions: dict[str, str]) -> str:
    return f" (the log shows {package} {versions[package]})" if package in versions else ""


def _named(row: Rename) -> str:
    if row.kind == IMPORT:
        return f"`{row.old}` (from {row.owner})"
    return f"`{row.old}=` of {row.owner}" if row.kind == ARGUMENT else f"`{row.owner}.{row.old}`"


def title(row: Rename, side: str) -> str:
    if side == "new":
        return (
            f"`{row.new}` is newer than this {row.library}: {row.library} {row.deprecated} introduced it (renamed "
            f"from `{row.old}`); an older {row.library} raises this"
        )
    when = [f"deprecated in {row.deprecated}"] if row.deprecated else []
    when += [f"removed in {row.removed}"] if row.removed else ["still accepted"]
    what = f"renamed {_named(row)} to `{row.new}`" if row.new else f"removed {_named(row)}"
    return f"{row.library} {what} ({', '.join(when)})"


def fix(row: Rename, side: str, inside: list) -> str:
    if side == "new":
        return (
            f"pip install '{row.library}>={row.deprecated}' (the code was written for it), or write `{row.old}` "
            f"for the {row.library} you have"
        )
    keep = f"pin {row.library}<{row.removed}" if row.removed else ""
    if inside:  # not the user's code: a version pair
        pair = inside[0]
        return f"pip install '{pair.consumer}>={pair.fixed_in}'" + (f", or {keep}" if keep else "")
    instead = f"write `{row.new}`" if row.new else (row.note or "drop it (no replacement)")
    maybe = [
        f"if the call is inside {p.consumer} (the traceback's last frame is in {p.consumer}, not your code), "
        f"upgrade {p.consumer} to >= {p.fixed_in}"
        for p in PAIRS
        if p.rename == row
    ]
    return "; ".join([instead + (f", or {keep}" if keep else ""), *maybe])
