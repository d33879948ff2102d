"""Real tokens per second of the sftdoctor trainer against a plain TRL SFTTrainer with its default
settings, on the same tiny model and the same length-skewed data, in one run.

    python bench/train_throughput.py [--steps 20]

Prints non-padding tokens per second for both, their ratio, and the share of padding each processed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny"
BATCH = 8


def sftdoctor_run(work: Path, steps: int, max_length: int) -> dict:
    """`sftdoctor train` with its defaults (packing "auto", gradient checkpointing on) and the
    example's max_length (packed rows of that many tokens), on the CPU."""
    config = work / "run.toml"
    config.write_text(f'''[model]
path = "{TINY / 'model'}"
weights = "random"
[data]
train = "{TINY / 'data' / 'train.jsonl'}"
max_length = {max_length}
[training]
per_device_batch_size = {BATCH}
max_steps = {steps}
logging_steps = {steps}
save_steps = {steps * 10}
output_dir = "{work / 'sftdoctor'}"
''')
    proc = subprocess.run([sys.executable, "-m", "sftdoctor", "train", str(config)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stdout[-2000:] + proc.stderr[-2000:])
    records = [json.loads(line) for line in (work / "sftdoctor" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "tokens_seen" in r)
    runtime = next(r["train_runtime"] for r in records if "train_runtime" in r)
    return {"tokens": step["tokens_seen"], "seconds": runtime, "padding": step["padding_fraction"]}


BASELINE = r'''
import json, sys, time
from datasets import load_dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer
tiny, out, steps, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(f"{tiny}/model")
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(f"{tiny}/model"))
data = load_dataset("json", data_files=f"{tiny}/data/train.jsonl", split="train")
# TRL's defaults, except what the CPU needs (bf16 off) and the shared step count, batch and no reporting.
args = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=batch, bf16=False,
                 report_to=[], save_strategy="no", logging_steps=steps, disable_tqdm=True)
trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
collate, seen = trainer.data_collator, {"real": 0, "all": 0}
def counting(examples):
    b = collate(examples)
    seen["real"] += int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
    seen["all"] += b["input_ids"].numel()
    return b
trainer.data_collator = counting
runtime = trainer.train().metrics["train_runtime"]
print(json.dumps({"tokens": seen["real"], "seconds": runtime, "padding": 1 - seen["real"] / seen["all"]}))
'''


def baseline_run(work: Path, steps: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", BASELINE, str(TINY), str(work / "trl"), str(steps), str(BATCH)],
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-length", type=int, default=256, help="sftdoctor's packed row length")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sftdoctor-bench-"))
    try:
        results = {"sftdoctor train": sftdoctor_run(work, args.steps, args.max_length), "TRL SFTTrainer defaults": baseline_run(work, args.steps)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'trainer':<26} {'real tokens':>12} {'train s':>8} {'real tok/s':>11} {'padding':>8}")
    for name, r in results.items():
        r["rate"] = r["tokens"] / r["seconds"]
        print(f"{name:<26} {r['tokens']:>12,} {r['seconds']:>8.1f} {r['rate']:>11,.0f} {r['padding']:>8.1%}")
    ours, theirs = results["sftdoctor train"]["rate"], results["TRL SFTTrainer defaults"]["rate"]
    print(f"ratio sftdoctor / TRL defaults (real tokens per second) = {ours / theirs:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
