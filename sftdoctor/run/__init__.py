"""The domain layer: the run config (typed, with provenance), resolve() -> Plan, and the memory model.

Below every other package of sftdoctor: it imports only sftdoctor.errors and sftdoctor.findings, and
nothing heavy."""

from sftdoctor.run.config import RunConfig, load_run_config, validate
from sftdoctor.run.resolve import Plan, for_launch, resolve

__all__ = ["Plan", "RunConfig", "for_launch", "load_run_config", "resolve", "validate"]
