"""gpu-topology: how the GPUs talk to each other, from `nvidia-smi topo -m` (and NVML)."""

from __future__ import annotations

import dataclasses
from itertools import combinations
from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.facts.topology import PATH_RANK, gpu_names, link, nvlink_count, path_kind
from sftdoctor.findings import info, ok, warning

PATH_WORDS = {
    "PIX": "one PCIe switch",
    "PXB": "several PCIe switches",
    "PHB": "a PCIe host bridge (the CPU)",
    "NODE": "PCIe host bridges within one NUMA node",
    "SYS": "PCIe and the inter-socket link (QPI/UPI)",
}


def visible_gpus(topology: dict[str, Any], env: dict[str, str] | None) -> list[str]:
    """The GPUs a run will use: CUDA_VISIBLE_DEVICES (indexes) narrows the matrix's list."""
    names = gpu_names(topology)
    visible = (env or {}).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names
    picked = [f"GPU{i.strip()}" for i in visible.split(",") if i.strip().isdecimal()]
    return [n for n in picked if n in names] if picked else names


def nvlink_islands(gpus: list[str], pairs: dict[tuple[str, str], str]) -> list[list[str]]:
    """Groups of GPUs connected through NVLink hops (connected components)."""
    parent = {g: g for g in gpus}

    def root(g: str) -> str:
        while parent[g] != g:
            g = parent[g]
        return g

    for (a, b), code in pairs.items():
        if path_kind(code) == "NV":
            parent[root(a)] = root(b)
    islands: dict[str, list[str]] = {}
    for g in gpus:
        islands.setdefault(root(g), []).append(g)
    return list(islands.values())


def _p2p_env(env: dict[str, str]) -> list:
    out = []
    if env.get("NCCL_P2P_DISABLE", "0") not in ("0", ""):
        out.append(
            warning(
                "NCCL_P2P_DISABLE is set: NCCL will not use NVLink or PCIe peer-to-peer",
                detail="All GPU-to-GPU traffic is staged through host memory, several times slower. It is a "
                "workaround for boards where P2P hangs (some consumer GPUs, PCIe ACS on); fix the cause instead.",
                fix="unset NCCL_P2P_DISABLE; if P2P really hangs, disable ACS or use NCCL_P2P_LEVEL=PXB to keep P2P "
                "where it works",
                evidence={"NCCL_P2P_DISABLE": env["NCCL_P2P_DISABLE"]},
                id="gpu-topology/p2p-disabled",
                explain="gpu-topology#p2p-disabled",
            )
        )
    level = env.get("NCCL_P2P_LEVEL")
    if level in ("LOC", "0"):
        out.append(
            warning(
                f"NCCL_P2P_LEVEL={level} disables peer-to-peer everywhere",
                fix="unset NCCL_P2P_LEVEL",
                evidence={"NCCL_P2P_LEVEL": level},
                id="gpu-topology/p2p-level",
                explain="gpu-topology#p2p-disabled",
            )
        )
    return out


def _allreduce_seconds(gb_per_s: float, gpus: int, params_billion: float = 7.0) -> float:
    """Ring all-reduce of bf16 gradients: each GPU sends 2(n-1)/n of the buffer."""
    return 2 * params_billion * 2 * (gpus - 1) / gpus / gb_per_s


@check(
    "gpu-topology",
    "NVLink vs PCIe paths between every GPU pair; NCCL peer-to-peer settings",
    messages={
        "inconsistent-matrix": "the topology matrix contradicts itself",
        "pcie": "GPUs, or NVLink islands, that reach each other only over PCIe",
        "pairs-unknown": "the matrix does not show some GPU pairs",
        "partial-nvlink": "some GPU pairs are not linked directly, though NVLink reaches every GPU",
        "p2p-disabled": "NCCL_P2P_DISABLE turns peer-to-peer off",
        "p2p-level": "NCCL_P2P_LEVEL turns peer-to-peer off everywhere",
    },
)
def gpu_topology(
    topology: dict[str, Any] | None = None, gpus: dict[str, Any] | None = None, env: dict[str, str] | None = None
):
    env = env or {}
    if topology is not None and topology.get("inconsistent"):
        return [_inconsistent(topology)] + _p2p_env(env)
    if topology is None:
        return [_nvlink_without_matrix((gpus or {}).get("devices") or [])] + _p2p_env(env)
    names = visible_gpus(topology, env)
    if len(names) < 2:
        return [ok("one GPU in use: no GPU-to-GPU traffic")] + _p2p_env(env)
    verdict = _links_verdict(topology, names)
    if incomplete := {row: what for row, what in topology.get("incomplete", {}).items() if row in names}:
        verdict = _noting_incomplete(verdict, incomplete)
    return [verdict] + _p2p_env(env)


def _nvlink_without_matrix(devices: list[dict[str, Any]]):
    """With no matrix, only NVML's link counts: NVLink up on every GPU is all that can be said."""
    if len(devices) < 2:
        raise NotApplicable("fewer than two GPUs and no topology matrix")
    links = [d.get("nvlink_links_up") for d in devices]
    if all(isinstance(n, int) and n > 0 for n in links):
        return ok(
            f"NVLink up on all {len(devices)} GPUs ({min(links)}-{max(links)} links each; "
            "no topology matrix to check pairs)"
        )
    raise NotApplicable("no `nvidia-smi topo -m` matrix (give one with --topology)")


