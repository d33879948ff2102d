"""Facts: what probes read from the machine, the installed stack and the run's configs.

Each fact is plain JSON. Probes run lazily, once, only for the facts a selected check
asks for, and fail soft: a missing driver is a fact (`{"error": ...}`), not a crash.
A saved snapshot (`sftdoctor facts > facts.json`) replays another machine's facts;
config files given on the command line are still read and override the snapshot.
"""

from __future__ import annotations

import datetime
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sftdoctor import __version__
from sftdoctor.errors import InputError, InputErrors

SCHEMA = 1


@dataclass(frozen=True)
class Inputs:
    """The files a user points sftdoctor at."""

    config: Path | None = None  # the trainer's run config (TOML)
    model_config: Path | None = None  # config.json or its folder
    deepspeed: Path | None = None  # DeepSpeed JSON
    topology: Path | None = None  # saved `nvidia-smi topo -m` text
    facts: Path | None = None  # saved facts snapshot to replay


def _probes() -> dict[str, Callable[["Facts"], Any]]:
    from sftdoctor.facts import configs, data, gpus, nics, packages, packing_probe, stack, system, topology
    from sftdoctor.plan import shape

    return {
        "packages": packages.probe_packages,
        "torch_build": packages.probe_torch_build,
        "deepspeed_defaults": packages.probe_deepspeed_defaults,
        "flash_attn": packages.probe_flash_attn,
        "gpus": gpus.probe_gpus,
        "topology": topology.probe_topology,
        "nics": nics.probe_nics,
        "toolkit": system.probe_toolkit,
        "env": system.probe_env,
        "rendezvous": system.probe_rendezvous,
        "run_config": configs.probe_run_config,
        "model_config": configs.probe_model_config,
        "deepspeed_config": configs.probe_deepspeed_config,
        "transformers_features": stack.probe_transformers_features,
        "data": data.probe_data,
        "packing_probe": packing_probe.probe_packing,
        "model_shape": shape.probe_model_shape,
        "cluster": lambda facts: None,  # every rank's record and the sweep: made by `check --distributed`
    }


# Facts that come from files the user names; these are read even when replaying a snapshot.
FROM_INPUTS = {
    "run_config": "config",
    "model_config": "model_config",
    "deepspeed_config": "deepspeed",
    "topology": "topology",
}


class Facts:
    """Lazily probed facts. `get(name)` returns the value, or None when unavailable."""

    def __init__(self, inputs: Inputs | None = None):
        self.inputs = inputs or Inputs()
        self._probes = _probes()
        self._values: dict[str, Any] = {}
        self._missing: dict[str, str] = {}  # fact name -> why it is unavailable
        self._replayed: dict[str, Any] | None = None
        self.host = platform.node()
        if self.inputs.facts is not None:
            self._load_snapshot(self.inputs.facts)

    @classmethod
    def replay(cls, values: dict[str, Any], inputs: Inputs | None = None) -> "Facts":
        """Facts from recorded values only: nothing on this machine is probed."""
        facts = cls(inputs)
        facts._replayed = dict(values)
        return facts

    def known(self, name: str) -> bool:
        return name in self._probes

    def get(self, name: str) -> Any:
        if name not in self._values and name not in self._missing:
            self._collect(name)
        return self._values.get(name)

    def why_missing(self, name: str) -> str:
        return self._missing.get(name, "")

    def _collect(self, name: str) -> None:
        if name not in self._probes:
            self._missing[name] = f"no probe provides the fact {name!r}"
            return
        if self._replayed is not None and not self._given_on_command_line(name):
            if self._replayed.get(name) is not None:
                self._values[name] = self._replayed[name]
            elif name in ("run_config", "model_config", "deepspeed_config", "data", "packing_probe"):  # config facts
                self._missing[name] = _NOT_GIVEN[name]
            else:
                self._missing[name] = f"not recorded in {self.inputs.facts or 'the replayed facts'}"
            return
        try:
            value = self._probes[name](self)
        except (InputError, InputErrors):
            raise  # bad input is the user's to fix: the CLI reports it and exits 2
        except Exception as exc:  # a probe bug must not sink the suite
            self._missing[name] = f"probe {name} failed: {type(exc).__name__}: {exc}"
            return
        if value is None:
            self._missing[name] = _NOT_GIVEN.get(name, "not available on this machine")
        else:
            self._values[name] = value

    def _given_on_command_line(self, name: str) -> bool:
        option = FROM_INPUTS.get(name)
        if option is None:
            return False
        if getattr(self.inputs, option) is not None:
            return True
        # A model or DeepSpeed config named inside the run config counts as given too, and so does
        # the model's shape, worked out here from it for the replayed GPUs.
        return name in ("model_config", "deepspeed_config", "model_shape") and self.inputs.config is not None

    def _load_snapshot(self, path: Path) -> None:
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(path, f"cannot read facts snapshot: {exc.strerror}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(path, f"expected a JSON facts snapshot (from `sftdoctor facts`): {exc}") from None
        facts = doc.get("facts") if isinstance(doc, dict) else None
        if not isinstance(facts, dict):
            raise InputError(path, "expected a JSON object with a 'facts' object (from `sftdoctor facts`)", key="facts")
        self._replayed = facts
        self.host = str(doc.get("host", "replayed"))

    def collected(self) -> dict[str, Any]:
        """The facts probed so far, as the JSON document `sftdoctor facts` prints."""
        return {
            "sftdoctor": __version__,
            "schema": SCHEMA,
            "host": self.host,
            "collected_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "facts": {name: self._values[name] for name in self._probes if name in self._values},
            "unavailable": dict(self._missing),
        }

    def snapshot(self) -> dict[str, Any]:
        """Probe everything, then return `collected()`."""
        for name in self._probes:
            self.get(name)
        return self.collected()


_NOT_GIVEN = {
    "run_config": "no run config given (--config)",
    "model_config": "no model config given (--model-config, or [model].path in --config)",
    "deepspeed_config": "no DeepSpeed config given (--deepspeed, or [deepspeed] in --config)",
    "topology": "no `nvidia-smi topo -m` available (give a saved one with --topology)",
    "torch_build": "torch is not installed",
    "deepspeed_defaults": "deepspeed is not installed",
    "transformers_features": "transformers is not installed",
    "data": "no run config given (--config)",
    "packing_probe": "packing is off, or no run config / model config to probe",
    "nics": "no `ibstat` (InfiniBand/RoCE tools) on this machine",
    "cluster": "only under `sftdoctor check --distributed` (every rank of a job)",
    "model_shape": "no model config, or no GPU to plan for (sftdoctor plan --gpu-memory plans for another machine)",
}
