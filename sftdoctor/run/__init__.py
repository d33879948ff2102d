"""The domain layer: the run config (typed, with provenance), decide() -> Plan, and the memory model.

Below every other package of sftdoctor: it imports only sftdoctor.errors and sftdoctor.findings, and
nothing heavy. Its names are imported when first used (PEP 562): importing one of its small modules
(run.gpus, run.schedule) must not cost the run config's parser and the resolver, which a plain
`sftdoctor check` never needs (tests/test_import_cost.py)."""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {
    "RunConfig": "config",
    "load_run_config": "config",
    "validate": "config",
    "Plan": "resolve",
    "decide": "resolve",
    "for_launch": "resolve",
}
__all__ = sorted(_FROM)
TORCHRUN_DEFAULT_PORT = 29500  # torchrun's --master-port: here, as the rendezvous probe of a plain `check` reads it


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_FROM[name]}"), name)
