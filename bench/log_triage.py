"""Read speed and peak memory of `sftdoctor explain --log` on a multi-GB log, against peers in the same run.

    python bench/log_triage.py [--size-gb 2] [--keep FILE]

Writes a synthetic 8-rank training log (Trainer dicts, tqdm redraws, NCCL INFO lines, warnings, and
the real failure excerpts of tests/fixtures/logs spread through it), then times:
  cat FILE > /dev/null                 the speed of reading the file (page cache or disk)
  grep -c -F -f NEEDLES FILE           a one-pass literal search for the same signatures
  sftdoctor explain --log FILE --json  the triage
and prints MB/s of each, the ratios, and the triage's peak RSS above a bare `import sftdoctor.triage`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "fixtures" / "logs"

def training_block(rng: random.Random, rank_count: int = 8) -> bytes:
    """About 1 MB of what a healthy multi-rank run prints: mostly tqdm redraws, a Trainer dict every
    10 steps, NCCL INFO lines, warnings and checkpoint messages."""
    lines = []
    step = 0
    while sum(map(len, lines)) < 1 << 20:
        step += 1
        rank = rng.randrange(rank_count)
        bar = "█" * (step % 40)
        lines.append(f"[rank{rank}]: {step % 100}%|{bar:<40}| {step}/50000 [1:02:03<9:08:07, 1.37it/s]\r")
        if step % 10 == 0:
            lines.append(f"{{'loss': '{rng.uniform(0.5, 3):.4g}', 'grad_norm': '{rng.uniform(0.1, 2):.4g}', "
                         f"'learning_rate': '{2e-5 * rng.random():.4g}', 'epoch': '{step / 1e4:.4g}'}}\n")
        kind = rng.random()
        if kind < 0.15:
            lines.append(f"node{rank // 4}:{1000 + rank}:{1100 + rank} [{rank % 4}] NCCL INFO Channel {step % 32:02d}/0 : "
                         f"{rank}[{rank % 4}] -> {(rank + 1) % rank_count}[{(rank + 1) % 4}] via P2P/CUMEM/read\n")
        elif kind < 0.17:
            lines.append(f"[rank{rank}]:[W{step:04d} 12:00:00.000000000 ProcessGroupNCCL.cpp:4751] Warning: "
                         "TORCH_NCCL_AVOID_RECORD_STREAMS is the default now, this environment variable is ignored\n")
        elif kind < 0.18:
            lines.append(f"[INFO|trainer.py:2134] 2025-01-0{1 + rank % 9} 12:00:00,{step % 1000:03d} >> "
                         f"Saving model checkpoint to runs/out/checkpoint-{step}\n")
    return "".join(lines).encode()


def write_log(path: Path, size: int) -> None:
    rng = random.Random(0)
    blocks = [training_block(rng) for _ in range(8)]
    failures = [p.read_bytes() + b"\n" for p in sorted(LOGS.glob("*.log"))]
    written, i = 0, 0
    with open(path, "wb") as out:
        while written < size:
            chunk = blocks[i % len(blocks)]
            if i % 97 == 96:  # a real failure excerpt now and then
                chunk += failures[(i // 97) % len(failures)]
            out.write(chunk)
            written += len(chunk)
            i += 1


def needles() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from sftdoctor.triage.signatures import signatures

    out = []
    for sig in signatures():
        out += [sig.needle] if isinstance(sig.needle, str) else list(sig.needle)
    return sorted(set(out))


def timed(command: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(command, stdout=kw.pop("stdout", subprocess.PIPE), stderr=subprocess.PIPE, **kw)
    return time.perf_counter() - start, done


def watched(command: list[str], env: dict) -> tuple[float, bytes, int]:
    """Wall time, stdout and the peak RSS of the whole process tree (workers included), sampled every 20 ms."""
    import psutil  # installed with the train extra (accelerate, deepspeed)

    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=env)
        root, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree))
            except psutil.Error:
                pass
            time.sleep(0.02)
        seconds = time.perf_counter() - start
        out.seek(0)
        return seconds, out.read(), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    args = parser.parse_args()
    jobs = min(os.cpu_count() or 1, 8)
    with tempfile.TemporaryDirectory() as tmp:
        log = args.keep or Path(tmp) / "train.log"
        write_log(log, int(args.size_gb * 2**30))
        size_mb = log.stat().st_size / 1e6
        pattern_file = Path(tmp) / "needles.txt"
        pattern_file.write_text("\n".join(needles()) + "\n")
        subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL)  # warm the page cache for everyone alike
        results, peaks = {}, {}
        results["cat"], _ = timed(["cat", str(log)], stdout=subprocess.DEVNULL)
        results["grep -c -F -f needles"], _ = timed(["grep", "-c", "-a", "-F", "-f", str(pattern_file), str(log)],
                                                    env={**os.environ, "LC_ALL": "C"})
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for n in sorted({1, jobs}):
            name = f"sftdoctor explain --log -j {n}"
            command = [sys.executable, "-m", "sftdoctor", "explain", "--log", str(log), "--json", "-j", str(n)]
            results[name], stdout, peaks[name] = watched(command, env)
            diagnosis = json.loads(stdout)
    print(f"log: {size_mb:,.0f} MB, {diagnosis['lines']:,} lines, {len(diagnosis['findings'])} findings, "
          f"root cause {diagnosis['root_cause']}")
    for name, seconds in results.items():
        peak = f"  peak RSS {peaks[name] / 2**20:5.0f} MiB (all processes)" if name in peaks else ""
        print(f"{name:<32} {seconds:7.2f} s  {size_mb / seconds:7.0f} MB/s{peak}")
    for name in peaks:
        print(f"{name}: {results['cat'] / results[name]:.3f} of cat's read speed, "
              f"{results['grep -c -F -f needles'] / results[name]:.2f} of grep -F's")


if __name__ == "__main__":
    main()
