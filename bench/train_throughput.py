"""Real tokens per second of `sftdoctor train` with its automatic choices against a plain TRL SFTTrainer in
each setting a practitioner would try, on the same tiny model and the same data, in one run.

    python bench/train_throughput.py [--rows 400] [--max-length 512] [--repeats 1]

Every trainer makes one pass over the same rows (an epoch, however it batches or packs them), so each
processes the same tokens: a fixed step count would favour whoever's first steps hold the shortest rows
(LengthGroupedSampler starts with the longest).

The data has a realistic length distribution: lognormal token counts (median 150, sigma 0.8, as public
SFT sets have), capped at max_length. TRL's settings: its defaults (gradient checkpointing on, no
packing), packing on (its "bfd", padding-free), checkpointing off, and both. sftdoctor's run leaves packing,
checkpointing and the batching of rows to its plan (here: sdpa, no varlen kernel, no GPU to size for).
Prints real (non-padding) tokens per second, the share of padding, each ratio to sftdoctor, and whether
sftdoctor is at least as fast as the fastest TRL setting.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
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


def sftdoctor_run(work: Path, data: Path, max_length: int, rows: int) -> dict:
    """`sftdoctor train` with every automatic choice left to it, on the CPU."""
    out = work / "sftdoctor"
    shutil.rmtree(out, ignore_errors=True)
    config = work / "run.toml"
    config.write_text(f'''[model]
path = "{TINY / "model"}"
weights = "random"
[data]
train = "{data}"
max_length = {max_length}
[training]
per_device_batch_size = {BATCH}
epochs = 1
logging_steps = {math.ceil(rows / BATCH)}
save_steps = 100000
output_dir = "{out}"
''')
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each, interleaved; the median rate counts")
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
