"""`sftdoctor report` on a 100,000-step run: wall time and peak RSS, against the floor any reader of the same
metrics.jsonl pays (a child process that json-parses every line and keeps nothing), in the same run.

    python bench/report_100k.py [--steps 100000] [--repeats 3]

The run directory is synthetic but shaped like a real one: a record per step with every key the recipe
writes (loss, grad_norm, learning_rate, tokens/s, memory, TRL's entropy and token accuracy, ...), an
eval record every 500 steps, resolved.json with a cosine schedule, a checkpoint every 5,000 steps, a
throughput drop at 60% (so a curve reader has something to say) and a few findings. Each command is timed
--repeats times, interleaved; the best time and the largest peak RSS are shown.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sftdoctor.run import schedule as schedules  # noqa: E402 - once sys.path holds the checkout

PEER = "import json, sys\nfor line in open(sys.argv[1], encoding='utf-8'):\n    json.loads(line)\n"


def make_run(folder: Path, steps: int) -> None:
    plan = {
        "lr_scheduler": "cosine_with_min_lr",
        "learning_rate": 2e-5,
        "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
        "warmup_steps": steps // 50,
        "total_steps": steps,
        "max_grad_norm": 1.0,
        "save_steps": 5000,
        "eval_steps": 500,
        "precision": "bf16",
        "deepspeed": None,
    }
    (folder / "resolved.json").write_text(json.dumps(plan))
    schedule = schedules.schedule_of(plan)
    start = time.time()
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as out:
        for step in range(1, steps + 1):
            noise = math.sin(step * 12.9898) * 0.05
            out.write(json.dumps(training_record(step, steps, start, noise, schedule)) + "\n")
            if step % 500 == 0:
                out.write(
                    json.dumps(
                        {
                            "step": step,
                            "time": start + step * 0.8,
                            "eval_loss": 1.0 + noise,
                            "eval_runtime": 12.0,
                            "epoch": step / steps * 3,
                        }
                    )
                    + "\n"
                )
    with open(folder / "findings.jsonl", "w", encoding="utf-8") as out:
        out.write(
            json.dumps(
                {"phase": "preflight", "severity": "warning", "id": "gpu-topology", "title": "GPUs 4-7 talk over PCIe"}
            )
            + "\n"
        )
        out.write(
            json.dumps(
                {
                    "phase": "runtime",
                    "step": 41234,
                    "severity": "warning",
                    "id": "loss-spike",
                    "title": "loss spike at step 41234: 2.31 against a recent median of 1.18",
                }
            )
            + "\n"
        )


def training_record(step: int, steps: int, start: float, noise: float, schedule) -> dict:
    """A logged training step as the launcher's metrics.jsonl holds it: a decaying loss, two throughput regimes."""
    return {
        "step": step,
        "time": start + step * 0.8,
        "loss": 1.2 * math.exp(-step / (steps / 4)) + 0.8 + noise,
        "grad_norm": 0.4 + abs(noise),
        "learning_rate": schedules.rate(schedule, step - 1),
        "tokens_per_second": (52000.0 if step < 0.6 * steps else 31000.0) * (1 + noise / 5),
        "tokens_seen": step * 524288,
        "padding_fraction": 0.0,
        "step_time_s": 0.8,
        "max_grad_norm": 1.0,
        "memory_allocated_gib": 61.2 + noise,
        "memory_rank": 3,
        "memory_reserved_gib": 70.1,
        "host_rss_gib": 18.4,
        "host_rss_rank": 0,
        "entropy": 1.1 + noise,
        "mean_token_accuracy": 0.71,
        "num_tokens": float(step * 524288),
        "epoch": step / steps * 3,
    }


def measure(command: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MiB, exit code) of one child process."""
    began = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        sys.exit(f"{command[:4]} failed: {proc.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        folder.mkdir()
        make_run(folder, options.steps)
        size = (folder / "metrics.jsonl").stat().st_size / 2**20
        report = [sys.executable, "-m", "sftdoctor", "report", str(folder), "--no-plugins"]
        peer = [sys.executable, "-c", PEER, str(folder / "metrics.jsonl")]
        best = {"report": (math.inf, 0.0), "peer": (math.inf, 0.0)}
        for _ in range(options.repeats):
            for name, command in (("peer", peer), ("report", report)):
                wall, rss, _ = measure(command)
                best[name] = (min(best[name][0], wall), max(best[name][1], rss))
        panels = sorted(p.name for p in (folder / "report").iterdir())
        page = (folder / "report.html").stat().st_size / 2**20
        postrun = [json.loads(line) for line in (folder / "findings.jsonl").read_text().splitlines()]
        said = [f"{r['id']}: {r['title']}" for r in postrun if r.get("phase") == "postrun" and r["severity"] != "ok"]
    print(f"metrics.jsonl: {options.steps:,} steps, {size:.1f} MiB; best of {options.repeats}")
    print(f"{'':<28}{'wall s':>8}{'peak RSS MiB':>14}")
    print(f"{'json.loads every line':<28}{best['peer'][0]:>8.2f}{best['peer'][1]:>14.0f}")
    print(f"{'sftdoctor report':<28}{best['report'][0]:>8.2f}{best['report'][1]:>14.0f}")
    print(
        f"ratio report / parse only: {best['report'][0] / best['peer'][0]:.2f}x time, "
        f"{best['report'][1] / best['peer'][1]:.2f}x memory"
    )
    print(f"wrote report.html ({page:.2f} MiB) and {len(panels)} panels: {', '.join(panels)}")
    for line in said:
        print(f"  curve reader: {line}")


if __name__ == "__main__":
    main()
