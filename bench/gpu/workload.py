"""What the GPU suite trains: the model (Qwen2-0.5B's public shape, or the tiny example on a CPU), the
synthetic data both trainers read, sftdoctor run configs, and the arithmetic on what the runs record
(tokens per second, step times, peak memory, MFU).

No weights are needed: `[model] weights = "random"` builds the model from config.json. The tokenizer is the
tiny example's byte-level BPE (ids below 384, a corner of the 151,936-token vocabulary), as in
bench/lora_vs_full.py --model-size 0.5b, so nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny" / "model"

sys.path.insert(0, str(ROOT / "examples"))

from make_tiny import QWEN2_05B, WORDS  # noqa: E402  (WORDS: one token each in the tiny tokenizer)


@dataclass
class Workload:
    """The model, the data and the step counts, the same for every run of the suite."""

    name: str  # "qwen2-0.5b" or "tiny"
    model_dir: Path
    data: Path
    max_length: int
    batch: int  # per-device micro-batch of the throughput runs
    warmup: int  # steps left out of every rate
    steps: int  # measured steps after the warm-up
    memory_steps: int  # steps of each memory-plan run (the peak comes with the first optimizer step)
    rows: int
    config: dict[str, Any] = field(default_factory=dict)
    token_lengths: list[int] = field(default_factory=list)

    @property
    def max_steps(self) -> int:
        return self.warmup + self.steps

    def describe(self) -> dict[str, Any]:
        lengths = self.token_lengths
        out = {k: v for k, v in asdict(self).items() if k not in ("config", "token_lengths")}
        out.update(
            model_dir=str(self.model_dir),
            data=str(self.data),
            max_steps=self.max_steps,
            hidden=self.config.get("hidden_size"),
            layers=self.config.get("num_hidden_layers"),
            vocab=self.config.get("vocab_size"),
            tied=bool(self.config.get("tie_word_embeddings")),
            mean_tokens=round(statistics.mean(lengths), 1) if lengths else None,
            median_tokens=statistics.median(lengths) if lengths else None,
            max_tokens=max(lengths) if lengths else None,
            attention_seq_len=round(attention_seq_len(lengths), 1) if lengths else None,
        )
        return out


SIZES = {  # max_length, batch, warm-up, measured steps, memory steps, rows, median tokens, sigma
    "qwen2-0.5b": (1024, 8, 5, 30, 4, 2400, 320, 0.8),
    "tiny": (128, 4, 2, 4, 3, 160, 48, 0.7),
}


def prepare(work: Path, name: str, overrides: dict[str, int | None]) -> Workload:
    """The model folder (config.json and the tiny tokenizer) and the data file, written into `work`."""
    max_length, batch, warmup, steps, memory_steps, rows, median, sigma = SIZES[name]
    max_length = overrides.get("max_length") or max_length
    batch, steps = overrides.get("batch") or batch, overrides.get("steps") or steps
    warmup = overrides["warmup"] if overrides.get("warmup") is not None else warmup
    model_dir = work / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    config = dict(QWEN2_05B) if name == "qwen2-0.5b" else json.loads((TINY / "config.json").read_text())
    config["max_position_embeddings"] = max(config["max_position_embeddings"], max_length)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(TINY / "tokenizer.json", model_dir / "tokenizer.json")
    tokenizer_config = json.loads((TINY / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = max(tokenizer_config.get("model_max_length", 0), max_length)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    data = work / "data" / "train.jsonl"
    lengths = write_rows(data, rows, max_length, median, sigma, model_dir / "tokenizer.json")
    return Workload(name, model_dir, data, max_length, batch, warmup, steps, memory_steps, rows, config, lengths)


def chat_text(row: dict[str, Any]) -> str:
    """The tiny tokenizer's chat template, rendered (ChatML)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in row["messages"])


def write_rows(
    path: Path, rows: int, max_length: int, median: int, sigma: float, tokenizer: Path, seed: int = 0
) -> list[int]:
    """Chat rows whose token lengths are lognormal (median `median`, capped at max_length): a short user turn
    and a long assistant turn of one-token words. Returns each row's token count, at most max_length."""
    from tokenizers import Tokenizer  # the Rust tokenizer alone: no transformers import in the suite's process

    rng, encoder = random.Random(seed), Tokenizer.from_file(str(tokenizer))
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = []
    with open(path, "w") as out:
        for _ in range(rows):
            total = min(max_length - 1, max(16, int(rng.lognormvariate(math.log(median), sigma))))
            prompt = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
            answer = [rng.choice(WORDS) for _ in range(max(1, total - len(prompt) - 12))]
            row = {
                "messages": [
                    {"role": "user", "content": "repeat: " + " ".join(prompt)},
                    {"role": "assistant", "content": " ".join(answer)},
                ]
            }
            tokens = len(encoder.encode(chat_text(row)).ids)
            if tokens > total and len(answer) > tokens - total:  # one token a word: trim to fit exactly
                answer = answer[: len(answer) - (tokens - total)]
                row["messages"][1]["content"] = " ".join(answer)
                tokens = len(encoder.encode(chat_text(row)).ids)
            out.write(json.dumps(row) + "\n")
            lengths.append(min(max_length, tokens))
    return lengths


