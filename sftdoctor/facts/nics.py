"""The node's InfiniBand/RoCE ports as `ibstat` reports them: what an all-reduce across nodes can use."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from typing import Any

from sftdoctor.facts.catalogue import fact

_CA = re.compile(r"^CA '([^']+)'")
_PORT = re.compile(r"^\s+Port (\d+):")
_FIELD = re.compile(r"^\s+(State|Rate|Link layer):\s*(.*?)\s*$")


def parse_ibstat(text: str) -> dict[str, Any]:
    """{'ports': [{'ca', 'port', 'state', 'rate_gbps', 'link_layer'}]} from `ibstat` output."""
    ports: list[dict[str, Any]] = []
    ca = None
    for line in text.splitlines():
        if match := _CA.match(line):
            ca = match.group(1)
        elif (match := _PORT.match(line)) and ca:
            ports.append({"ca": ca, "port": int(match.group(1)), "state": None, "rate_gbps": None, "link_layer": None})
        elif (match := _FIELD.match(line)) and ports:
            key, value = match.groups()
            if key == "Rate":
                with contextlib.suppress(ValueError):
                    ports[-1]["rate_gbps"] = float(value)
            else:
                ports[-1][{"State": "state", "Link layer": "link_layer"}[key]] = value
    return {"ports": ports}


def active_gbps(nics: dict[str, Any] | None) -> float:
    return sum(p["rate_gbps"] or 0 for p in (nics or {}).get("ports", []) if p.get("state") == "Active")


@fact("nics", "InfiniBand/RoCE ports (`ibstat`)", why_missing="no `ibstat` (InfiniBand/RoCE tools) on this machine")
def probe_nics(facts) -> dict[str, Any] | None:
    if shutil.which("ibstat") is None:
        return None
    try:
        proc = subprocess.run(["ibstat"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"source": "ibstat", **parse_ibstat(proc.stdout)} if proc.returncode == 0 else None
