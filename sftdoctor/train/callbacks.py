"""Trainer callbacks of the recipe: rank-0 progress line, metrics log, complete checkpoints,
and counting real (non-padding) tokens without a device sync per step."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from sftdoctor.run.checkpoints import mark_complete
from sftdoctor.train.compat import loss_scale


class TokenCounter:
    """Real (non-padding) and total token slots of the training micro-batches, counted where the trainer
    consumes them. The real count stays a device tensor: it is read only at logging steps, so counting
    adds no device-to-host sync per step (transformers' include_num_input_tokens_seen syncs on every
    micro-step). Counting in the collator instead would be off by one batch: accelerate prefetches."""

    def __init__(self):
        self.real: Any = 0
        self.slots = 0

    def add(self, inputs: dict[str, Any]) -> None:
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        # Padding-free batches (packing) carry no mask and no padding (TRL pads them only on Neuron).
        self.real = self.real + (mask.sum() if mask is not None else ids.numel())
        self.slots += ids.numel()

    def read(self) -> tuple[float, int]:
        return float(self.real), self.slots


GIB = 1 << 30


def host_rss() -> float:
    """This process's resident memory now, in bytes (Linux /proc; elsewhere the peak, from getrusage)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_memory() -> tuple[float, float]:
    """Peak allocated and reserved CUDA memory since the last reading (bytes); the peaks are reset after."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0.0, 0.0
    peaks = float(torch.cuda.max_memory_allocated()), float(torch.cuda.max_memory_reserved())
    torch.cuda.reset_peak_memory_stats()
    return peaks


def gather(values: list[float]) -> list[list[float]]:
    """Every rank's values (one small all_gather); [values] without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return [values]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    rows = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [row.tolist() for row in rows]


def _seconds(value: float) -> float | None:
    """A rank's gathered seconds per step; None where it measured nothing (NaN), as JSON keeps it."""
    return round(value, 5) if math.isfinite(value) else None


def _peak(rows: list[list[float]], column: int) -> tuple[float, int]:
    rank = max(range(len(rows)), key=lambda r: rows[r][column])
    return round(rows[rank][column] / GIB, 4), rank


class Metrics(TrainerCallback):
    """What each logging step's record carries for the curves: the trainer's loss, learning rate and gradient
    norm (before clipping), and here the clipping threshold, the fp16 loss scale, tokens/s over all ranks,
    the padding fraction, the step's wall time, and memory (CUDA peak allocated and reserved, host RSS; the
    maximum over ranks and which rank). `enrich` runs in the trainer's log(), before any callback: wandb and
    tensorboard get the same values. Rank 0 appends the record to metrics.jsonl."""

    def __init__(self, counter: TokenCounter, path: Path, trainer, clock=None):
        self.counter, self.path, self.trainer, self.clock = counter, path, trainer, clock
        self.last_tokens, self.last_time, self.last_step = 0.0, None, 0
        self.rank_times: dict[str, Any] | None = None  # the last interval's per-rank times (train.stragglers)

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_time, self.last_step = time.perf_counter(), state.global_step

    def enrich(self, logs: dict[str, Any], state) -> None:
        if "loss" not in logs or self.last_time is None:
            return
        real, slots = self.counter.read()
        data_s, forward_s, measured = self.clock.read() if self.clock is not None else (math.nan, math.nan, 0)
        # one small collective per logging interval: tokens, memory, and each rank's own times (train.stragglers)
        rows = gather([real, *device_memory(), float(host_rss()), data_s, forward_s])
        tokens, now = sum(row[0] for row in rows), time.perf_counter()
        steps = max(1, state.global_step - self.last_step)
        logs["tokens_per_second"] = round((tokens - self.last_tokens) / max(now - self.last_time, 1e-9), 1)
        logs["tokens_seen"] = int(tokens)
        logs["padding_fraction"] = round(1 - real / max(slots, 1), 4)
        logs["step_time_s"] = round((now - self.last_time) / steps, 4)
        logs["max_grad_norm"] = self.trainer.args.max_grad_norm
        if self.trainer.args.fp16:
            scale = loss_scale(self.trainer)
            if scale is not None:
                logs["loss_scale"] = scale
        if any(row[1] for row in rows):
            logs["memory_allocated_gib"], logs["memory_rank"] = _peak(rows, 1)
            logs["memory_reserved_gib"], _ = _peak(rows, 2)
        logs["host_rss_gib"], logs["host_rss_rank"] = _peak(rows, 3)
        self.rank_times = {
            "step": state.global_step,
            "steps": measured,
            "step_time_s": logs["step_time_s"],
            "data_s": [_seconds(row[4]) for row in rows],
            "forward_s": [_seconds(row[5]) for row in rows],
        }
        self.last_tokens, self.last_time, self.last_step = tokens, now, state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and state.is_world_process_zero:
            # each rank's own seconds per step, in metrics.jsonl alone (a list per record is no curve for wandb)
            times = self.rank_times if "loss" in logs and self.rank_times else None  # the training log's own
            times = times if times and times["step"] == state.global_step and times["steps"] else None
            ranks = {"rank_data_s": times["data_s"], "rank_forward_s": times["forward_s"]} if times else {}
            with open(self.path, "a", encoding="utf-8") as handle:
                # max_steps: the Trainer's own count, which the schedule is built over (packing changes the plan's)
                handle.write(
                    json.dumps(
                        {"step": state.global_step, "time": time.time(), "max_steps": state.max_steps, **logs, **ranks}
                    )
                    + "\n"
                )


