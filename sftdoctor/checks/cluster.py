"""Checks over every rank of a job (`sftdoctor check --distributed`): the fact `cluster` holds each
rank's record (versions, node, the GPU it will use) and the all-reduce sweep (sftdoctor.distributed.command)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import Finding, Severity, error, info, ok, warning

# What must agree across ranks, with how a person names it. Versions of the stack, the driver and
# the NCCL wheel torch loads (a node with another NCCL hangs or errs in the first collective).
AGREE = (
    ("torch", "torch"),
    ("cuda", "torch's CUDA build"),
    ("nccl", "NCCL"),
    ("driver", "NVIDIA driver"),
    ("transformers", "transformers"),
    ("trl", "TRL"),
    ("deepspeed", "DeepSpeed"),
    ("accelerate", "accelerate"),
    ("gpu_name", "GPU model"),
    ("gpu_memory_mib", "GPU memory (MiB)"),
)
SLOW = 0.5  # a link measured below this share of what its topology promises is a warning
FIXES = {
    "nvlink": "NVLink not used: unset NCCL_P2P_DISABLE, NCCL_P2P_LEVEL=NVL; see the gpu-topology finding",
    "pcie": "PCIe peer-to-peer blocked or slowed: ACS on the PCIe switches, IOMMU passthrough, NCCL_P2P_LEVEL",
    "network": "NCCL picked a slow interface: NCCL_SOCKET_IFNAME / NCCL_IB_HCA, GPUDirect RDMA (nvidia-peermem)",
}


def _where(records: list[dict[str, Any]]) -> str:
    by_node: dict[str, list[int]] = {}
    for r in records:
        by_node.setdefault(r["node"], []).append(r["rank"])
    return "; ".join(
        f"node {node} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))})"
        for node, ranks in sorted(by_node.items())
    )


@check(
    "cluster-consistency",
    "every rank runs the same stack and owns a GPU of its own",
    phase="distributed",
    messages={
        "stack-differs": "a part of the stack differs across ranks",
        "no-own-gpu": "a rank has no GPU of its own",
        "shared-gpu": "ranks would share one GPU",
    },
)
def cluster_consistency(cluster: dict[str, Any]):
    ranks = cluster["ranks"]
    findings = []
    for key, label in AGREE:
        values = Counter(str(r.get(key)) for r in ranks)
        if len(values) < 2:
            continue
        (common, most), (_, next_most) = values.most_common(2)
        odd = [r for r in ranks if str(r.get(key)) != common]
        seen = ", ".join(f"{v} on {n} rank{'s' if n > 1 else ''}" for v, n in values.most_common())
        # A tie has no "rest" to blame: name every side.
        where = (
            f"{_where(ranks)} disagree"
            if most == next_most
            else f"{_where(odd)} differ{'s' if len(odd) == 1 else ''} from the rest"
        )
        findings.append(
            error(
                f"{label} differs across ranks: {where}",
                detail=f"{label}: {seen}.",
                fix=f"install the same {label} on every node (same image or environment), then rerun",
                evidence={"key": key, "values": dict(values), "odd_ranks": [r["rank"] for r in odd]},
                id="cluster-consistency/stack-differs",
            )
        )
    findings += _shared_gpus(ranks)
    if findings:
        return findings
    nodes = len({r["node"] for r in ranks})
    first = ranks[0]
    stack = ", ".join(f"{label} {first.get(key)}" for key, label in AGREE[:4] if first.get(key))
    return ok(f"{len(ranks)} ranks on {nodes} node{'s' if nodes > 1 else ''} agree: {stack}")


def _shared_gpus(ranks: list[dict[str, Any]]) -> list[Finding]:
    findings, by_device = [], {}
    for r in ranks:
        if r.get("gpu") is None and r.get("gpus_visible"):
            findings.append(
                error(
                    f"rank {r['rank']} (node {r['node']}) has no GPU of its own: local rank "
                    f"{r['local_rank']} of {r['gpus_visible']} visible",
                    fix="launch at most one process per visible GPU (--nproc-per-node)",
                    evidence={"rank": r["rank"], "visible": r["gpus_visible"]},
                    id="cluster-consistency/no-own-gpu",
                )
            )
        elif r.get("gpu"):
            by_device.setdefault((r["node"], r["gpu"]), []).append(r)
    for (node, device), sharing in sorted(by_device.items()):
        if len(sharing) > 1:
            names = " and ".join(str(r["rank"]) for r in sharing)
            findings.append(
                error(
                    f"ranks {names} would share one GPU ({device}) on node {node}",
                    detail="NCCL refuses it with `Duplicate GPU detected : rank 1 and rank 0 both on CUDA device ...`.",
                    fix="one process per GPU: each rank uses cuda:LOCAL_RANK; check CUDA_VISIBLE_DEVICES per rank",
                    explain="nccl-error",
                    evidence={"node": node, "gpu": device, "ranks": [r["rank"] for r in sharing]},
                    id="cluster-consistency/shared-gpu",
                )
            )
    return findings


@check(
    "collective-correctness",
    "all-reduce results are exact and every rank joins in time",
    phase="distributed",
    messages={
        "rank-missing": "a rank did not join in time",
        "unfinished": "an all-reduce did not finish",
        "wrong-sums": "all-reduce sums were wrong on some ranks",
    },
)
def collective_correctness(cluster: dict[str, Any]):
    missing = cluster.get("missing") or []
    if missing:
        return Finding(
            Severity.ERROR,
            f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not "
            f"join within {cluster['bound_s']:g} s",
            detail=cluster.get("missing_detail", ""),
            fix="read that rank's own output: a crash before init, a hung import or data load, or a node "
            "that cannot reach MASTER_ADDR:MASTER_PORT",
            explain="nccl-timeout",
            id="collective-correctness/rank-missing",
            evidence={"missing_ranks": missing},
        )
    sweep = cluster.get("sweep") or {}
    if sweep.get("error"):
        return Finding(
            Severity.ERROR,
            f"an all-reduce did not finish: {sweep['error']}",
            detail=sweep.get("where", ""),
            explain="nccl-timeout",
            id="collective-correctness/unfinished",
            fix="see `sftdoctor explain nccl-timeout`",
            evidence=sweep,
        )
    wrong = sweep.get("wrong_ranks") or []
    if wrong:
        return error(
            f"all-reduce sums were wrong on rank{'s' if len(wrong) > 1 else ''} {', '.join(map(str, wrong))}",
            fix="broken hardware or transport: rerun with NCCL_P2P_DISABLE=1, then NCCL_SHM_DISABLE=1, to "
            "find the path; check dmesg for Xid errors",
            evidence={"wrong_ranks": wrong},
            id="collective-correctness/wrong-sums",
        )
    checked = sum(len(g["sizes"]) for g in sweep.get("groups", []))
    return ok(f"{checked} all-reduces exact on every rank")


@check(
    "collective-bandwidth",
    "the all-reduce bus bandwidth each link really gives",
    phase="distributed",
    messages={
        "below-expected": "a link's bus bandwidth is below half of what it promises",
        "measured": "a link's measured bus bandwidth",
        "no-sweep": "no all-reduce sweep ran",
    },
)
def collective_bandwidth(cluster: dict[str, Any]):
    findings = []
    for group in (cluster.get("sweep") or {}).get("groups", []):
        if not group["sizes"]:
            continue
        best = max(group["sizes"], key=lambda s: s["busbw_gbps"])
        head = (
            f"{group['name']}: bus bandwidth {best['busbw_gbps']:.2f} GB/s at {best['bytes'] / 2**20:g} MiB "
            f"({group['backend']}, {len(group['ranks'])} ranks)"
        )
        expected = group.get("expected")
        evidence = {**group, "best_busbw_gbps": best["busbw_gbps"]}
        if expected and best["busbw_gbps"] < SLOW * expected["busbw_gbps"]:
            findings.append(
                warning(
                    head + f", below half of the {expected['busbw_gbps']:g} GB/s its links promise",
                    detail=f"expected: {expected['why']}.",
                    fix=FIXES[expected["via"]],
                    explain="collective-bandwidth",
                    evidence=evidence,
                    id="collective-bandwidth/below-expected",
                )
            )
        else:
            detail = f"expected about {expected['busbw_gbps']:g} GB/s ({expected['why']})" if expected else ""
            findings.append(info(head, detail=detail, evidence=evidence, id="collective-bandwidth/measured"))
    return findings or info("no all-reduce sweep ran (one rank)", id="collective-bandwidth/no-sweep")
