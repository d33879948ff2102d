"""Time `sftdoctor check` against the environment reports people run today, in the same run.

    python bench/check_latency.py [--repeat 5]

Prints the median wall time of each command and the ratio of `sftdoctor check` to `python -m
torch.utils.collect_env` (and to the fastest peer). The goal is at most 0.06 of collect_env.
Every command runs with its bytecode cached (PYTHONDONTWRITEBYTECODE unset), as an installed package has it:
a checkout's stale .pyc files would otherwise be recompiled on every run and time the compiler.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PEERS = {
    "python -m torch.utils.collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
    "ds_report": ["ds_report"],
    "accelerate env": ["accelerate", "env"],
}
GOAL, BASELINE = 0.06, "python -m torch.utils.collect_env"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
SFTDOCTOR = {
    "sftdoctor check": [sys.executable, "-m", "sftdoctor", "check"],
    "sftdoctor check --json": [sys.executable, "-m", "sftdoctor", "check", "--json"],
}


def resolve(command: list[str]) -> list[str] | None:
    """Console scripts of this interpreter's environment first, then PATH."""
    beside = Path(sys.executable).parent / command[0]
    found = str(beside) if beside.exists() else shutil.which(command[0])
    return [found, *command[1:]] if found else None


def median_seconds(command: list[str], repeat: int) -> float | None:
    command = resolve(command)
    if command is None:
        return None
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, env=ENV)
        times.append(time.perf_counter() - start)
        if proc.returncode not in (0, 1):
            return None
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    median_seconds(SFTDOCTOR["sftdoctor check"], 1)  # warm the page cache for everyone alike, write the bytecode
    results = {name: median_seconds(cmd, args.repeat) for name, cmd in {**SFTDOCTOR, **PEERS}.items()}
    peers = {n: t for n, t in results.items() if n in PEERS and t is not None}
    print(f"{'command':<36} {'median s':>9}")
    for name, seconds in results.items():
        print(f"{name:<36} {seconds:>9.3f}" if seconds is not None else f"{name:<36} {'n/a':>9}")
    if not peers:
        print("no peer command available: install torch, deepspeed and accelerate")
        return 1
    fastest = min(peers, key=peers.get)
    print(f"ratio sftdoctor check / {fastest} (the fastest peer) = {results['sftdoctor check'] / peers[fastest]:.3f}")
    if BASELINE not in peers:
        print(f"no {BASELINE}: install torch to judge the goal")
        return 1
    ratio = results["sftdoctor check"] / peers[BASELINE]
    print(f"ratio sftdoctor check / {BASELINE} = {ratio:.3f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
