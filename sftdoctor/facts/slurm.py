"""Slurm's view of the job, when sftdoctor runs inside an allocation (SLURM_JOB_ID set): how many nodes,
which one this is, the first node's name, the GPUs per node. `srun sftdoctor train RUN.toml` (one task per
node) is then the whole launch: run.resolve takes the launch from this fact where the run config is silent.

Variables as Slurm 22-24 sets them for a batch script and for each task of `srun` (sbatch(1), srun(1)):
SLURM_JOB_ID, SLURM_NNODES (SLURM_JOB_NUM_NODES), SLURM_NODEID (the node's index in the allocation),
SLURM_JOB_NODELIST (compressed, "gpu[01-04,07]"), SLURM_GPUS_ON_NODE. The node list is expanded with
`scontrol show hostnames` as Slurm documents, or read here when scontrol is not on the PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.shapes import OPT_COUNT, OPT_STR

SCONTROL_TIMEOUT_S = 10


def expand_nodelist(text: str) -> list[str]:
    """Slurm's hostlist expression, expanded: "gpu[01-03,07],login5" -> gpu01 gpu02 gpu03 gpu07 login5.
    Zero padding is kept (01-03), several bracket groups multiply (a[1-2]b[3-4]), commas and blanks separate.
    Raises ValueError on what Slurm 22-24 refuses ("Invalid hostlist"): a backwards, empty or non-numeric
    range, an unclosed, nested or stray bracket, text after a name's last bracket group."""
    hosts: list[str] = []
    for part in _parts(text):
        if (
            part.count("[") != part.count("]")
            or re.search(r"\[[^\]]*\[|\][^\[]*\]", part)
            or part.find("]") < part.find("[")
        ):
            raise ValueError(f"unbalanced brackets in {part!r}")
        if "]" in part and not part.endswith("]"):
            raise ValueError(f"text after the last bracket group in {part!r}")
        names = [""]
        for literal, group in re.findall(r"([^\[]*)\[([^\]]*)\]", part) or [(part, None)]:
            choices = [literal + item for item in _range(group)] if group is not None else [literal]
            names = [name + choice for name in names for choice in choices]
        hosts += names
    return hosts


def _parts(text: str) -> list[str]:
    """The comma- or blank-separated names of a hostlist, commas inside brackets kept."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char == "[") - (char == "]")
        if depth == 0 and (char == "," or char.isspace()):
            parts.append(current)
            current = ""
        else:
            current += char
    return [part for part in parts + [current] if part]


def _range(group: str) -> list[str]:
    items = []
    for piece in group.split(","):
        low, dash, high = piece.partition("-")
        if not low.isdecimal() or (dash and not high.isdecimal()):
            raise ValueError(f"invalid range {piece!r}")
        if not dash:
            items.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"backwards range {piece!r}")
        items += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return items


def hostnames(nodelist: str) -> tuple[list[str], str]:
    """(hosts, how they were read); no hosts and the reason when the list is one Slurm would refuse."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S
            )
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split(), "scontrol show hostnames"
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        return expand_nodelist(nodelist), "parsed"
    except ValueError as error:
        return [], f"unreadable SLURM_JOB_NODELIST {nodelist!r}: {error}"


def _int(value: str | None) -> int | None:
    return int(value) if value and value.strip().isdecimal() else None


@fact(
    "slurm",
    "the Slurm allocation this runs in: job, nodes, hosts",
    why_missing="not inside a Slurm allocation (SLURM_JOB_ID is not set)",
    shape={
        "job_id": str,
        "nnodes": OPT_COUNT,
        "node_id": OPT_COUNT,
        "nodelist": OPT_STR,
        "hosts": [str],
        "hosts_from": OPT_STR,
        "gpus_on_node": OPT_COUNT,
        "restart_count": OPT_COUNT,
    },
)
def probe_slurm(facts) -> dict[str, Any] | None:
    env = os.environ
    if not env.get("SLURM_JOB_ID"):
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts, how = hostnames(nodelist) if nodelist else ([], "no SLURM_JOB_NODELIST")
    gpus = env.get("SLURM_GPUS_ON_NODE")
    return {
        "job_id": env["SLURM_JOB_ID"],
        "nnodes": _int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")),
        "node_id": _int(env.get("SLURM_NODEID")),
        "nodelist": nodelist,
        "hosts": hosts,
        "hosts_from": how,
        "gpus_on_node": _int(gpus.split("(")[0].split(":")[-1]) if gpus else None,  # "4", or "a100:4" in some sites
        "restart_count": _int(env.get("SLURM_RESTART_COUNT")) or 0,  # how often the job was requeued
    }
