"""Time `sftdoctor check` against the environment reports people run today, in the same run.

    python bench/check_latency.py [--repeat 5]

Prints the median wall time of each command and the ratio of `sftdoctor check` to the fastest
peer. The goal is at most 0.1 (a tenth of the fastest of them).
"""

from __future__ import annotations

import argparse
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
        proc = subprocess.run(command, capture_output=True)
        times.append(time.perf_counter() - start)
        if proc.returncode not in (0, 1):
            return None
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    median_seconds(SFTDOCTOR["sftdoctor check"], 1)  # warm the page cache for everyone alike
    results = {name: median_seconds(cmd, args.repeat) for name, cmd in {**SFTDOCTOR, **PEERS}.items()}
    peers = {n: t for n, t in results.items() if n in PEERS and t is not None}
    print(f"{'command':<36} {'median s':>9}")
    for name, seconds in results.items():
        print(f"{name:<36} {seconds:>9.3f}" if seconds is not None else f"{name:<36} {'n/a':>9}")
    if not peers:
        print("no peer command available: install torch, deepspeed and accelerate")
        return 1
    fastest = min(peers, key=peers.get)
    ratio = results["sftdoctor check"] / peers[fastest]
    print(f"ratio sftdoctor check / {fastest} = {ratio:.3f} (goal <= 0.100: {'met' if ratio <= 0.1 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
