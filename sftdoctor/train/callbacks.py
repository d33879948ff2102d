"""Trainer callbacks of the recipe: rank-0 progress line, metrics log, complete checkpoints,
and counting real (non-padding) tokens without a device sync per step."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from sftdoctor.train.checkpoints import mark_complete


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


def _world_sum(value: float) -> float:
    if dist.is_available() and dist.is_initialized():
        backend = dist.get_backend()
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return float(tensor.item())
    return value


class Metrics(TrainerCallback):
    """On each logging step (not each step): tokens/s over all ranks, a JSONL record on rank 0."""

    def __init__(self, counter: TokenCounter, path: Path):
        self.counter, self.path = counter, path
        self.last_tokens, self.last_time = 0.0, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_time = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        if "loss" in logs:
            real, slots = self.counter.read()
            tokens = _world_sum(real)  # one small collective per logging interval
            now = time.perf_counter()
            logs["tokens_per_second"] = round((tokens - self.last_tokens) / max(now - self.last_time, 1e-9), 1)
            logs["tokens_seen"] = int(tokens)
            logs["padding_fraction"] = round(1 - real / max(slots, 1), 4)
            self.last_tokens, self.last_time = tokens, now
        if state.is_world_process_zero:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": state.global_step, "time": time.time(), **logs}) + "\n")


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
