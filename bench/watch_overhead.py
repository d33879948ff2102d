"""The watchers' cost: the same tiny run with the watchers on and off, several repetitions in one run;
prints the median step time of each and their ratio (goal: under 1% overhead).

    python bench/watch_overhead.py [--repeats 3] [--steps 40]

"Off" removes sftdoctor's Guard (NaN guard, spike and loss-scale checks, hang watchdog) and nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny"


def step_time(out: Path, steps: int, env: dict[str, str], ranks: int = 1) -> float:
    """Seconds per step of the bundled tiny example trained `steps` steps on `ranks` processes into `out`, with
    `env` added to the environment (the Trainer's own train_runtime over the steps)."""
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
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "train", str(config), "--no-rehearse"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=900,
    )
    if proc.returncode:
        sys.exit(proc.stdout[-2000:] + proc.stderr[-2000:])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r["train_runtime"] for r in records if "train_runtime" in r) / steps


def one_run(work: Path, steps: int, watch: bool, index: int) -> float:
    return step_time(work / f"{'on' if watch else 'off'}-{index}", steps, {"SFTDOCTOR_NO_WATCH": "" if watch else "1"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sftdoctor-watch-"))
    times = {True: [], False: []}
    for index in range(args.repeats):  # interleaved, so drift in machine load hits both alike
        for watch in (True, False):
            times[watch].append(one_run(work, args.steps, watch, index))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"median step time, watchers on : {on * 1000:.1f} ms  ({', '.join(f'{t * 1000:.1f}' for t in times[True])})")
    print(
        f"median step time, watchers off: {off * 1000:.1f} ms  ({', '.join(f'{t * 1000:.1f}' for t in times[False])})"
    )
    print(f"ratio on / off = {on / off:.4f} ({(on / off - 1) * 100:+.2f}%; goal under +1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