class MetricsInLogs:
    """Trainer mixin: the trainer's `sftdoctor_metrics` enriches every log before the callbacks see it."""

    def log(self, logs, start_time=None):
        metrics = getattr(self, "sftdoctor_metrics", None)
        if metrics is not None:
            metrics.enrich(logs, self.state)
        super().log(logs, start_time)


class StepLines(TrainerCallback):
    """One concise line per logging step on rank 0, instead of transformers' raw log dict."""

    training_bar = None

    def write(self, line: str) -> None:
        if self.training_bar is not None:
            self.training_bar.write(line)
        else:
            print(line, flush=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or logs is None:
            return
        if "loss" in logs:
            parts = [f"step {state.global_step}/{state.max_steps}", f"loss {logs['loss']:.4f}"]
            if logs.get("grad_norm") is not None:
                parts.append(f"grad_norm {logs['grad_norm']:.3f}")
            parts.append(f"lr {logs.get('learning_rate', 0):.3g}")
            if "tokens_per_second" in logs:
                parts.append(f"tok/s {logs['tokens_per_second']:.0f}")
            self.write("  ".join(parts))
        elif "eval_loss" in logs:
            self.write(f"step {state.global_step}/{state.max_steps}  eval_loss {logs['eval_loss']:.4f}")


class ProgressBar(StepLines, ProgressCallback):
    """On a terminal: transformers' progress bar (steps, elapsed and ETA), the last loss and tokens/s at its end,
    with the concise lines written above it."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        StepLines.on_log(self, args, state, control, logs=logs, **kwargs)
        if self.training_bar is not None and logs and "loss" in logs:
            speed = f", {logs['tokens_per_second']:,.0f} tok/s" if "tokens_per_second" in logs else ""
            self.training_bar.set_postfix_str(f"loss {logs['loss']:.4f}{speed}")


def progress() -> TrainerCallback:
    """The bar only on a terminal; a log file gets the lines alone."""
    return ProgressBar() if sys.stderr.isatty() else StepLines()


class CompleteCheckpoints(TrainerCallback):
    """After every rank has saved checkpoint-N, rank 0 marks it complete."""

    def on_save(self, args, state, control, **kwargs):
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if path.is_dir():
                mark_complete(path, state.global_step)


class StopAfter(TrainerCallback):
    """Stop right after step N's checkpoint (the smoke test's save/resume rehearsal)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_save = True
            control.should_training_stop = True
