"""Real tokens per second of `sftdoctor train` with its automatic choices against a plain TRL SFTTrainer in
each setting a practitioner would try, on the same tiny model and the same data, in one run.

    python bench/train_throughput.py [--rows 400] [--max-length 512] [--repeats 1]
    python bench/train_throughput.py --sharding [--rows 400] [--max-length 512] [--repeats 1]

Every trainer makes one pass over the same rows (an epoch, however it batches or packs them), so each
processes the same tokens: a fixed step count would favour whoever's first steps hold the shortest rows
(LengthGroupedSampler starts with the longest).

The data has a realistic length distribution: lognormal token counts (median 150, sigma 0.8, as public
SFT sets have), capped at max_length. TRL's settings: its defaults (gradient checkpointing on, no
packing), packing on (its "bfd", padding-free), checkpointing off, and both. sftdoctor's run leaves packing,
checkpointing and the batching of rows to its plan (here: sdpa, no varlen kernel, no GPU to size for).
Prints real (non-padding) tokens per second, the share of padding, each ratio to sftdoctor, and whether
sftdoctor is at least as fast as the fastest TRL setting.

--sharding compares the sharding engines instead, all `sftdoctor train` on 2 CPU ranks (gloo), the same rows,
global batch and one epoch: DDP (no section: the peer), [deepspeed] zero_stage 2 and 3, [fsdp] and [fsdp]
reshard_after_forward = false. Prints real tokens per second over the Trainer's train_runtime (--no-rehearse;
startup and the checks not timed) and each rank's peak host RSS over the whole run (VmHWM sampled from /proc of
the rank processes), each as a ratio to DDP's in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny"
BATCH = 8
MEDIAN, SIGMA = 150, 0.8
TRL_SETTINGS = {  # name: (packing, gradient checkpointing)
    "TRL defaults": (False, True),
    "TRL packing": (True, True),
    "TRL checkpointing off": (False, False),
    "TRL packing, checkpointing off": (True, False),
}


def write_data(path: Path, rows: int, max_length: int, seed: int = 0) -> dict:
    """Text rows of lognormal token length, capped at max_length: slices of the example's own words (which the
    tiny tokenizer knows, so a slice decodes and re-encodes to about its length). Returns length statistics."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    words = " ".join(
        turn["content"]
        for line in (TINY / "data" / "train.jsonl").read_text().splitlines()
        for turn in json.loads(line)["messages"]
    ).split()
    rng = random.Random(seed)
    lengths = []
    with path.open("w") as out:
        for _ in range(rows):
            n = max(8, min(max_length, round(rng.lognormvariate(math.log(MEDIAN), SIGMA))))
            start = rng.randrange(len(words))
            ids = tokenizer(" ".join((words * 2)[start : start + n]), add_special_tokens=False)["input_ids"][:n]
            text = tokenizer.decode(ids)
            out.write(json.dumps({"text": text}) + "\n")
            lengths.append(len(tokenizer(text)["input_ids"]))
    lengths.sort()
    return {"median": lengths[len(lengths) // 2], "p95": lengths[int(len(lengths) * 0.95)], "max": lengths[-1]}


def write_config(path: Path, data: Path, max_length: int, training: str, out: Path, sections: str = "") -> Path:
    """A run config over the tiny model and `data`: one epoch at per-device batch BATCH, no saves, the [training]
    lines given, and any further sections."""
    path.write_text(f'''[model]
path = "{TINY / "model"}"
weights = "random"
[data]
train = "{data}"
max_length = {max_length}
[training]
per_device_batch_size = {BATCH}
epochs = 1
save_steps = 100000
output_dir = "{out}"
{training}
{sections}''')
    return path


def sftdoctor_run(work: Path, data: Path, max_length: int, rows: int) -> dict:
    """`sftdoctor train` with every automatic choice left to it, on the CPU."""
    out = work / "sftdoctor"
    shutil.rmtree(out, ignore_errors=True)
    config = write_config(work / "run.toml", data, max_length, f"logging_steps = {math.ceil(rows / BATCH)}", out)
    proc = subprocess.run([sys.executable, "-m", "sftdoctor", "train", str(config)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stdout[-2000:] + proc.stderr[-2000:])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "tokens_seen" in r)
    runtime = next(r["train_runtime"] for r in records if "train_runtime" in r)
    choice = [line.strip() for line in proc.stdout.splitlines() if line.startswith(("packing ", "checkpointing "))]
    return {"tokens": step["tokens_seen"], "seconds": runtime, "padding": step["padding_fraction"], "choice": choice}


BASELINE = r"""
import json, sys
from datasets import load_dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer
tiny, data, out, batch, max_length, packing, checkpointing = sys.argv[1:8]
tokenizer = AutoTokenizer.from_pretrained(f"{tiny}/model")
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(f"{tiny}/model"))
# TRL's defaults but for the setting tried, what the CPU needs (bf16 off), the shared epoch, batch and max_length.
args = SFTConfig(output_dir=out, num_train_epochs=1, per_device_train_batch_size=int(batch), bf16=False,
                 max_length=int(max_length), packing=packing == "1", gradient_checkpointing=checkpointing == "1",
                 report_to=[], save_strategy="no", logging_steps=100000, disable_tqdm=True, use_cpu=True)
trainer = SFTTrainer(model=model, args=args, train_dataset=load_dataset("json", data_files=data, split="train"),
                     processing_class=tokenizer)
collate, seen = trainer.data_collator, {"real": 0, "all": 0}
def counting(examples):
    b = collate(examples)
    seen["real"] += int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
    seen["all"] += b["input_ids"].numel()
    return b
trainer.data_collator = counting
runtime = trainer.train().metrics["train_runtime"]
print(json.dumps({"tokens": seen["real"], "seconds": runtime, "padding": 1 - seen["real"] / seen["all"]}))
"""


def trl_run(work: Path, data: Path, max_length: int, packing: bool, checkpointing: bool) -> dict:
    argv = [
        sys.executable,
        "-c",
        BASELINE,
        str(TINY),
        str(data),
        str(work / "trl"),
        str(BATCH),
        str(max_length),
        "1" if packing else "0",
        "1" if checkpointing else "0",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- --sharding: the sharding engines against DDP

RANKS = 2
SHARDING = {  # name: the run config's sharding section (none: DDP, the peer every ratio is against)
    "DDP (no section)": "",
    "[deepspeed] zero_stage = 2": "[deepspeed]\nzero_stage = 2\n",
    "[deepspeed] zero_stage = 3": "[deepspeed]\nzero_stage = 3\n",
    "[fsdp]": "[fsdp]\n",
    "[fsdp] reshard_after_forward=false": "[fsdp]\nreshard_after_forward = false\n",
}
PEER = "DDP (no section)"


def proc_children() -> dict[int, list[tuple[int, int]]]:
    """Every process's children as (pid, start time), from /proc/PID/stat: after the parenthesised name come the
    state, the parent, ... and (the 20th field after it) the start time, which tells a reused pid apart."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            ppid, start = int(fields[1]), int(fields[19])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append((int(entry.name), start))
    return children


def rank_of(pid: int) -> int | None:
    """The RANK torchrun gave the process (its environment), None for any other process."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(v[5:]) for v in environ if v.startswith(b"RANK=") and v[5:].isdigit()), None)


def high_water_kib(pid: int) -> int | None:
    """The kernel's own peak resident set of the process since it started (VmHWM in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)


class RankMemory:
    """Peak host RSS of each rank of a launch over its whole life, sampled from /proc while it runs: every
    `interval` s, each rank process under `root` (a process with a RANK whose parent has none: torchrun's
    workers, not their forked helpers) is read for VmHWM, the kernel's high-water mark of its RSS. Sampling a
    high-water mark misses no short spike, only what a rank adds after the last sample before it exits."""

    def __init__(self, root: int, interval: float = 0.1):
        self.root, self.interval, self.peaks = root, interval, {}
        self.ranks: dict[tuple[int, int], int | None] = {}  # (pid, start): its rank (None: none), read once
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self) -> None:
        while not self.done.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        children, todo = proc_children(), [(self.root, 0)]
        while todo:
            parent = todo.pop()
            for child in children.get(parent[0], []):
                todo.append(child)
                if child not in self.ranks:
                    self.ranks[child] = rank_of(child[0])
                rank = self.ranks[child]
                if rank is None or self.ranks.get(parent) is not None:
                    continue
                kib = high_water_kib(child[0])
                if kib is not None:
                    self.peaks[rank] = max(self.peaks.get(rank, 0), kib)

    def stop(self) -> dict[int, float]:
        """Each rank's peak RSS in GiB."""
        self.done.set()
        self.thread.join()
        return {rank: kib / 2**20 for rank, kib in sorted(self.peaks.items())}


def sharded_run(work: Path, data: Path, max_length: int, rows: int, name: str, section: str) -> dict:
    """`sftdoctor train` on RANKS CPU processes (gloo) with one sharding section, packing and checkpointing off
    for all: the engine is the only difference. --no-rehearse; the rate is the run's real tokens over the
    Trainer's train_runtime (metrics.jsonl), so startup and the checks are not timed."""
    out = work / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    shutil.rmtree(out, ignore_errors=True)
    training = f"""global_batch_size = {BATCH * RANKS}
packing = false
gradient_checkpointing = false
logging_steps = {math.ceil(rows / (BATCH * RANKS))}
seed = 0"""
    sections = f'[launch]\nnproc_per_node = {RANKS}\nmaster_port = "auto"\n{section}'
    config = write_config(work / "sharded.toml", data, max_length, training, out, sections)
    argv = [sys.executable, "-m", "sftdoctor", "train", str(config), "--no-rehearse"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory = RankMemory(proc.pid)
    stdout, stderr = proc.communicate()
    peaks = memory.stop()
    if proc.returncode:
        sys.exit(f"{name}: sftdoctor train failed\n" + stdout[-2000:] + stderr[-2000:])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "tokens_seen" in r]
    runtime = next(r["train_runtime"] for r in records if "train_runtime" in r)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "tokens": steps[-1]["tokens_seen"],  # every rank's real tokens (the metrics callback gathers them)
        "seconds": runtime,
        "rss": peaks,
        "logged_rss": max(r["host_rss_gib"] for r in steps),  # the max over ranks at the logging steps only
        "sharding": next((line.strip() for line in stdout.splitlines() if line.startswith("sharding ")), "?"),
    }


def compare_sharding(work: Path, data: Path, args: argparse.Namespace) -> None:
    """Every engine once per repeat, interleaved (a load change hits all alike); the medians are compared."""
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for name, section in SHARDING.items():
            runs.setdefault(name, []).append(sharded_run(work, data, args.max_length, args.rows, name, section))
    print_sharding(runs)


def median_rss(runs: list[dict], rank: int) -> float | None:
    values = [r["rss"][rank] for r in runs if rank in r["rss"]]
    return statistics.median(values) if values else None


def print_sharding(runs: dict[str, list[dict]]) -> None:
    rate = {name: statistics.median(r["tokens"] / r["seconds"] for r in rs) for name, rs in runs.items()}
    peer_rss = {rank: median_rss(runs[PEER], rank) for rank in range(RANKS)}
    print(
        "peak host RSS per rank: VmHWM (the kernel's high-water mark) of each rank process, sampled from /proc every "
        "0.1 s over the whole run; logged: metrics.jsonl's host_rss_gib, max over ranks and logging steps"
    )
    header = "".join(f" {f'rank {k} RSS GiB (x DDP)':>23}" for k in range(RANKS))
    columns = f"{'real tok/s':>10} {'x DDP':>6} {'each run (tok/s)':>17} {'train s':>7}"
    print(f"{'sharding':<35} {columns}{header} {'logged':>6}")
    for name, rs in runs.items():
        each = "/".join(f"{r['tokens'] / r['seconds'] / 1000:.1f}k" for r in rs)
        seconds = statistics.median(r["seconds"] for r in rs)
        cells = ""
        for rank in range(RANKS):
            gib, peer = median_rss(rs, rank), peer_rss[rank]
            cells += f" {f'{gib:.3f} ({gib / peer:.2f})' if gib and peer else 'not sampled':>23}"
        logged = statistics.median(r["logged_rss"] for r in rs)
        print(
            f"{name:<35} {rate[name]:>10,.0f} {rate[name] / rate[PEER]:>6.2f} {each:>17} {seconds:>7.1f}{cells} "
            f"{logged:>6.3f}"
        )
    print("sftdoctor's sharding line:")
    for name, rs in runs.items():
        print(f"  {name:<35} {rs[-1]['sharding'][8:].strip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each, interleaved; the median rate counts")
    parser.add_argument(
        "--sharding", action="store_true", help="compare DDP, ZeRO-2, ZeRO-3 and FSDP2 on 2 CPU ranks instead"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sftdoctor-bench-"))
    rates: dict[str, list[float]] = {}
    results: dict[str, dict] = {}
    try:
        data = work / "train.jsonl"
        lengths = write_data(data, args.rows, args.max_length)
        print(
            f"data: {args.rows} rows, tokens per row median {lengths['median']}, p95 {lengths['p95']}, "
            f"max {lengths['max']} (max_length {args.max_length}); batch {BATCH}, one epoch each, CPU"
        )
        if args.sharding:
            print(
                f"{RANKS} ranks x micro-batch {BATCH} = global batch {BATCH * RANKS}; {args.repeats} repeat(s), "
                f"interleaved; load average before {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
            )
            compare_sharding(work, data, args)
            print(f"load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min)")
            return 0
        for _ in range(args.repeats):
            runs = {"sftdoctor train (auto)": lambda: sftdoctor_run(work, data, args.max_length, args.rows)}
            runs.update(
                {
                    name: (lambda p=p, c=c: trl_run(work, data, args.max_length, p, c))
                    for name, (p, c) in TRL_SETTINGS.items()
                }
            )
            for name, run in runs.items():
                r = run()
                rates.setdefault(name, []).append(r["tokens"] / r["seconds"])
                results[name] = r
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ours = statistics.median(rates["sftdoctor train (auto)"])
    print(f"sftdoctor chose: {'; '.join(results['sftdoctor train (auto)']['choice'])}")
    print(f"{'trainer':<32} {'real tok/s':>11} {'padding':>8} {'sftdoctor / it':>15}")
    for name, r in results.items():
        rate = statistics.median(rates[name])
        print(f"{name:<32} {rate:>11,.0f} {r['padding']:>8.1%} {ours / rate:>15.2f}")
    fastest = max((n for n in TRL_SETTINGS), key=lambda n: statistics.median(rates[n]))
    ratio = ours / statistics.median(rates[fastest])
    print(
        f"ratio sftdoctor / fastest TRL setting ({fastest}) = {ratio:.2f}: "
        f"{'at least as fast' if ratio >= 1.0 else 'SLOWER'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
