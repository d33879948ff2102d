"""What the training stack's libraries declare they need of each other (their METADATA's Requires-Dist), and a
small reader of those requirement strings: enough of PEP 508/440 for `transformers>=4.56.2`, `accelerate>=1.4.0,<2`
and `peft; extra == "peft"`, without importing `packaging` into the CLI."""

from __future__ import annotations

import re

from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.distributions import normalize, requires
from sftdoctor.facts.renames import STACK
from sftdoctor.run.gpus import version_tuple

_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?(?P<spec>[^;()]*)\)?"
    r"\s*(?:;(?P<marker>.*))?$"
)
_CLAUSE = re.compile(r"^\s*(?P<op>~=|===|==|!=|<=|>=|<|>)\s*(?P<version>[\w.*+!-]+)\s*$")


@fact(
    "package_requires",
    "what trl, transformers, peft and accelerate declare they need (Requires-Dist): name -> requirement strings",
    why_missing="none of trl, transformers, peft, accelerate is installed",
    shape={str: [str]},
)
def probe_package_requires(facts) -> dict[str, list[str]]:
    """name -> its Requires-Dist lines, for each library of the rename table that is installed."""
    found = {name: lines for name in STACK if (lines := requires(name)) is not None}
    return found or None


def requirement_on(lines: list[str], provider: str) -> tuple[str, str | None] | None:
    """(version specifier, extra) that `lines` put on `provider`: the plain requirement if there is one, else the
    first under an extra (transformers asks for accelerate only in its `torch` extra); "" for no bound; None if
    `provider` is not required at all."""
    found = None
    for line in lines or ():
        match = _REQUIREMENT.match(line)
        if not match or normalize(match["name"]) != normalize(provider):
            continue
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", match["marker"] or "")
        if extra is None:
            return match["spec"].strip(), None
        found = found or (match["spec"].strip(), extra[1])
    return found


def satisfies(version: str | None, spec: str) -> bool | None:
    """Whether `version` meets every clause of `spec` (None when the version or a clause cannot be read).
    Pre-release and local parts are ignored: 5.0.0.dev0 counts as 5.0.0."""
    have = version_tuple(version)
    if have is None:
        return None
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        match = _CLAUSE.match(clause)
        if not match:
            return None
        op, text = match["op"], match["version"]
        if text.endswith(".*"):
            prefix = version_tuple(text[:-2])
            equal = prefix is not None and have[: len(prefix)] == prefix
            if (op == "==" and not equal) or (op == "!=" and equal):
                return False
            continue
        want = version_tuple(text)
        if want is None:
            return None
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        ok = {
            "==": a == b,
            "===": a == b,
            "!=": a != b,
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
            "~=": a >= b and a[: len(want) - 1] == b[: len(want) - 1],
        }[op]
        if not ok:
            return False
    return True
