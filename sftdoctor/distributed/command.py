"""`sftdoctor check --distributed`, run on every rank under torchrun (or any launcher that sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT).

1. Join: every rank puts its record (versions, node, the GPU it will use) into the launcher's c10d
   store; rank 0 waits at most `bound` seconds and names the ranks that never came, instead of hanging.
2. Sweep: a process group (NCCL on GPUs, gloo on CPUs) all-reduces growing messages inside each node,
   then across nodes (nccl-tests style: algbw = bytes / time, busbw = algbw x 2(n-1)/n), checks every
   sum, and stops within its time budget.
3. Rank 0 runs the `distributed` checks on all of it, prints one table and writes each rank's record and
   the findings to the output folder; every rank exits with rank 0's verdict.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError

SIZES = [2**k for k in range(16, 29)]  # 64 KiB .. 256 MiB
CPU_MAX = 16 * 2**20


@dataclass(frozen=True)
class Launcher:
    """What the launcher (torchrun, srun, mpirun wrappers) told this rank through its environment."""

    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int


def _env_number(
    environ: Mapping[str, str], name: str, low: int, high: int | None = None, default: int | None = None
) -> int:
    value = environ.get(name)
    if value is None and default is not None:
        return default
    bound = f"{low}..{high}" if high is not None else f">= {low}"
    if value is None:
        raise InputError(
            "environment", f"not set; expected an integer {bound} from the launcher (torchrun sets it)", name
        )
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        raise InputError("environment", f"expected an integer {bound}, got {value!r}", name)
    return number


def launcher(environ: Mapping[str, str] = os.environ) -> Launcher:
    """The rank's place in the job, every variable checked: a bad one is bad input, not a traceback on each rank."""
    world = _env_number(environ, "WORLD_SIZE", 1)
    rank = _env_number(environ, "RANK", 0, world - 1)
    local_rank = _env_number(environ, "LOCAL_RANK", 0, world - 1, default=0)
    addr = (environ.get("MASTER_ADDR") or "").strip()
    if not addr:
        raise InputError("environment", "not set; expected the host of rank 0 (torchrun sets it)", "MASTER_ADDR")
    return Launcher(rank, world, local_rank, addr, _env_number(environ, "MASTER_PORT", 1, 65535))


def absent_rank(drill: str | None, world: int) -> int | None:
    """The rank `--drill absent:RANK` keeps away."""
    if drill is None:
        return None
    match = re.fullmatch(r"absent:(\d+)", drill.strip())
    if not match or int(match[1]) >= world:
        raise InputError("--drill", f"expected absent:RANK with RANK 0..{world - 1}, got {drill!r}")
    return int(match[1])


def snapshot_path(template: str | None, rank: int, local_rank: int, node: str) -> Path | None:
    """--facts for this rank: the template with {rank}, {local_rank} and {node} filled in."""
    if template is None:
        return None
    try:
        return Path(template.format(rank=rank, local_rank=local_rank, node=node))
    except (KeyError, IndexError, ValueError) as exc:
        raise InputError(
            "--facts",
            f"expected a path with only {{rank}}, {{local_rank}} or {{node}} in braces, "
            f"got {template!r} ({type(exc).__name__}: {exc})",
        ) from None


