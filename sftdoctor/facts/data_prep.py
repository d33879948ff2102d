"""How long rank 0 prepares the data while the other ranks wait for it: measured on a sample of the run's rows.

TRL 1.16's SFTTrainer prepares its datasets in `__init__` (`_prepare_dataset`: ChatML conversion, EOS, the chat
template and tokenization, labels, truncation, packing) inside `global_then_local_main_first()`: rank 0 runs it
first while every other rank waits in a barrier of the default process group, whose timeout is `ddp_timeout`.
sftdoctor's recipe (train/sft.py) builds the trainer before its own watchdog starts, so nothing else covers this
phase. The probe builds that very SFTTrainer (a shrunk model of the run's architecture, the run's tokenizer,
template and SFTConfig, from facts.trainer_inputs as the workers build theirs) twice in a child process, on a
sample of rows and on two rows, and extrapolates the difference to every row the run prepares.

Extrapolation is by bytes of JSON Lines (tokenizing and templating cost grows with the text, so a sample of the
first rows predicts the rest by size, not by count), by rows for other formats, and divided by the processes
datasets uses (SFTConfig.dataset_num_proc; 1 when unset, as in sftdoctor's recipe).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached, folder_files

SAMPLE_ROWS = 256  # per run: the first rows of the train files, up to SAMPLE_BYTES
SAMPLE_BYTES = 2 << 20
REPEATS = 2  # the fastest of these is kept: a timing disturbed by another process is only ever slower
TIMEOUT_S = 600
TEXT_FORMATS = (".jsonl", ".json")


@fact(
    "data_prep",
    "the time rank 0 spends preparing the data (TRL's SFTTrainer on a sample of the rows, extrapolated)",
    inputs=RUN_CONFIG,
    why_missing="needs a run config of 2+ processes whose model has a config.json and tokenizer here",
    needs=("plan",),
)
def probe_data_prep(facts, plan) -> dict[str, Any] | None:
    from sftdoctor.facts.tokenizer import tokenizer_folder

    if plan.world_size <= 1 or not facts.get("model_config"):
        return None  # one process: no rank waits for another's preparation
    folder = tokenizer_folder(plan.tokenizer_path)
    if folder is None:
        return None
    if (bound := _bound(plan)) is not None:
        return bound
    request = {"plan": plan.to_json()}
    keyed = {k: v for k, v in plan.to_json().items() if k in KEYED}
    files = (
        [Path(f) for f in (*plan.train_files, *plan.eval_files)]
        + folder_files(folder)
        + folder_files(tokenizer_folder(plan.model_path))
        + ([Path(plan.chat_template)] if plan.chat_template else [])
    )
    return cached("data-prep", keyed, files, lambda: _child(request))


# The slowest rate this preparation can plausibly run at: 1/16 of the slowest measured here (0.8 MB/s, the tiny
# example on a loaded 2-core machine, packing on). Data small enough to fit a tenth of ddp_timeout even at this rate
# is not measured: the child process (10-30 s of imports) would only confirm it.
FLOOR_BYTES_S = 50_000
UNMEASURED_SHARE = 0.1


def _bound(plan) -> dict[str, Any] | None:
    """The preparation's time at the floor rate, when it is that small; None when it must be measured (a format
    whose size does not say how much text it holds, or more data)."""
    files = [Path(name) for name in (*plan.train_files, *plan.eval_files)]
    if not files or not all(f.suffix.lower() in TEXT_FORMATS and f.is_file() for f in files):
        return None
    total = sum(f.stat().st_size for f in files)
    seconds = total / FLOOR_BYTES_S
    if seconds > UNMEASURED_SHARE * plan.ddp_timeout_s:
        return None
    return {
        "estimate_s": round(seconds, 2),
        "basis": "bound",
        "bytes_total": total,
        "floor_bytes_s": FLOOR_BYTES_S,
        "packing": plan.packing,
        "max_length": plan.max_length,
    }


# What the preparation's time depends on besides the files' content (the data, the tokenizer, the model's config and
# the template, keyed by content, wherever they are): the data's shape and format, the length and packing. Not the
# world, the batch or the schedule (a sweep's trials, a rerun on more GPUs reuse the answer).
KEYED = frozenset(
    {"eval_fraction", "data_limit", "data_shape", "data_format", "max_length", "packing", "assistant_only_loss"}
)


def _child(request: dict[str, Any]) -> dict[str, Any]:
    answer = in_child("sftdoctor.facts.data_prep", request, "the data preparation probe", TIMEOUT_S)
    return answer if "error" not in answer else {"estimate_s": None, **answer}


def sample(files: tuple[str, ...]) -> list[Any]:
    """The first rows of the train files: up to SAMPLE_ROWS rows or SAMPLE_BYTES of their JSON."""
    from sftdoctor.facts.data import rows

    picked, size = [], 0
    for name in files:
        for _, row in rows(Path(name)):
            picked.append(row)
            size += row_bytes(row)
            if len(picked) >= SAMPLE_ROWS or size >= SAMPLE_BYTES:
                return picked
    return picked


def row_bytes(row: Any) -> int:
    """A row's size as a JSON Lines file holds it (UTF-8, one line)."""
    return len(json.dumps(row, ensure_ascii=False).encode()) + 1


