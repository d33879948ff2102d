"""Read speed and peak memory of `sftdoctor explain --log` on a multi-GB log, against peers in the same run.

    python bench/log_triage.py [--size-gb 2] [--keep FILE] [--signatures-x10]

Writes a synthetic 8-rank training log (Trainer dicts, tqdm redraws, NCCL INFO lines, warnings, and
the real failure excerpts of tests/fixtures/logs spread through it), then times:
  cat FILE > /dev/null                 the speed of reading the file (page cache or disk)
  grep -c -F -f NEEDLES FILE           a one-pass literal search for the same signatures
  sftdoctor explain --log FILE --json  the triage, with -j 1 and -j CPUs (at most 8)
and prints MB/s of each (and the CPU seconds, which a busy machine does not inflate as much), the
ratios, and the triage's peak RSS (all its processes). --signatures-x10 times the triage again with
nine synthetic signatures added for each real one (distinct needles made of the real needles' words,
none of them in the log): the findings must not change, and the speed should not either.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import re
import resource
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
            lines.append(
                f"{{'loss': '{rng.uniform(0.5, 3):.4g}', 'grad_norm': '{rng.uniform(0.1, 2):.4g}', "
                f"'learning_rate': '{2e-5 * rng.random():.4g}', 'epoch': '{step / 1e4:.4g}'}}\n"
            )
        kind = rng.random()
        if kind < 0.15:
            lines.append(
                f"node{rank // 4}:{1000 + rank}:{1100 + rank} [{rank % 4}] NCCL INFO Channel {step % 32:02d}/0 : "
                f"{rank}[{rank % 4}] -> {(rank + 1) % rank_count}[{(rank + 1) % 4}] via P2P/CUMEM/read\n"
            )
        elif kind < 0.17:
            lines.append(
                f"[rank{rank}]:[W{step:04d} 12:00:00.000000000 ProcessGroupNCCL.cpp:4751] Warning: "
                "TORCH_NCCL_AVOID_RECORD_STREAMS is the default now, this environment variable is ignored\n"
            )
        elif kind < 0.18:
            lines.append(
                f"[INFO|trainer.py:2134] 2025-01-0{1 + rank % 9} 12:00:00,{step % 1000:03d} >> "
                f"Saving model checkpoint to runs/out/checkpoint-{step}\n"
            )
    return "".join(lines).encode()


def log_parts() -> tuple[list[bytes], list[bytes]]:
    """The healthy blocks and the failure excerpts the log is made of."""
    rng = random.Random(0)
    return [training_block(rng) for _ in range(8)], [p.read_bytes() + b"\n" for p in sorted(LOGS.glob("*.log"))]


def write_log(path: Path, size: int, blocks: list[bytes], failures: list[bytes]) -> None:
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


def synthetic_needles(count: int, absent_from: bytes) -> list[str]:
    """`count` made-up needles of three words drawn from the real needles (as new kb topics would add),
    none of them in `absent_from`."""
    words = sorted({word for needle in needles() for word in needle.split() if len(word) > 2})
    rng, made, seen = random.Random(10), [], set(needles())
    while len(made) < count:
        needle = " ".join(rng.sample(words, 3))
        if needle not in seen and needle.encode() not in absent_from:
            seen.add(needle)
            made.append(needle)
    return made


def with_synthetic(made: list[str]) -> tuple:
    """The real signatures, then made-up symptoms copying them (as many needles each) until `made` is used up."""
    from sftdoctor.triage.signatures import signatures

    real, extra, left = signatures(), [], iter(made)
    for i in itertools.count():
        sig = real[i % len(real)]
        arity = 1 if isinstance(sig.needle, str) else len(sig.needle)
        if len(taken := list(itertools.islice(left, arity))) < arity:
            return real + tuple(extra)
        extra.append(
            dataclasses.replace(
                sig,
                id=f"synthetic-{i}",
                needle=taken[0] if arity == 1 else tuple(taken),
                regex=re.compile("|".join(map(re.escape, taken))),
                role="symptom",
                summary="",
                only_if=(),
                wraps=0,
            )
        )


# `sftdoctor explain` with the made-up signatures (its worker processes get the needles from it)
X10 = """
import json, sys
sys.path.insert(0, {bench!r})
import sftdoctor.triage as triage
from log_triage import with_synthetic
x10 = with_synthetic(json.load(open({made!r})))
triage.signatures = lambda: x10
from sftdoctor.cli import main
sys.argv[0] = "sftdoctor"
main()
"""


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], **kw) -> tuple[float, float]:
    """Wall and CPU seconds (the process and the children it waited for)."""
    start, cpu = time.perf_counter(), cpu_of_children()
    subprocess.run(command, stdout=kw.pop("stdout", subprocess.PIPE), stderr=subprocess.PIPE, **kw)
    return time.perf_counter() - start, cpu_of_children() - cpu


def watched(command: list[str], env: dict) -> tuple[float, float, bytes, int]:
    """Wall and CPU seconds, stdout and the peak RSS of the whole process tree (workers included), sampled
    every 20 ms."""
    import psutil  # installed with the train extra (accelerate, deepspeed)

    start, cpu = time.perf_counter(), cpu_of_children()
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
        return seconds, cpu_of_children() - cpu, out.read(), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    parser.add_argument("--signatures-x10", action="store_true", help="also time ten times as many signatures")
    args = parser.parse_args()
    jobs = min(os.cpu_count() or 1, 8)
    with tempfile.TemporaryDirectory() as tmp:
        log = args.keep or Path(tmp) / "train.log"
        blocks, failures = log_parts()
        write_log(log, int(args.size_gb * 2**30), blocks, failures)
        size_mb = log.stat().st_size / 1e6
        pattern_file = Path(tmp) / "needles.txt"
        pattern_file.write_text("\n".join(needles()) + "\n")
        subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL)  # warm the page cache for everyone alike
        peers = {
            "cat": timed(["cat", str(log)], stdout=subprocess.DEVNULL),
            "grep -c -F -f needles": timed(
                ["grep", "-c", "-a", "-F", "-f", str(pattern_file), str(log)], env={**os.environ, "LC_ALL": "C"}
            ),
        }
        programs = {"": [sys.executable, "-m", "sftdoctor"]}
        if args.signatures_x10:
            made = Path(tmp) / "synthetic.json"  # nine made-up needles for each real one
            made.write_text(json.dumps(synthetic_needles(9 * len(needles()), b"".join(blocks + failures))))
            x10 = X10.format(bench=str(Path(__file__).parent), made=str(made))
            programs[", x10 signatures"] = [sys.executable, "-c", x10]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        runs = {
            (label, n): watched([*program, "explain", "--log", str(log), "--json", "-j", str(n)], env)
            for label, program in programs.items()
            for n in sorted({1, jobs})
        }
    report(size_mb, peers, runs)


def report(size_mb: float, peers: dict, runs: dict) -> None:
    """MB/s of each, then the triage against its peers, against -j 1 and against today's signatures."""

    def name(label, n):
        return f"sftdoctor explain --log -j {n}{label}"

    diagnosis = json.loads(next(iter(runs.values()))[2])
    print(
        f"log: {size_mb:,.0f} MB, {diagnosis['lines']:,} lines, {len(diagnosis['findings'])} findings, "
        f"root cause {diagnosis['root_cause']}"
    )
    for peer, (wall, cpu) in peers.items():
        print(f"{peer:<46} {wall:6.2f} s {size_mb / wall:6.0f} MB/s  CPU {cpu:5.2f} s")
    for (label, n), (wall, cpu, _, peak) in runs.items():
        print(
            f"{name(label, n):<46} {wall:6.2f} s {size_mb / wall:6.0f} MB/s  CPU {cpu:5.2f} s  "
            f"peak RSS {peak / 2**20:4.0f} MiB (all processes)"
        )
    cat, grep = peers["cat"][0], peers["grep -c -F -f needles"][0]
    for (label, n), (wall, *_) in runs.items():
        against = [f"{cat / wall:.3f} of cat's read speed", f"{grep / wall:.2f} of grep -F's"]
        if n != 1:
            against.append(f"{runs[label, 1][0] / wall:.2f}x -j 1's")
        if label:
            against.append(f"{runs['', n][0] / wall:.2f}x today's signatures'")
        print(f"{name(label, n)}: {', '.join(against)}")
    same = {json.dumps(json.loads(stdout), sort_keys=True) for _, _, stdout, _ in runs.values()}
    print("findings: " + ("the same in every run" if len(same) == 1 else "DIFFER between runs"))


if __name__ == "__main__":
    main()
