"""The inner shape of each recorded fact the checks read, declared once: a replayed snapshot is held to it, so
a malformed one is bad input naming the fact and the place inside it, never a check that crashes.

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

SHAPES: dict[str, Any] = {
    "gpus": {
        "driver_version": OPT_VERSION,
        "cuda_version": OPT_VERSION,
        "devices": [
            {
                "index": OPT_INT,
                "name": OPT_STR,
                "uuid": OPT_STR,
                "pci_bus_id": OPT_STR,
                "compute_capability": OPT_VERSION,
                "memory_total_mib": OPT_COUNT,
                "nvlink_links_up": OPT_COUNT,
            }
        ],
    },
    "topology": {
        "source": OPT_STR,
        "devices": [str],
        "nics": {str: str},
        "links": {str: {str: str}},
        "incomplete": {str: str},
        "inconsistent": OPT_STR,
    },
    "flash_attn": {
        "installed": OPT_BOOL,
        "version": OPT_STR,
        "import_ok": OPT_BOOL,
        "import_error": OPT_STR,
        "wheel": OPT_STR,
    },
    "torch_build": {"version": OPT_VERSION, "cuda": OPT_VERSION, "hip": OPT_VERSION, "git_version": OPT_STR},
    "toolkit": {"cuda_home": OPT_STR, "nvcc": OPT_STR, "nvcc_version": OPT_VERSION, "found_by": OPT_STR},
    "rendezvous": {
        "master_addr": OPT_STR,
        "master_port": OPT_COUNT,
        "free_port": OPT_COUNT,
        "in_use": OPT_BOOL,
        "local": OPT_BOOL,
        "source": OPT_STR,
    },
    "slurm": {
        "job_id": str,
        "nnodes": OPT_COUNT,
        "node_id": OPT_COUNT,
        "nodelist": OPT_STR,
        "hosts": [str],
        "hosts_from": OPT_STR,
        "gpus_on_node": OPT_COUNT,
        "restart_count": OPT_COUNT,
    },
    "deepspeed_defaults": {"version": OPT_VERSION, "gradient_clipping": (float, None), "installed_ops": {str: bool}},
    "disk_space": {
        "output_dir": OPT_STR,
        "probed": OPT_STR,
        "free_bytes": OPT_COUNT,
        "total_bytes": OPT_COUNT,
        "error": OPT_STR,
    },
    "transformers_features": {str: (bool, str, None)},
    "env": {str: OPT_STR},
    "packages": {str: OPT_STR},
    "package_requires": {str: [str]},
}


REQUIRED = {"topology": ("devices", "links")}  # what the checks index without .get


def fact_problem(name: str, value: Any) -> tuple[str, str] | None:
    """(where inside the fact, what is wrong) for a recorded fact, or None."""
    missing = next((key for key in REQUIRED.get(name, ()) if isinstance(value, dict) and key not in value), None)
    if missing:
        return f".{missing}", "missing"
    found = problem(value, SHAPES[name]) if name in SHAPES else None
    if found is None and name == "topology":  # well-formed, but its rows may still disagree
        from sftdoctor.facts.topology import contradiction

        if pair := contradiction(value["links"]):
            found = ".links", f"{pair[0]}: {pair[1]}"
    return found


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