def extrapolate(measured: dict[str, Any], files: list[tuple[str, int, int]], data_limit: int | None) -> dict[str, Any]:
    """The time to prepare every row, from the measured sample: `files` are (name, bytes, rows) of every file the
    run prepares (train and eval); by bytes when all are JSON text, else by rows; divided by the processes."""
    per_row = measured["prep_s"] / max(1, measured["sample_rows"] - measured["baseline_rows"])
    rows = sum(n for _, _, n in files)
    share = min(1.0, data_limit / rows) if data_limit and rows else 1.0
    if all(name.lower().endswith(TEXT_FORMATS) for name, _, _ in files):
        per_byte = measured["prep_s"] / max(1, measured["sample_bytes"] - measured["baseline_bytes"])
        serial = per_byte * sum(size for _, size, _ in files) * share
        basis = "bytes"
    else:
        serial = per_row * rows * share
        basis = "rows"
    procs = max(1, measured["num_proc"] or 1)
    return {
        "estimate_s": round(measured["fixed_s"] + serial / procs, 2),
        "serial_s": round(serial, 2),
        "basis": basis,
        "rows_total": round(rows * share),
        "bytes_total": sum(size for _, size, _ in files),
        "per_1k_rows_s": round(per_row * 1000, 4),
    }


def measure(request: dict[str, Any]) -> dict[str, Any]:
    from sftdoctor.facts.data import rows as read_rows
    from sftdoctor.run import Plan

    plan = Plan.from_json(request["plan"])
    rows = sample(plan.train_files)
    measured = _time_preparation(plan, rows)
    files = []
    for name in (*plan.train_files, *plan.eval_files):
        path = Path(name)
        files.append((name, path.stat().st_size, sum(1 for _ in read_rows(path))))
    return {
        **measured,
        **extrapolate(measured, files, plan.data_limit),
        "packing": plan.packing,
        "max_length": plan.max_length,
    }


def _time_preparation(plan, rows: list[Any]) -> dict[str, Any]:
    """Seconds SFTTrainer's construction spends on `rows` beyond what it spends on two of them (the model, the
    accelerator and each map's fixed cost), the fastest of REPEATS."""
    import tempfile  # here: the catalogue imports this module for every `check`

    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl import SFTTrainer

    from sftdoctor.facts.packing_probe import shrink
    from sftdoctor.facts.targets_probe import probe_plan
    from sftdoctor.facts.trainer_inputs import as_trained, load_tokenizer, sft_config

    tokenizer = load_tokenizer(plan)
    config = AutoConfig.from_pretrained(plan.model_path, trust_remote_code=plan.trust_remote_code)
    shrink(config, vocab_size=None)
    torch.manual_seed(0)
    baseline = rows[:2]
    with tempfile.TemporaryDirectory() as folder:
        probe = probe_plan(plan, folder)
        args = sft_config(probe, has_eval=False)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=probe.attn_implementation)

        def build(some: list[Any]) -> float:
            data = as_trained(Dataset.from_list(some), plan)  # in memory: no datasets cache between the builds
            start = time.perf_counter()
            SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
            return time.perf_counter() - start

        fixed = min(build(baseline) for _ in range(REPEATS))
        full = min(build(rows) for _ in range(REPEATS))
    return {
        "sample_rows": len(rows),
        "sample_bytes": sum(map(row_bytes, rows)),
        "baseline_rows": len(baseline),
        "baseline_bytes": sum(map(row_bytes, baseline)),
        "prep_s": round(max(0.0, full - fixed), 4),
        "fixed_s": round(fixed, 3),
        "num_proc": args.dataset_num_proc,
    }


if __name__ == "__main__":
    serve(measure)
