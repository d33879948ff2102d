"""All-reduce bus bandwidth as `sftdoctor check --distributed` measures it, against a plain torch loop
(the peer, nccl-tests' method) run in the same session with the same processes and sizes.

    python bench/allreduce_bandwidth.py [--procs 2 4]

Both use torchrun on this machine: gloo on CPUs, NCCL on GPUs. Prints the bus bandwidth
(algbw x 2(n-1)/n) per message size and the ratio sftdoctor / peer at the largest size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the findings of `check --distributed` that carry a link's all-reduce sweep (evidence["sizes"])
BANDWIDTH_IDS = ("collective-bandwidth/measured", "collective-bandwidth/below-expected")

PEER = """
import json, os, time, torch, torch.distributed as dist
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl" if cuda else "gloo")
n, rank, out = dist.get_world_size(), dist.get_rank(), []
for size in [2**k for k in range(16, 25)]:
    t = torch.ones(size // 8, dtype=torch.float64, device="cuda" if cuda else "cpu")
    warm = time.perf_counter()
    dist.all_reduce(t)
    iters = torch.tensor([float(min(max(int(0.2 / (time.perf_counter() - warm)), 3), 20))])
    dist.all_reduce(iters, op=dist.ReduceOp.MAX)
    start = time.perf_counter()
    for _ in range(int(iters.item())):
        dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / int(iters.item())
    out.append({"bytes": size, "busbw_gbps": size / seconds / 1e9 * 2 * (n - 1) / n})
if rank == 0:
    print(json.dumps(out))
dist.destroy_process_group()
"""


def torchrun(procs: int, *args: str) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs), *args]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        peer_script = Path(tmp) / "peer.py"
        peer_script.write_text(PEER)
        for procs in args.procs:
            doc = json.loads(
                torchrun(
                    procs,
                    "-m",
                    "sftdoctor",
                    "check",
                    "--distributed",
                    "--json",
                    "--seconds",
                    "20",
                    "--out",
                    str(Path(tmp) / "out"),
                )
            )
            [bw] = [f for f in doc["findings"] if f["id"] in BANDWIDTH_IDS]
            ours = {s["bytes"]: s["busbw_gbps"] for s in bw["evidence"]["sizes"]}
            peer = {s["bytes"]: s["busbw_gbps"] for s in json.loads(torchrun(procs, str(peer_script)))}
            print(f"{procs} processes, {bw['evidence']['backend']}: bus bandwidth GB/s")
            print(f"  {'MiB':>8} {'sftdoctor':>10} {'plain loop':>10}")
            for size in sorted(set(ours) & set(peer)):
                print(f"  {size / 2**20:8.3f} {ours[size]:10.3f} {peer[size]:10.3f}")
            common = max(set(ours) & set(peer))
            print(f"  ratio sftdoctor / plain loop at {common / 2**20:g} MiB: {ours[common] / peer[common]:.2f}")


if __name__ == "__main__":
    main()
