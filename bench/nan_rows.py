"""What tracing a non-finite step to its rows costs: in the loop, and at the stop.

    python bench/nan_rows.py [--rows 1000000]

1. In the loop: the trainer keeps a reference to each micro-batch of the step (`rows.keep`, called by
   sft.WatchedSFTTrainer.compute_loss: the only per-step work). Its cost per micro-batch, timed over 10^6 calls,
   against the smallest real step: one forward and backward of the bundled tiny Qwen2 on 8 rows of 256 tokens on
   this CPU. The ratio is the overhead.
2. At the stop: the rows found for the sequences of a step (16 sequences) among `--rows` tokenized rows of 20 to
   400 tokens (an Arrow list column, as TRL leaves them): the seconds and the peak memory of the lookup.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Trainer:  # the attributes rows.keep reads and writes
    class State:
        global_step = 0

    state = State()


def bookkeeping_s(calls: int = 1_000_000) -> float:
    from sftdoctor.train.rows import keep

    trainer, inputs = Trainer(), {"input_ids": None}
    begin = time.perf_counter()
    for i in range(calls):
        trainer.state.global_step = i // 8  # 8 micro-batches a step
        keep(trainer, inputs)
    return (time.perf_counter() - begin) / calls


def tiny_step_s(repeats: int = 5) -> float:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(ROOT / "examples" / "tiny" / "model")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, config.vocab_size, (8, 256))
    times = []
    for _ in range(repeats + 1):
        begin = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        times.append(time.perf_counter() - begin)
    return statistics.median(times[1:])


def lookup(rows: int) -> tuple[float, float, int]:
    import pyarrow as pa
    import torch

    from sftdoctor.train.rows import RowIndex

    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 401, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(0, 150_000, int(offsets[-1]), dtype=np.int64)
    column = pa.chunked_array([pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))])
    wanted = rng.choice(rows, 16, replace=False)
    sequences = [torch.from_numpy(values[offsets[i] : offsets[i + 1]]) for i in wanted]
    tracemalloc.start()
    begin = time.perf_counter()
    index = RowIndex(column, np.arange(rows), max_length=None)
    found = [index.find(seq) for seq in sequences]
    took = time.perf_counter() - begin
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [f[0] for f in found] == list(wanted), "a sequence was not found"
    return took, peak / 2**20, int(offsets[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    per_call, step = bookkeeping_s(), tiny_step_s()
    print(
        f"1. in the loop: {per_call * 1e6:.2f} us per micro-batch kept; the tiny model's step (8 x 256 tokens, "
        f"forward + backward, CPU) {step * 1e3:.1f} ms: overhead {per_call / step:.2e} of a step "
        f"({per_call * 8 / step:.2e} at 8 micro-batches a step)"
    )
    took, peak, tokens = lookup(args.rows)
    print(
        f"2. at the stop: 16 sequences found among {args.rows:,} rows ({tokens:,} tokens) in {took:.2f} s, "
        f"peak {peak:.1f} MiB beyond the rows themselves"
    )


if __name__ == "__main__":
    main()
