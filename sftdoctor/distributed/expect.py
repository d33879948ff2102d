"""What a node's GPU links promise for an all-reduce: the bus bandwidth (nccl-tests' `busbw`,
algbw x 2(n-1)/n) a ring over them should reach, read from `nvidia-smi topo -m` and the GPU generation.

NCCL builds its rings over NVLink when every GPU can be reached that way, and spreads them over all
of a GPU's links; otherwise the ring crosses PCIe, and its slowest hop (through a PCIe switch, a host
bridge, or between CPU sockets) sets the pace. Real runs of nccl-tests reach about 80% of the links'
unidirectional rate (e.g. ~230-240 GB/s on a DGX A100's 12 x 25 GB/s).
"""

from __future__ import annotations

from typing import Any

from sftdoctor.facts.topology import gpu_names, link, nvlink_count, path_kind

EFFICIENCY = 0.8
# GB/s per NVLink per direction, by compute capability: NVLink 1 (P100), 2 (V100), 3 (A100; the RTX 30
# bridge's links are 14.0625), 4 (H100/H200), 5 (B200).
NVLINK_GBPS = {"6.0": 20.0, "7.0": 25.0, "8.0": 25.0, "8.6": 14.0625, "9.0": 25.0, "10.0": 50.0}
# Achievable GB/s per direction of an x16 link: PCIe 3 (~12 of 15.8), 4 (~24), 5 (~48).
PCIE_GBPS = {3: 12.0, 4: 24.0, 5: 48.0}
# Share of the PCIe rate a hop keeps: through a switch, a host bridge, across NUMA nodes, across sockets.
PATH_SHARE = {"PIX": 1.0, "PXB": 1.0, "PHB": 0.8, "NODE": 0.8, "SYS": 0.5}


def pcie_generation(compute_capability: str | None) -> int:
    """The PCIe generation of a GPU generation's boards: Ampere/Ada gen 4, Hopper and later gen 5."""
    try:
        major, minor = (int(x) for x in (compute_capability or "0.0").split("."))
    except ValueError:
        return 3
    if major >= 9:
        return 5
    return 4 if major == 8 else 3


def _nvlinks_per_gpu(topology: dict[str, Any], gpus: list[str]) -> dict[str, int]:
    """NVLinks of each GPU. Behind an NVSwitch every pair shows the GPU's whole count (NV12 on a DGX
    A100), so equal counts to every other GPU mean a switch; direct links (a DGX-1) add up."""
    out = {}
    for gpu in gpus:
        counts = [nvlink_count(link(topology, gpu, other) or "") for other in gpus if other != gpu]
        switch = len(counts) >= 2 and min(counts) > 0 and len(set(counts)) == 1
        out[gpu] = counts[0] if switch else sum(counts)
    return out


def _nvlink_ring(topology: dict[str, Any], gpus: list[str]) -> bool:
    """Whether the NVLink graph joins every GPU (NCCL can then ring over NVLink alone)."""
    reached, frontier = {gpus[0]}, [gpus[0]]
    while frontier:
        gpu = frontier.pop()
        for other in gpus:
            if other not in reached and nvlink_count(link(topology, gpu, other) or "") > 0:
                reached.add(other)
                frontier.append(other)
    return len(reached) == len(gpus)


def intra_node(topology: dict[str, Any], compute_capability: str | None) -> dict[str, Any] | None:
    """{'busbw_gbps', 'via', 'why'} for an all-reduce over every GPU of the node; None for one GPU."""
    gpus = gpu_names(topology)
    if len(gpus) < 2:
        return None
    if _nvlink_ring(topology, gpus):
        per_link = NVLINK_GBPS.get(compute_capability or "", 25.0)
        links = _nvlinks_per_gpu(topology, gpus)
        slowest = min(links, key=links.get)
        rate = links[slowest] * per_link
        return {
            "busbw_gbps": round(rate * EFFICIENCY, 1),
            "via": "nvlink",
            "why": f"{links[slowest]} NVLinks x {per_link:g} GB/s on {slowest} (the fewest), x {EFFICIENCY}",
        }
    generation = pcie_generation(compute_capability)
    paths = {path_kind(link(topology, a, b) or "SYS") for a in gpus for b in gpus if a < b}
    worst = max((p for p in paths if p in PATH_SHARE), key=lambda p: -PATH_SHARE[p], default="PIX")
    rate = PCIE_GBPS[generation] * PATH_SHARE[worst]
    return {
        "busbw_gbps": round(rate * EFFICIENCY, 1),
        "via": "pcie",
        "why": f"PCIe {generation} x16 ({PCIE_GBPS[generation]:g} GB/s) through {worst} "
        f"(x {PATH_SHARE[worst]}), x {EFFICIENCY}",
    }


def inter_node(nics: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a node's active InfiniBand/RoCE ports promise across nodes: NCCL spreads its rings over all of
    them, so about 80% of their summed rate (e.g. 8 x 200 Gb/s HDR: ~160 GB/s)."""
    from sftdoctor.facts.nics import active_gbps

    gbps = active_gbps(nics)
    if not gbps:
        return None
    ports = sum(1 for p in nics["ports"] if p.get("state") == "Active")
    return {
        "busbw_gbps": round(gbps / 8 * EFFICIENCY, 1),
        "via": "network",
        "why": f"{ports} active InfiniBand/RoCE port{'s' if ports > 1 else ''}, {gbps:g} Gb/s in all, x {EFFICIENCY}",
    }