# ---------------------------------------------------------------- sftdoctor run configs


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    return repr(value)


def write_config(
    path: Path,
    load: Workload,
    output_dir: Path,
    steps: int,
    batch: int,
    training: dict[str, Any] | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """A run config over the workload on one process; sftdoctor decides everything not given here. `sections`
    adds sections ([deepspeed], [fsdp]: {} writes the bare header) or replaces one ([launch])."""
    written = {
        "model": {"path": load.model_dir, "weights": "random"},
        "data": {"train": load.data, "max_length": load.max_length},
        "training": {
            "per_device_batch_size": batch,
            "global_batch_size": batch,
            "max_steps": steps,
            "logging_steps": 1,
            "save_steps": steps * 100,
            "seed": 0,
            "output_dir": output_dir,
            **(training or {}),
        },
        "launch": {"nproc_per_node": 1, "master_port": "auto"},
        **(sections or {}),
    }
    lines = []
    for name, values in written.items():
        lines += [f"[{name}]", *(f"{key} = {toml_value(value)}" for key, value in values.items()), ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


# ---------------------------------------------------------------- what a run recorded


def read_records(metrics: Path) -> list[dict[str, Any]]:
    """The training-step records of a metrics.jsonl (it also holds the end-of-run record)."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for r in records if "loss" in r and "step" in r]


def measured(records: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    return [r for r in records if r["step"] >= warmup]


def tokens_per_second(records: list[dict[str, Any]], warmup: int) -> float | None:
    """Real tokens per second from the end of step `warmup` to the last record (both logged, so both synced)."""
    window = measured(records, warmup)
    if len(window) < 2:
        return None
    first, last = window[0], window[-1]
    seconds = last["time"] - first["time"]
    return (last["tokens_seen"] - first["tokens_seen"]) / seconds if seconds > 0 else None


def median_step_s(records: list[dict[str, Any]], warmup: int) -> float | None:
    """The median wall time of the steps after the warm-up (each record's step_time_s, logging every step)."""
    times = [r["step_time_s"] for r in records if r["step"] > warmup and r.get("step_time_s") is not None]
    return statistics.median(times) if times else None


def peak_gib(records: list[dict[str, Any]], key: str) -> float | None:
    """The run's peak: each record holds the peak since the previous one (the callback resets it)."""
    values = [r[key] for r in records if r.get(key) is not None]
    return max(values) if values else None


# ---------------------------------------------------------------- FLOPs and MFU


def attention_seq_len(lengths: list[int]) -> float:
    """The context length a token attends over, averaged over tokens: sum(n^2) / sum(n) for samples of n tokens
    (packed samples attend only within themselves; padding is no model FLOP)."""
    return sum(n * n for n in lengths) / max(1, sum(lengths))


def flops_per_token(config: dict[str, Any], parameters: int, seq_len: float) -> dict[str, float]:
    """Model FLOPs per trained token (PaLM's convention, Chowdhery et al. 2022, appendix B: 6 x matmul weights +
    12 x layers x hidden x context for attention). Two counts of the weights: `with_head` counts the LM head's
    matmul (the tied embedding is a lookup on the way in, but a vocab x hidden matmul on the way out);
    `non_embedding` leaves the embedding matrix out altogether."""
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    embedding = vocab * hidden
    non_embedding = parameters - embedding * (1 if config.get("tie_word_embeddings") else 2)
    attention = 12 * layers * hidden * seq_len
    return {
        "with_head": 6 * (non_embedding + embedding) + attention,
        "non_embedding": 6 * non_embedding + attention,
        "non_embedding_parameters": non_embedding,
    }


def mfu(tokens_s: float | None, flops: float, peak_tflops: float | None) -> float | None:
    if not tokens_s or not peak_tflops:
        return None
    return tokens_s * flops / (peak_tflops * 1e12)
