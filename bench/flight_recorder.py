"""The flight recorder's cost, in the loop and when a hang fires.

    python bench/flight_recorder.py [--collectives 400] [--repeats 3]

1. In the loop: 2 gloo ranks (torchrun) run the same all_reduces (4 KiB, the size of a loss or a count, and
   4 MiB, a gradient bucket) with the recorder off (TORCH_FR_BUFFER_SIZE=0) and on (2000 entries, what
   sftdoctor's launcher sets and Gloo's default), interleaved; the median time per collective of each and their
   ratio. The recorder is torch's: what sftdoctor adds to a step is nothing (it dumps only when the watchdog fires).
2. In a run: the bundled tiny example trained for 40 steps on 2 gloo ranks with the recorder off and on,
   interleaved: the median time per step of each and their ratio (a step holds DDP's collectives and the
   Trainer's gathers).
3. When the watchdog fires: torch's analyzer over 2,000 entries per rank (the ring buffer full) for 8 and 64
   ranks, one rank missing the last collective: the seconds and the peak memory of `flight_recorder.read`.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKER = """
import json, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
n = int(sys.argv[1]); out = {}
for size in (1024, 2**20):
    t = torch.ones(size)
    for _ in range(20):
        dist.all_reduce(t)
    dist.barrier(); begin = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    dist.barrier(); out[size * 4] = (time.perf_counter() - begin) / n
if dist.get_rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def loop(work: Path, collectives: int, buffer: int) -> dict[str, float]:
    script = work / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": str(buffer), "OMP_NUM_THREADS": "1"}
    from sftdoctor.facts.system import free_port

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(script),
            str(collectives),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"worker failed: {proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT ") :])


def run_step_s(work: Path, buffer: int, index: int, steps: int = 40) -> float:
    from watch_overhead import step_time  # bench/, this script's folder

    # the launcher's own TORCH_FR_BUFFER_SIZE yields to the caller's
    return step_time(work / f"run-{buffer}-{index}", steps, {"TORCH_FR_BUFFER_SIZE": str(buffer)}, ranks=2)


def dumps(folder: Path, ranks: int, entries: int = 2000) -> None:
    """`ranks` dumps in torch 2.13's Gloo format (the real drill dump's entry, repeated), the ring buffer full;
    the last rank never enters the last collective."""
    real = pickle.loads((ROOT / "tests" / "fixtures" / "flight_recorder" / "gloo-hang-drill" / "rank-0").read_bytes())
    template = next(e for e in real["entries"] if e["profiling_name"] == "gloo:all_reduce" and e["pg_id"] == 2)
    for rank in range(ranks):
        count = entries - 1 if rank == ranks - 1 else entries
        body = [
            {**template, "pg_id": 0, "record_id": i, "collective_seq_id": i + 1, "op_id": i + 1} for i in range(count)
        ]
        dump = {
            "version": real["version"],
            "pg_config": real["pg_config"],
            "pg_status": {
                "0": {
                    "last_enqueued_collective": count,
                    "last_started_collective": -1,
                    "last_completed_collective": entries - 1,
                }
            },
            "entries": body,
        }
        (folder / f"rank-{rank}").write_bytes(pickle.dumps(dump))


def analysis(work: Path, ranks: int) -> tuple[float, float, str]:
    from sftdoctor.checks._collectives import describe
    from sftdoctor.facts.flight_recorder import read

    folder = work / f"fr-{ranks}"
    folder.mkdir()
    dumps(folder, ranks)
    read(folder, ranks)  # torch's import, once
    tracemalloc.start()
    begin = time.perf_counter()
    fr = read(folder, ranks)
    took = time.perf_counter() - begin
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return took, peak / 2**20, describe(fr)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--collectives", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs: dict[int, list[dict[str, float]]] = {0: [], 2000: []}
        for _ in range(args.repeats):
            for buffer in (0, 2000):
                runs[buffer].append(loop(work, args.collectives, buffer))
        print(
            f"1. in the loop: 2 gloo ranks, {args.collectives} all_reduces per size, {args.repeats} runs each, median"
        )
        for size in runs[0][0]:
            off = statistics.median(r[size] for r in runs[0])
            on = statistics.median(r[size] for r in runs[2000])
            print(
                f"   {int(size) / 1024:>6.0f} KiB: recorder off {off * 1e6:8.1f} us, on {on * 1e6:8.1f} us: "
                f"ratio {on / off:.3f}"
            )
        steps: dict[int, list[float]] = {0: [], 2000: []}
        for index in range(args.repeats):
            for buffer in (0, 2000):
                steps[buffer].append(run_step_s(work, buffer, index))
        off, on = statistics.median(steps[0]), statistics.median(steps[2000])
        print(
            f"2. in a run: the tiny example, 2 gloo ranks, 40 steps, {args.repeats} runs each: recorder off "
            f"{off * 1e3:.1f} ms a step, on {on * 1e3:.1f} ms: ratio {on / off:.3f}"
        )
        print("3. when the watchdog fires: torch's analyzer over 2,000 entries per rank")
        for ranks in (8, 64):
            took, peak, headline = analysis(work, ranks)
            print(f"   {ranks:>3} ranks: {took:6.2f} s, peak {peak:6.1f} MiB: {headline}")


if __name__ == "__main__":
    main()
