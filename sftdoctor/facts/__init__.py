"""Facts: what probes read from the machine, the installed stack and the run's configs.

Each fact is plain JSON (the run config and the plan serialise themselves). Probes run lazily, once,
only for the facts a selected check asks for, and fail soft: a missing driver is a fact
(`{"error": ...}`), not a crash. Each probe declares the inputs it derives from (the run config, a
model config.json, a DeepSpeed JSON, a topology file): such a fact is computed from those inputs even
when the machine's facts are replayed from a snapshot (`sftdoctor facts > facts.json`, then
`sftdoctor check --facts facts.json --config RUN.toml`), so a replay judges exactly like the machine.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sftdoctor import __version__
from sftdoctor.errors import InputError, SftdoctorError, did_you_mean, loads_finite, parse_problem, read_text
from sftdoctor.facts.catalogue import table

SCHEMA = 2
READS = (1, 2)  # schema 1 named the run config "run_config"; it is derived from the inputs, so ignored
LEGACY = {"run_config"}


@dataclass(frozen=True)
class Inputs:
    """The files a user points sftdoctor at."""

    config: Path | None = None  # the trainer's run config (TOML)
    model_config: Path | None = None  # config.json or its folder
    deepspeed: Path | None = None  # DeepSpeed JSON
    fsdp: Path | None = None  # accelerate FSDP config (YAML)
    topology: Path | None = None  # saved `nvidia-smi topo -m` text
    facts: Path | None = None  # saved facts snapshot to replay


@dataclass(frozen=True)
class Probe:
    func: Callable[[Facts], Any]  # the fact's probe (its @fact declaration, facts.catalogue)
    inputs: tuple[str, ...] = ()  # Inputs fields it derives from: with one given, computed even in a replay
    why_missing: str = "not available on this machine"


def _probes() -> dict[str, Probe]:
    """The probe of each preflight fact in the catalogue."""
    return {name: Probe(fact.probe, fact.inputs, fact.why_missing) for name, fact in table().items() if fact.probe}


class Facts:
    """Lazily probed facts. `get(name)` returns the value, or None when unavailable."""

    def __init__(self, inputs: Inputs | None = None):
        self.inputs = inputs or Inputs()
        self.probes = _probes()
        self._values: dict[str, Any] = {}
        self._missing: dict[str, str] = {}  # fact name -> why it is unavailable
        self._replayed: dict[str, Any] | None = None
        self.host = platform.node()
        if self.inputs.facts is not None:
            self._replayed, self.host = load_snapshot(self.inputs.facts, self.probes)

    @classmethod
    def replay(cls, values: dict[str, Any], inputs: Inputs | None = None) -> Facts:
        """Facts from recorded values only: nothing on this machine is probed."""
        facts = cls(inputs)
        facts._replayed = dict(values)
        return facts

    def known(self, name: str) -> bool:
        return name in table()

    def get(self, name: str) -> Any:
        if name not in self._values and name not in self._missing:
            self._collect(name)
        return self._values.get(name)

    def why_missing(self, name: str) -> str:
        return self._missing.get(name, "")

    def derived_here(self, name: str) -> bool:
        """True when the fact is computed from inputs given to this command, replay or not."""
        probe = self.probes.get(name)
        return probe is not None and any(getattr(self.inputs, i) is not None for i in probe.inputs)

    def _collect(self, name: str) -> None:
        probe = self.probes.get(name)
        if self._replayed is not None and not self.derived_here(name):
            if self._replayed.get(name) is not None:
                self._values[name] = self._replayed[name]
            else:
                # a fact of the run's configs was not given; a machine's fact was not recorded
                self._missing[name] = (
                    probe.why_missing
                    if probe is not None and "config" in probe.inputs
                    else f"not recorded in {self.inputs.facts or 'the replayed facts'}"
                )
            return
        if probe is None:  # a fact of another phase (a run's moment, a job's ranks), or none at all
            declared = table().get(name)
            self._missing[name] = declared.why_missing if declared else f"no fact {name!r}"
            return
        try:
            value = probe.func(self)
        except SftdoctorError:
            raise  # bad input is the user's to fix: the CLI reports it and exits 2
        except Exception as exc:  # a probe bug must not sink the suite
            self._missing[name] = f"probe {name} failed: {type(exc).__name__}: {exc}"
            return
        if value is None:
            self._missing[name] = probe.why_missing
        else:
            self._values[name] = value

    def collected(self) -> dict[str, Any]:
        """The facts probed so far, as the JSON document `sftdoctor facts` prints."""
        return {
            "sftdoctor": __version__,
            "schema": SCHEMA,
            "host": self.host,
            "collected_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "facts": {name: _plain(self._values[name]) for name in self.probes if name in self._values},
            "unavailable": dict(self._missing),
        }

    def snapshot(self) -> dict[str, Any]:
        """Probe everything, then return `collected()`."""
        for name in self.probes:
            self.get(name)
        return self.collected()


def _plain(value: Any) -> Any:
    return value.to_json() if hasattr(value, "to_json") else value


def load_snapshot(path: Path, probes: dict[str, Probe]) -> tuple[dict[str, Any], str]:
    from sftdoctor.facts.shapes import fact_problem

    """(recorded machine facts, host) from `sftdoctor facts` output, or from `check --json` output (whose
    "facts" holds the snapshot). Facts derived from inputs are dropped: they are computed from the inputs
    given now. The schema and every fact's name and type are checked: a bad snapshot is bad input."""
    text = read_text(path, "facts snapshot")
    try:
        doc = loads_finite(text, path)
    except (ValueError, RecursionError) as exc:
        raise InputError(
            path, f"expected a JSON facts snapshot (from `sftdoctor facts`): {parse_problem(exc)}"
        ) from None
    if isinstance(doc, dict) and "findings" in doc and isinstance(doc.get("facts"), dict):
        doc = doc["facts"]  # a `check --json` document
    if not isinstance(doc, dict) or not isinstance(doc.get("facts"), dict):
        raise InputError(path, "expected a JSON object with a 'facts' object (from `sftdoctor facts`)", key="facts")
    schema = doc.get("schema")
    if schema not in READS:
        raise InputError(
            path,
            f"facts snapshot schema {schema!r}; this sftdoctor reads schema "
            f"{' or '.join(map(str, READS))} (take it again with `sftdoctor facts`)",
            key="schema",
        )
    recorded: dict[str, Any] = {}
    for name, value in doc["facts"].items():
        if name in LEGACY:
            continue
        fact = table().get(name)
        if fact is None:
            raise InputError(
                path,
                f"unknown fact{did_you_mean(name, table())}; known facts: {', '.join(probes)}",
                key=f"facts.{name}",
            )
        if "config" in fact.inputs:
            continue  # derived from the run's configs: computed from what is given now
        if value is not None and fact.is_object and not isinstance(value, dict):
            raise InputError(path, f"expected an object, got {type(value).__name__}", key=f"facts.{name}")
        found = fact_problem(name, value) if value is not None else None
        if found:
            raise InputError(path, found[1], key=f"facts.{name}{found[0]}")
        recorded[name] = value
    return recorded, str(doc.get("host", "replayed"))


class Overlay:
    """Facts with some values replaced (`sftdoctor plan` for another machine): anything else comes from `base`."""

    def __init__(self, base: Facts, **values: Any):
        self.base, self.values = base, values

    def get(self, name: str) -> Any:
        return self.values[name] if name in self.values else self.base.get(name)