def record(rank: int, local_rank: int, node: str, facts) -> dict[str, Any]:
    """What this rank runs and which GPU it will use (cuda:LOCAL_RANK among the visible ones)."""
    from sftdoctor.distributed.expect import inter_node, intra_node

    packages = facts.get("packages") or {}
    build = facts.get("torch_build") or {}
    gpus = facts.get("gpus") or {}
    devices = visible(gpus.get("devices") or [], os.environ.get("CUDA_VISIBLE_DEVICES"))
    # The GPU a rank uses: its only visible one, else cuda:LOCAL_RANK (what sftdoctor train and HF do).
    gpu = devices[0] if len(devices) == 1 else devices[local_rank] if local_rank < len(devices) else None
    nccl = next(
        (packages.get(n) for n in ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11") if packages.get(n)), None
    )
    topology = facts.get("topology") if devices and local_rank == 0 else None
    return {
        "rank": rank,
        "local_rank": local_rank,
        "node": node,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "torch": build.get("version") or packages.get("torch"),
        "cuda": build.get("cuda"),
        "nccl": nccl,
        "driver": gpus.get("driver_version"),
        "transformers": packages.get("transformers"),
        "trl": packages.get("trl"),
        "deepspeed": packages.get("deepspeed"),
        "accelerate": packages.get("accelerate"),
        "gpus_visible": len(devices),
        "gpu": (gpu.get("uuid") or gpu.get("pci_bus_id") or f"GPU{gpu.get('index')}") if gpu else None,
        "gpu_name": gpu.get("name") if gpu else None,
        "gpu_memory_mib": gpu.get("memory_total_mib") if gpu else None,
        "link_expect": intra_node(topology, gpu.get("compute_capability")) if topology and gpu else None,
        "network_expect": inter_node(facts.get("nics")) if local_rank == 0 else None,
    }


def visible(devices: list[dict[str, Any]], mask: str | None) -> list[dict[str, Any]]:
    """The devices CUDA_VISIBLE_DEVICES leaves, in its order (NVML lists them all): indices or UUIDs."""
    if mask is None:
        return devices
    out = []
    for item in (x.strip() for x in mask.split(",") if x.strip()):
        match = next(
            (d for d in devices if str(d.get("index")) == item or (d.get("uuid") and str(d["uuid"]).startswith(item))),
            None,
        )
        if match is None:
            break  # CUDA stops at the first entry it cannot resolve
        out.append(match)
    return out


def connect(job: Launcher, bound: float):
    """A client of the launcher's store (torchrun's agent store), or rank 0 hosts one."""
    import torch.distributed as dist

    rank, world = job.rank, job.world
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    # multi_tenant: rank 0 hosts the workers' store when the agent does not (sftdoctor's launcher turns the
    # agent's off), and init_process_group then opens the same port again: one server serves both.
    store = dist.TCPStore(
        job.master_addr,
        job.master_port,
        world,
        is_master=(rank == 0 and not agent),
        timeout=timedelta(seconds=bound),
        wait_for_workers=False,
        multi_tenant=True,
    )
    # The agent's store outlives restart rounds: key by the round. Rank 0's own store is the round's alone, and
    # the restart count is not the same on every node (a node that came back starts again from 0).
    round_ = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") if agent else "own"
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}-{job.master_port}-{round_}"
    return dist.PrefixStore(f"sftdoctor-check/{run}/", store)


def join(store, rank: int, world: int, mine: dict[str, Any], bound: float) -> tuple[list[dict], list[int]]:
    """Every rank's record, and the ranks that did not come within `bound` seconds (rank 0 decides)."""
    store.set(f"joined/{rank}", json.dumps(mine))
    if rank == 0:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if all(store.check([f"joined/{r}"]) for r in range(world)):
                break
            time.sleep(0.05)
        present = [r for r in range(world) if store.check([f"joined/{r}"])]
        missing = sorted(set(range(world)) - set(present))
        store.set("joined", json.dumps(missing))
    else:
        store.wait(["joined"], timedelta(seconds=2 * bound + 10))
        missing = json.loads(store.get("joined"))
    records = [json.loads(store.get(f"joined/{r}")) for r in range(world) if r not in missing]
    return records, missing


