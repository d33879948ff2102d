"""Every fact a check can ask for. A fact is declared once, beside its probe, in its module of sftdoctor.facts:

    @fact("gpus", "the driver, its CUDA, and each GPU (NVML or nvidia-smi)", shape={...})
    def probe_gpus(facts): ...

A probe derived from other facts names them, `@fact("data", ..., needs=("run",))`, and receives their values,
`def probe_data(facts, run)`: it runs only when they are all present (else the fact is absent, its why_missing).

A fact that no probe reads (a moment of a run, a job's ranks, a run's records) is declared with the same call
as a constant of the module whose records it is: `CURVES = fact("curves", "...", phase="postrun")`.

This module derives the catalogue from those declarations: it imports every module of the package (a new
one needs no registration) and collects them. The check registry holds each check to it (as pluggy holds a
hook implementation to its spec): a check that names a fact that does not exist, or one that only another
phase receives, is refused with a did-you-mean; a replayed snapshot is held to each fact's shape.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

PHASES = ("preflight", "runtime", "distributed", "postrun")
RUN_BY = {  # what hands each phase's facts to its checks (`sftdoctor explain plugins` says it)
    "preflight": "`sftdoctor check` and the gate of `train`",
    "runtime": "during training, whenever the run produces them",
    "distributed": "`sftdoctor check --distributed`",
    "postrun": "`sftdoctor report` and the end of `train`",
}
RUN_CONFIG = ("config",)
MODEL = ("config", "model_config")
DEEPSPEED = ("config", "deepspeed")
NOT_HERE = "not available on this machine"


class FactDeclarationError(Exception):
    """A fact declared twice, or declared wrong: raised when the catalogue is read, so that every test fails."""


@dataclass(frozen=True)
class Fact:
    name: str
    doc: str  # what the value is, one line
    phase: str = "preflight"  # the checks that receive it (PHASES)
    probe: Callable[[Any], Any] | None = None  # reads it, for a preflight fact: a function of the Facts
    inputs: tuple[str, ...] = ()  # Inputs fields it derives from: with one given, computed even in a replay
    why_missing: str = NOT_HERE
    is_object: bool = True  # a JSON object when recorded (a replayed snapshot is held to it)
    shape: Any = None  # the inner shape of its recorded value (facts.shapes' spec language); None: not held to one
    required: tuple[str, ...] = ()  # keys the checks index without .get: a recorded value must have them
    consistent: Callable[[Any], tuple[str, str] | None] | None = None  # (where, what) a well-formed value contradicts
    where: str = ""  # module:line of the declaration
    needs: tuple[str, ...] = ()  # facts its probe reads first: absent when one is, else handed to the probe

    def __call__(self, probe: Callable[..., Any]) -> Callable[[Any], Any]:
        """`@fact(...)` on a probe: the declaration, with its probe, is attached to the function."""
        probe = _given_needs(probe, self.needs) if self.needs else probe
        probe.__sftdoctor_fact__ = replace(self, probe=probe)
        return probe


def _given_needs(probe: Callable[..., Any], needs: tuple[str, ...]) -> Callable[[Any], Any]:
    """The probe as a function of the facts alone: every fact it needs is read (in order, each probed once), and
    with all of them present (not None, not empty) it is called as `probe(facts, *their values)`; else None."""

    @functools.wraps(probe)
    def read_needs_first(facts: Any) -> Any:
        values = [facts.get(name) for name in needs]
        return probe(facts, *values) if all(values) else None

    return read_needs_first


def fact(
    name: str,
    doc: str,
    *,
    phase: str = "preflight",
    inputs: tuple[str, ...] = (),
    why_missing: str = NOT_HERE,
    is_object: bool = True,
    shape: Any = None,
    required: tuple[str, ...] = (),
    consistent: Callable[[Any], tuple[str, str] | None] | None = None,
    needs: tuple[str, ...] = (),
) -> Fact:
    """Declare a fact: decorate its probe with it, or (no probe) assign it to a module constant. `needs` names
    the facts it derives from: without one of them it is absent, and its probe is not run."""
    if phase not in PHASES:
        raise FactDeclarationError(f"fact {name!r}: phase must be one of {PHASES}, not {phase!r}")
    caller = sys._getframe(1)  # where it is declared, to name both places of a name declared twice
    where = f"{caller.f_globals.get('__name__')}:{caller.f_lineno}"
    return Fact(
        name,
        doc,
        phase,
        None,
        tuple(inputs),
        why_missing,
        is_object,
        shape,
        tuple(required),
        consistent,
        where,
        tuple(needs),
    )


def declared_in(module: Any) -> list[Fact]:
    """The facts a module declares (a decorated probe, or a Fact constant), in the order of its namespace; one it
    imports from another module is the same declaration, which the catalogue counts once."""
    found = [getattr(value, "__sftdoctor_fact__", value) for value in vars(module).values()]
    return [f for f in found if isinstance(f, Fact)]


@functools.cache
def table() -> dict[str, Fact]:
    """Every declared fact by name, phase by phase: read from the modules of sftdoctor.facts, once."""
    import importlib
    import pkgutil

    import sftdoctor.facts as package

    found: dict[str, Fact] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        for declared in declared_in(importlib.import_module(f"{package.__name__}.{info.name}")):
            if declared.name in found and found[declared.name] != declared:
                raise FactDeclarationError(
                    f"fact {declared.name!r} is declared twice: at {found[declared.name].where} and at {declared.where}"
                )
            if (declared.probe is None) == (declared.phase == "preflight"):
                raise FactDeclarationError(
                    f"fact {declared.name!r} ({declared.where}): a preflight fact is declared on its probe "
                    "(@fact), a fact of another phase has none"
                )
            found[declared.name] = declared
    # phase by phase; the machine's facts before those of the run's configs (as `sftdoctor facts` prints them)
    order = sorted(found.values(), key=lambda f: (PHASES.index(f.phase), "config" in f.inputs))
    return {f.name: f for f in order}


def __getattr__(name: str) -> Any:
    if name == "CATALOGUE":  # the derived table, built when first read (its modules import this one)
        return table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fact_names(phase: str) -> list[str]:
    return [name for name, declared in table().items() if declared.phase == phase]


def unavailable_to(name: str, phase: str) -> str | None:
    """Why a check of `phase` cannot ask for the fact `name`, or None."""
    from sftdoctor.errors import did_you_mean

    declared = table().get(name)
    if declared is None:
        return f"asks for the fact {name!r}, which does not exist{did_you_mean(name, table())}"
    if declared.phase != phase:
        return f"asks for the fact {name!r}, which only {declared.phase} checks receive, not {phase} ones"
    return None
