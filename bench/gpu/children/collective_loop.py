"""The peer of `sftdoctor check --distributed`: a plain all-reduce loop (nccl-tests' method: algbw = bytes /
time, busbw = algbw x 2(n-1)/n) at the given sizes, then PyTorch's flight recorder dumped through sftdoctor's
own reader (`sftdoctor.train.compat.dump_flight_recorder`, what the hang watchdog dumps before it aborts).

    torchrun --nproc-per-node N bench/gpu/children/collective_loop.py RESULT.json BYTES[,BYTES...]

NCCL on GPUs (cuda:LOCAL_RANK), gloo on CPUs. The launcher sets the flight recorder's variables
(`compat.flight_recorder_env`). Rank 0 writes RESULT.json.
"""

import collections
import json
import os
import pickle
import sys
import time


def sweep(sizes, device, cuda):
    import torch
    import torch.distributed as dist

    n, out = dist.get_world_size(), []
    for size in sizes:
        tensor = torch.ones(size // 8, dtype=torch.float64, device=device)
        warm = time.perf_counter()
        dist.all_reduce(tensor)
        if cuda:
            torch.cuda.synchronize()
        iters = torch.tensor([float(min(max(int(0.2 / max(time.perf_counter() - warm, 1e-6)), 3), 20))], device=device)
        dist.all_reduce(iters, op=dist.ReduceOp.MAX)
        count = int(iters.item())
        start = time.perf_counter()
        for _ in range(count):
            dist.all_reduce(tensor)
        if cuda:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / count
        algbw = size / seconds / 1e9
        out.append(
            {
                "bytes": size,
                "seconds": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (n - 1) / n if n > 1 else None,
            }
        )
    return out


def flight_recorder():
    """What the recorder holds after the sweep, read as torchfrtrace reads its dumps (a pickled dict)."""
    import torch.distributed as dist

    from sftdoctor.train import compat

    data = compat.dump_flight_recorder(dist.get_backend() if dist.is_initialized() else "nccl")
    if data is None:
        return {"dumped": False, "why": "compat.dump_flight_recorder() returned None (no recorder API, or it failed)"}
    try:
        trace = pickle.loads(data)
    except Exception as exc:
        return {"dumped": True, "bytes": len(data), "parsed": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    entries = trace.get("entries", []) if isinstance(trace, dict) else []
    return {
        "dumped": True,
        "bytes": len(data),
        "parsed": True,
        "version": trace.get("version"),
        "comm_lib_version": trace.get("comm_lib_version"),
        "entries": len(entries),
        "collectives": dict(collections.Counter(e.get("profiling_name") for e in entries)),
        "states": dict(collections.Counter(e.get("state") for e in entries)),
        "with_stack": sum(1 for e in entries if e.get("frames")),
    }


def main(result, sizes):
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    out = {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "sizes": sweep(sizes, device, cuda)}
    out["flight_recorder"] = flight_recorder()
    out["flight_recorder_env"] = {k: v for k, v in os.environ.items() if k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    if dist.get_rank() == 0:
        with open(result, "w") as handle:
            json.dump(out, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")])