def dist_max(value: int, group, device) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def sweep(records: list[dict[str, Any]], rank: int, store, budget: float, cuda: bool) -> dict[str, Any]:
    """All-reduce sweeps per node (when it has 2+ ranks) and across nodes (when 2+ nodes)."""
    import torch
    import torch.distributed as dist

    nodes: dict[str, list[int]] = {}
    for r in records:
        nodes.setdefault(r["node"], []).append(r["rank"])
    plans = [(f"node {node}", sorted(ranks)) for node, ranks in sorted(nodes.items()) if len(ranks) > 1]
    if len(nodes) > 1:
        plans.append(("across nodes", sorted(r["rank"] for r in records)))
    # every rank creates every group, in the same order (torch requires it)
    groups = [(name, ranks, dist.new_group(ranks)) for name, ranks in plans]
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    # Sized to the GPUs: at most 2% of the smallest one's memory (256 MiB on an 80 GB card is 0.3%).
    memory = min((r.get("gpu_memory_mib") or 0 for r in records), default=0) * 2**20
    limit = min(SIZES[-1], max(memory // 50, SIZES[0])) if cuda else CPU_MAX
    wrong = False
    for name, ranks, group in groups:
        result = {"name": name, "ranks": ranks, "backend": dist.get_backend(), "sizes": []}
        node_expect = next((r["link_expect"] for r in records if r["rank"] == ranks[0] and r.get("link_expect")), None)
        if name.startswith("node") and node_expect:
            result["expected"] = node_expect
        networks = [r["network_expect"] for r in records if r.get("network_expect")]
        if name == "across nodes" and len(networks) == len(nodes):  # the slowest node's ports set the pace
            result["expected"] = min(networks, key=lambda e: e["busbw_gbps"])
        if rank in ranks:
            began = time.monotonic()
            for size in (s for s in SIZES if s <= limit):
                store.set(f"phase/{rank}", f"{name}: all-reduce of {size} bytes")
                timing, right = time_all_reduce(size, ranks.index(rank), len(ranks), group, device, cuda)
                wrong |= not right
                result["sizes"].append(timing)
                over = time.monotonic() - began > budget / max(len(groups), 1)
                if dist_max(int(over), group, device):  # the group stops together, or some rank would hang
                    break
        if rank == ranks[0]:  # the group's first rank speaks for it
            store.set(f"sweep/{name}", json.dumps(result))
    flag = torch.tensor([1.0 if wrong else 0.0], device=device)
    gathered = [torch.zeros_like(flag) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flag)  # also: every group's result is in the store now
    groups_done = [json.loads(store.get(f"sweep/{name}")) for name, _, _ in groups] if rank == 0 else []
    return {"groups": groups_done, "wrong_ranks": [r for r, f in enumerate(gathered) if f.item()]}


def time_all_reduce(size: int, index: int, n: int, group, device, cuda: bool) -> tuple[dict[str, float], bool]:
    """One size's all-reduce in a group of n ranks, this one the index-th: its timing, and whether the sum came out
    right."""
    import torch
    import torch.distributed as dist

    # Each rank adds rank + 1: the first sum is n(n+1)/2, each further one multiplies by n. float64
    # keeps these exact (or within 1e-12) for thousands of ranks, and nothing is refilled in the timing.
    tensor = torch.full((size // 8,), float(index + 1), dtype=torch.float64, device=device)
    warm = time.perf_counter()
    dist.all_reduce(tensor, group=group)  # warm-up, and how many timed ones fit in ~0.2 s
    if cuda:
        torch.cuda.synchronize()
    iters = min(max(int(0.2 / max(time.perf_counter() - warm, 1e-6)), 3), 20)
    iters = int(dist_max(iters, group, device))  # every rank of the group must run as many
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    expected = n * (n + 1) / 2 * n**iters
    right = bool(torch.isclose(tensor, torch.full_like(tensor, expected), rtol=1e-12, atol=0).all())
    algbw = size / seconds / 1e9
    return {"bytes": size, "seconds": seconds, "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (n - 1) / n}, right


def main(
    bound: float,
    budget: float,
    out: Path,
    facts_template: str | None,
    as_json: bool,
    drill: str | None,
    plugins: bool = True,
) -> int:
    import torch.distributed as dist

    from sftdoctor.facts import Facts, Inputs

    job = launcher()
    rank, world, local_rank = job.rank, job.world, job.local_rank
    node = os.environ.get("SFTDOCTOR_NODE") or socket.gethostname()
    if absent_rank(drill, world) == rank:  # a rank that never comes: the others must name it, not hang
        time.sleep(10 * bound)
        return 1
    if out.exists() and not out.is_dir():
        raise InputError(
            out, "exists and is not a folder (expected the folder for each rank's record and the findings)"
        )
    facts = Facts(Inputs(facts=snapshot_path(facts_template, rank, local_rank, node)))
    mine = record(rank, local_rank, node, facts)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(mine, indent=2) + "\n")
    store = connect(job, bound)
    records, missing = join(store, rank, world, mine, bound)
    cluster: dict[str, Any] = {"ranks": records, "missing": missing, "bound_s": bound, "world_size": world}
    if not missing:
        cluster["sweep"] = swept(job, mine, records, store, budget, bound)
    if rank != 0:
        store.wait(["verdict"], timedelta(seconds=3 * bound + 60))
        code = int(store.get("verdict"))
    else:
        code = verdict(cluster, out, as_json, plugins)
        store.set("verdict", str(code))
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


def swept(job, mine: dict[str, Any], records: list[dict[str, Any]], store, budget: float, bound: float):
    """The sweep, in a process group of every rank, or what stopped it and where each rank was."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and mine["gpu"] is not None
    if cuda:  # the same GPU the record names: the only visible one, else cuda:LOCAL_RANK
        torch.cuda.set_device(0 if mine["gpus_visible"] == 1 else job.local_rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=dist.PrefixStore("pg/", store),
        rank=job.rank,
        world_size=job.world,
        timeout=timedelta(seconds=bound),
    )
    try:
        return sweep(records, job.rank, store, budget, cuda)
    except Exception as exc:  # a collective that did not finish in time
        phases = {
            r: store.get(f"phase/{r}").decode() if store.check([f"phase/{r}"]) else "never started"
            for r in range(job.world)
        }
        return {
            "error": f"{type(exc).__name__}: {str(exc)[:200]}",
            "where": "; ".join(f"rank {r}: {p}" for r, p in phases.items()),
        }


def verdict(cluster: dict[str, Any], out: Path, as_json: bool, plugins: bool) -> int:
    """Rank 0's: the distributed checks on the cluster's record, written to OUT/findings.json and shown."""
    from sftdoctor import render
    from sftdoctor.checks import load_checks, run_checks
    from sftdoctor.facts import Facts

    registry = load_checks(plugins)
    findings, skipped = run_checks(registry.phase("distributed"), Facts.replay({"cluster": cluster}))
    findings = registry.problems + findings
    (out / "findings.json").write_text(json.dumps([f.to_json() for f in findings], indent=2, default=str) + "\n")
    if as_json:
        render.render_json(findings, skipped, {"cluster": cluster})
    else:
        render.render_table(findings, skipped)
    return render.exit_code(findings)