def _links_verdict(topology: dict[str, Any], names: list[str]):
    """One finding on the paths between every pair of the GPUs in use."""
    known = {(a, b): link(topology, a, b) for a, b in combinations(names, 2)}
    unknown = [pair for pair, code in known.items() if code is None]
    pairs = {pair: code for pair, code in known.items() if code is not None}
    kinds = {pair: path_kind(code) for pair, code in pairs.items()}
    evidence = {"gpus": names, "pairs": {f"{a}-{b}": c for (a, b), c in pairs.items()}}
    unlinked = [p for p in pairs if kinds[p] != "NV"]
    unlinked_text = _pairs_text(unlinked, pairs)
    # A pair the matrix does not show may be NVLink: islands that stay apart even so are certain.
    if len(nvlink_islands(names, {**pairs, **{pair: "NV" for pair in unknown}})) > 1:
        worst = max((kinds[p] for p in unlinked), key=lambda k: PATH_RANK.get(k, 9))
        return _pcie_warning(names, nvlink_islands(names, pairs), unlinked_text, worst, evidence)
    if unknown:
        return _pairs_unknown(unknown, len(known), len(pairs) - len(unlinked), unlinked, unlinked_text, evidence)
    if not unlinked:
        counts = sorted({nvlink_count(c) for c in pairs.values()})
        return ok(
            f"all {len(pairs)} pairs of {len(names)} GPUs linked by NVLink ({'/'.join(f'NV{c}' for c in counts)})",
            evidence=evidence,
        )
    return info(
        f"partial NVLink: {len(unlinked)} of {len(pairs)} GPU pairs are not directly linked",
        detail=f"Not linked: {unlinked_text}. Every GPU still reaches every other over NVLink hops "
        "(e.g. a V100 hybrid cube mesh), so NCCL builds its rings over NVLink and all-reduce "
        "keeps NVLink speed; point-to-point traffic between unlinked pairs is slower.",
        evidence=evidence,
        id="gpu-topology/partial-nvlink",
    )


def _pairs_unknown(unknown, pairs: int, linked: int, unlinked, unlinked_text: str, evidence):
    return info(
        f"cannot judge {len(unknown)} of {pairs} GPU pairs: the matrix does not show them",
        detail=f"Not shown: {_pairs_text(unknown, {})}. Of the pairs it shows, {linked} are NVLink"
        + (f" and these are not: {unlinked_text}" if unlinked else "")
        + ".",
        fix="paste the whole output of `nvidia-smi topo -m` (or give the file with --topology)",
        evidence={**evidence, "unknown_pairs": [f"{a}-{b}" for a, b in unknown]},
        id="gpu-topology/pairs-unknown",
    )


def _inconsistent(topology: dict[str, Any]):
    """The driver's own matrix contradicts itself: no link is judged from it (nor from NVML's link counts, which
    say nothing of which GPU each link reaches)."""
    return warning(
        f"{topology.get('source') or 'the topology matrix'} contradicts itself: NVLink and PCIe paths not judged",
        detail=f"{topology['inconsistent']}. A matrix whose rows disagree cannot say which GPU pairs are linked.",
        fix="run `nvidia-smi topo -m` again (and `nvidia-smi nvlink -s` for each GPU's links); if it still disagrees, "
        "update the driver or report it to NVIDIA; give a corrected copy with --topology",
        evidence={"source": topology.get("source"), "inconsistent": topology["inconsistent"]},
        id="gpu-topology/inconsistent-matrix",
    )


def _pairs_text(pairs: list[tuple[str, str]], codes: dict[tuple[str, str], str]) -> str:
    named = [f"{a}-{b}" + (f" {codes[(a, b)]}" if (a, b) in codes else "") for a, b in pairs[:12]]
    return ", ".join(named) + (f" and {len(pairs) - 12} more" if len(pairs) > 12 else "")


def _noting_incomplete(finding, incomplete: dict[str, str]):
    """The verdict, saying which rows of a pasted matrix were missing or cut and where their pairs came from."""
    rows = "; ".join(f"{row}: {what}" for row, what in incomplete.items())
    note = (
        f"The matrix is incomplete ({rows}); those rows' pairs were read from their columns in the other rows "
        "(the matrix is symmetric)."
    )
    return dataclasses.replace(
        finding, detail=f"{finding.detail} {note}".strip(), evidence={**finding.evidence, "incomplete": incomplete}
    )


def _pcie_warning(names, islands, unlinked_text, worst, evidence):
    n = len(names)
    slow, fast = _allreduce_seconds(25, n), _allreduce_seconds(250, n)
    if all(len(island) == 1 for island in islands):
        title = f"no NVLink between the {n} GPUs: gradients are all-reduced over PCIe (worst path {worst})"
    else:
        groups = " | ".join(",".join(g.removeprefix("GPU") for g in island) for island in islands)
        title = f"NVLink islands [{groups}]: traffic between them crosses PCIe (worst path {worst})"
    detail = (
        f"Paths: {unlinked_text}. The worst crosses {PATH_WORDS.get(worst, worst)}. A ring all-reduce of a "
        f"7B model's bf16 gradients moves about {2 * 14 * (n - 1) / n:.0f} GB per GPU per optimizer step: "
        f"~{slow:.1f} s at a practical 25 GB/s of PCIe 4.0 x16 against ~{fast:.2f} s over NVLink."
    )
    if worst == "SYS":
        detail += (
            " Peer-to-peer across CPU sockets is often unsupported, so NCCL stages that traffic through host memory."
        )
    return warning(
        title,
        detail=detail,
        fix="raise gradient accumulation so each all-reduce serves more tokens; keep ZeRO-2 overlap_comm on "
        "(DeepSpeed >= 0.19.0: older releases corrupt gradients with it, see known-bad-versions); "
        "for multi-GPU jobs on a subset, pick GPUs of one island/switch with CUDA_VISIBLE_DEVICES",
        evidence=evidence,
        id="gpu-topology/pcie",
        explain="gpu-topology#pcie",
    )
