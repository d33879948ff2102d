import json
from pathlib import Path

import pytest

from sftdoctor.checks import load_checks, run_check
from sftdoctor.facts import Facts
from sftdoctor.facts.gpus import parse_nvidia_smi
from sftdoctor.facts.topology import parse_topology

FIXTURES = Path(__file__).parent / "fixtures"


def index(kind: str) -> list[dict]:
    """The fixture index of a folder: each entry names its file and the public source it came from."""
    return json.loads((FIXTURES / kind / "index.json").read_text())


def fixture_text(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_text(encoding="utf-8")


def recorded_gpus(name: str) -> dict:
    """GPU facts from a real `nvidia-smi` output recorded in a public report."""
    return parse_nvidia_smi(fixture_text("nvidia_smi", name))


def recorded_topology(name: str) -> dict:
    return {"source": name, **parse_topology(fixture_text("topology", name), name)}


NO_GPU = {"source": None, "driver_version": None, "cuda_version": None, "devices": [],
          "error": "NVML: NVML Shared Library Not Found"}


@pytest.fixture(scope="session")
def registry():
    return load_checks(plugins=False)


@pytest.fixture
def run(registry):
    """Run one check on recorded facts; returns its findings (or a Skipped)."""

    def runner(check_id: str, **facts):
        return run_check(registry.checks[check_id], Facts.replay(facts))

    return runner


def severities(findings) -> list[str]:
    return [f.severity.value for f in findings]
