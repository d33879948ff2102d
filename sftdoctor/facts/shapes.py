"""The language of a recorded fact's inner shape, which its declaration gives (`@fact(..., shape=...)`, see
facts.catalogue): a replayed snapshot is held to it, so a malformed one is bad input naming the fact and the
place inside it, never a check that crashes.

A spec is a type (`str`, `int`, `float` for any number, `bool`), `VERSION` (a string like "12.4"), `COUNT`
(an integer >= 0), a tuple
of specs (any of them; `None` for null), a list of one spec (a list of such), `{str: spec}` (a mapping of
any keys) or a dict of named keys (each optional; others are allowed: a newer sftdoctor may record more).
"""

from __future__ import annotations

import re
from typing import Any

VERSION = re.compile(r"\d+(\.\d+)*([.+-]\w[\w.+-]*)?")
COUNT = "an integer >= 0"
OPT_STR, OPT_INT, OPT_BOOL, OPT_VERSION, OPT_COUNT = (
    (str, None),
    (int, None),
    (bool, None),
    (VERSION, None),
    (COUNT, None),
)


def fact_problem(name: str, value: Any) -> tuple[str, str] | None:
    """(where inside the fact, what is wrong) for a recorded fact, or None: held to its declaration's `required`
    keys, its `shape` and its `consistent` test (facts.catalogue)."""
    from sftdoctor.facts.catalogue import table

    declared = table().get(name)
    if declared is None:
        return None
    missing = next((key for key in declared.required if isinstance(value, dict) and key not in value), None)
    if missing:
        return f".{missing}", "missing"
    found = problem(value, declared.shape) if declared.shape is not None else None
    if found is None and declared.consistent is not None:  # well-formed, but its parts may still disagree
        found = declared.consistent(value)
    return found


def __getattr__(name: str) -> Any:
    if name == "SHAPES":  # each recorded fact's shape, as its declaration gives it
        from sftdoctor.facts.catalogue import table

        return {n: declared.shape for n, declared in table().items() if declared.shape is not None}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _name(spec: Any) -> str:
    if spec is None:
        return "null"
    if spec is VERSION:
        return "a version string"
    if spec is COUNT:
        return COUNT
    if isinstance(spec, tuple):
        return " or ".join(_name(s) for s in spec)
    if isinstance(spec, list):
        return "a list"
    if isinstance(spec, dict):
        return "an object"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}[spec]


def _fits(value: Any, spec: Any) -> bool:
    if spec is None:
        return value is None
    if spec is VERSION:
        return isinstance(value, str) and VERSION.fullmatch(value) is not None
    if spec is COUNT:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if isinstance(spec, tuple):
        return any(_fits(value, s) for s in spec)
    if isinstance(spec, list):
        return isinstance(value, list)
    if isinstance(spec, dict):
        return isinstance(value, dict)
    if spec is bool:
        return isinstance(value, bool)
    if spec is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, spec) and not isinstance(value, bool)


def problem(value: Any, spec: Any, where: str = "") -> tuple[str, str] | None:
    """(where inside the value, what is wrong), or None when `value` has the shape `spec` declares."""
    if not _fits(value, spec):
        return where, f"expected {_name(spec)}, got {value!r}"[:200]
    inner = next((s for s in spec if _fits(value, s)), None) if isinstance(spec, tuple) else spec
    if isinstance(inner, list):
        for i, item in enumerate(value):
            if found := problem(item, inner[0], f"{where}[{i}]"):
                return found
    elif isinstance(inner, dict) and list(inner) == [str]:
        for key, item in value.items():
            if found := problem(item, inner[str], f"{where}.{key}"):
                return found
    elif isinstance(inner, dict):
        for key, item_spec in inner.items():
            if key in value and (found := problem(value[key], item_spec, f"{where}.{key}")):
                return found
    return None
