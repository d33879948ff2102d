"""The watchers' cost, and a live page's: the same tiny run with the watchers on and off, and with a
`sftdoctor report RUN_DIR --follow` process beside it and without, several repetitions in one run; prints the
median step time of each and their ratio (goal: under 1% overhead).

    python bench/watch_overhead.py [--repeats 3] [--steps 40] [--ranks 1] [--what both|watchers|follow]
                                   [--follow-interval 1]

"Off" removes sftdoctor's Guard (NaN guard, spike and loss-scale checks, hang watchdog) and nothing else.
"Beside" starts the follower as soon as the launcher marks the run directory (live.json) and lets it end by
itself with the run; both runs have the watchers on. The follower draws again at each logging step (every 5
steps) when its interval (1 s by default here, 5 s for a user) has passed: a harder case than its default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny"


def step_time(
    out: Path,
    steps: int,
    env: dict[str, str],
    ranks: int = 1,
    follow_interval: float | None = None,
    cpu: list[tuple[float, float]] | None = None,
) -> float:
    """Seconds per step of the bundled tiny example trained `steps` steps on `ranks` processes into `out`, with
    `env` added to the environment (the Trainer's own train_runtime over the steps); with `follow_interval`, a
    `report --follow` process beside the run, looking every that many seconds, whose CPU seconds (user + system)
    are added to `cpu` with the run's train_runtime."""
    config = out.parent / f"{out.name}.toml"
    launch = f'[launch]\nnproc_per_node = {ranks}\nmaster_port = "auto"\n' if ranks > 1 else ""
    config.write_text(f'''[model]
path = "{TINY / "model"}"
weights = "random"
[data]
train = "{TINY / "data" / "train.jsonl"}"
max_length = 256
[training]
per_device_batch_size = 8
max_steps = {steps}
logging_steps = 5
save_steps = {steps * 10}
gradient_checkpointing = false
output_dir = "{out}"
{launch}''')
    proc = subprocess.Popen(
        [sys.executable, "-m", "sftdoctor", "train", str(config), "--no-rehearse"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    follower = beside(out, proc, follow_interval) if follow_interval else None
    stdout, stderr = proc.communicate(timeout=900)
    if proc.returncode:
        sys.exit(stdout[-2000:] + stderr[-2000:])
    spent = cpu_seconds(follower) if follower is not None else None
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    runtime = next(r["train_runtime"] for r in records if "train_runtime" in r)
    if spent is not None and cpu is not None:
        cpu.append((spent, runtime))
    return runtime / steps


def cpu_seconds(follower: subprocess.Popen) -> float:
    """The follower's CPU time once it ended by itself (it does when the run's launcher is done): a figure the
    machine's other load does not change, unlike the step times."""
    _, status, usage = os.wait4(follower.pid, 0)
    follower.returncode = os.waitstatus_to_exitcode(status)
    if follower.returncode:
        sys.exit(f"report --follow exited {follower.returncode}: {follower.stderr.read()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def beside(out: Path, train: subprocess.Popen, interval: float) -> subprocess.Popen | None:
    """`sftdoctor report OUT --follow` started once the launcher has marked OUT (before its first step)."""
    while not (out / "live.json").exists():
        if train.poll() is not None:
            return None
        time.sleep(0.05)
    return subprocess.Popen(
        [sys.executable, "-m", "sftdoctor", "report", str(out), "--follow", "--interval", str(interval)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_run(work: Path, steps: int, watch: bool, index: int, ranks: int = 1) -> float:
    return step_time(
        work / f"{'on' if watch else 'off'}-{index}", steps, {"SFTDOCTOR_NO_WATCH": "" if watch else "1"}, ranks
    )


def followed_run(
    work: Path, steps: int, follow: bool, index: int, ranks: int, interval: float, cpu: list[tuple[float, float]]
) -> float:
    out = work / f"{'follow' if follow else 'alone'}-{index}"
    return step_time(out, steps, {}, ranks, interval if follow else None, cpu)


def said(name: str, times: list[float]) -> str:
    each = ", ".join(f"{t * 1000:.1f}" for t in times)
    return f"median step time, {name}: {statistics.median(times) * 1000:.1f} ms  ({each})"


def compare(times: dict[bool, list[float]], names: tuple[str, str]) -> None:
    """The two medians, then their ratio (the first over the second)."""
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(said(names[0], times[True]))
    print(said(names[1], times[False]))
    print(f"ratio {names[0]} / {names[1]} = {on / off:.4f} ({(on / off - 1) * 100:+.2f}%; goal under +1%)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--what", choices=["both", "watchers", "follow"], default="both")
    parser.add_argument("--follow-interval", type=float, default=1.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sftdoctor-watch-"))
    watched, followed, cpu = {True: [], False: []}, {True: [], False: []}, []
    for index in range(args.repeats):  # interleaved, so drift in machine load hits both alike
        for on in (True, False):
            if args.what in ("both", "watchers"):
                watched[on].append(one_run(work, args.steps, on, index, args.ranks))
            if args.what in ("both", "follow"):
                followed[on].append(followed_run(work, args.steps, on, index, args.ranks, args.follow_interval, cpu))
    if watched[True]:
        compare(watched, ("watchers on", "watchers off"))
    if followed[True]:
        compare(followed, ("report --follow beside", "run alone"))
        spent = ", ".join(f"{s:.1f} s over {r:.1f} s" for s, r in cpu)
        print(f"the follower's CPU time (from its start to its exit) over the run's train_runtime: {spent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
