"""A non-finite step traced to its training rows: which rows (file and line) each rank's micro-batches held, and
whether those micro-batches, re-run alone in fp32 on the pre-step weights, are non-finite again ("these rows":
then each row alone, to name the ones that do it) or finite ("numerics": the run's precision, not the data).

How a batch's tokens are traced back to rows, with nothing added to a step:
- Every training row carries its number (ROW, added at load before any split: its place in the data files, as
  `datasets` numbers them) through TRL's tokenization. Unpacked, the trainer's dataset keeps that column; packed,
  TRL keeps only input_ids and labels before `pack_dataset`, whose input (in the order of the rows given to the
  trainer) is kept aside when the trainer is built (`compat.capture_pack_input`).
- A micro-batch is cut into its sequences (the attention mask's rows; packed, the restarts of position_ids) and
  each one is found among the tokenized rows by its length and then its tokens (truncated to max_length as
  TRL's packing truncates). Only at the stop: a scan of the rows' lengths, then a comparison of a few.

The watcher keeps references to the step's micro-batches (no copy, no sync); the work happens only when a
non-finite step stops the run.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from sftdoctor.facts.data import locate
from sftdoctor.facts.trainer_inputs import ROW

ROW_TIMEOUT_S = 300.0  # rank 0 waits this long for the other ranks' traces (each re-runs its micro-batches)


def keep(trainer, inputs: dict[str, Any]) -> None:
    """The training step's micro-batches, kept on the trainer by reference (no copy, no sync): the only work
    tracing adds to a step (bench/nan_rows.py: a tenth of a microsecond)."""
    if getattr(trainer, "sftdoctor_step", None) != trainer.state.global_step:
        trainer.sftdoctor_step, trainer.sftdoctor_step_inputs = trainer.state.global_step, []
    trainer.sftdoctor_step_inputs.append(inputs)


# ---------------------------------------------------------------- sequences of a micro-batch


def sequences(inputs: dict[str, Any]) -> list[tuple[int, torch.Tensor, torch.Tensor | None]]:
    """(batch row, token ids, labels) of every sequence in a collated micro-batch: a padded batch by its
    attention mask, a padding-free (packed) one by where position_ids restart at 0."""
    ids, labels = inputs["input_ids"], inputs.get("labels")
    mask, positions = inputs.get("attention_mask"), inputs.get("position_ids")
    out = []
    for b in range(ids.shape[0]):
        if mask is not None:
            real = mask[b].bool()
            out.append((b, ids[b][real], labels[b][real] if labels is not None else None))
        elif positions is not None:
            starts = (positions[b] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
            out += [
                (b, ids[b, s:e], labels[b, s:e] if labels is not None else None) for s, e in zip(starts, starts[1:])
            ]
        else:
            out.append((b, ids[b], labels[b] if labels is not None else None))
    return out


# ---------------------------------------------------------------- sequences -> rows


class RowIndex:
    """The tokenized rows: each one's token ids and its ROW number; `find` answers which rows a sequence is."""

    def __init__(self, input_ids, rows: np.ndarray, max_length: int | None):
        self.rows, self.max_length = rows, max_length
        self.chunks = []  # (offsets, values, first table row) per Arrow chunk: no copy of the token ids
        first = 0
        for chunk in input_ids.chunks:
            offsets = chunk.offsets.to_numpy()
            self.chunks.append((offsets, chunk.values.to_numpy(zero_copy_only=False), first))
            first += len(chunk)

    @classmethod
    def of(cls, trainer, raw_rows) -> RowIndex:
        """From the trainer: its packing's input (rows in the order given) or its own dataset (with ROW)."""
        if raw_rows is None:
            raise ValueError("the training rows are streamed ([data] streaming): read once, they cannot be traced back")
        max_length = trainer.args.max_length
        packed_from = getattr(trainer, "sftdoctor_packed_from", None)
        if packed_from is not None:
            return cls(packed_from.data.column("input_ids"), np.asarray(raw_rows[ROW]), max_length)
        table = trainer.train_dataset.data
        return cls(table.column("input_ids"), table.column(ROW).to_numpy(), None)

    def find(self, tokens: torch.Tensor) -> list[int]:
        """The ROW numbers of the rows whose tokens (cut at max_length) are these."""
        seq = tokens.detach().cpu().numpy()
        n, found = len(seq), []
        for offsets, values, first in self.chunks:
            lengths = np.diff(offsets)
            if self.max_length:
                lengths = np.minimum(lengths, self.max_length)
            for i in np.nonzero(lengths == n)[0]:
                if np.array_equal(values[offsets[i] : offsets[i] + n], seq):
                    found.append(int(self.rows[first + i]))
        return found


def _row_names(found: list[list[int]], files) -> list[str]:
    wanted = {r for rows in found for r in rows}
    where = locate(files, wanted)
    return [
        " = ".join(where.get(r, f"row #{r}") for r in rows) if rows else "not found (padding, or a split row)"
        for rows in found
    ]


# ---------------------------------------------------------------- re-runs in fp32


def _fp32(model):
    """The model in fp32 for the re-runs: itself when its weights are fp32, else a copy upcast where it fits;
    (model, why not) with None when no fp32 copy can be made."""
    params = list(model.parameters())
    if all(p.dtype == torch.float32 for p in params if p.is_floating_point()):
        return model, None
    if any(not p.is_floating_point() for p in params):
        return None, "quantized weights have no fp32 copy"
    need = sum(p.numel() for p in params) * 4
    device = params[0].device
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else _host_free()
    if need * 1.2 > free:
        return None, f"an fp32 copy needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return copy.deepcopy(model).float(), None


def _host_free() -> int:
    import psutil

    return psutil.virtual_memory().available


def rerun(model, inputs: dict[str, Any], backward: bool) -> dict[str, Any]:
    """One forward (and backward) alone, autocast off: is the loss, are the gradients, finite? A sequence with
    no target token is said so: its mean loss is 0/0 by definition, not a finding."""
    batch = {k: v for k, v in inputs.items() if k != "use_cache"}  # packed: cu_seq_lens_* too, as trained
    targets = _targets(batch.get("labels"))
    if targets == 0:  # not run: alone, its mean loss is 0/0 by definition (in the step, others' tokens count)
        return {"targets": 0}
    device = batch["input_ids"].device.type
    try:
        for p in model.parameters():
            p.grad = None
        with torch.autocast(device_type=device, enabled=False), torch.set_grad_enabled(backward):
            loss = model(**batch, use_cache=False).loss
        result = {"targets": targets, "loss": float(loss.detach()), "finite": bool(torch.isfinite(loss))}
        if backward and result["finite"]:
            loss.backward()
            # the norm, as the trainer clips and the watcher reads it: finite gradients can still overflow it
            norms = [torch.linalg.vector_norm(p.grad) for p in model.parameters() if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
            result["grad_norm"] = float(norm)
            result["finite"] = bool(torch.isfinite(norm))
    except Exception as exc:  # the trace must never hide the finding it explains
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    finally:
        for p in model.parameters():
            p.grad = None
    return result


def trace(
    trainer, micro_batches: list[dict[str, Any]], files, raw_rows, backward: bool, no_rerun: str | None = None
) -> dict[str, Any]:
    """This rank's account of the step: each micro-batch's rows, its fp32 re-run, and the rows that alone are
    non-finite. No re-run where `no_rerun` says why: under ZeRO-3 and FSDP a forward gathers the weights
    collectively, and the ranks would re-run unequal numbers of sequences (a rank left waiting: a hang)."""
    index = RowIndex.of(trainer, raw_rows)
    model, why_not = _fp32(trainer.model) if no_rerun is None else (None, no_rerun)
    was_training = (model or trainer.model).training
    batches = []
    try:
        for inputs in micro_batches:
            seqs = sequences(inputs)
            found = [index.find(tokens) for _, tokens, _ in seqs]
            entry = {"rows": _row_names(found, files), "targets": _targets(inputs.get("labels"))}
            if model is not None:
                model.eval()  # no dropout: the same function of the same rows
                entry["fp32"] = rerun(model, inputs, backward)
                if entry["fp32"].get("finite") is False:  # then each row alone
                    entry["alone"] = [rerun(model, _alone(tokens, labels), backward) for _, tokens, labels in seqs]
            batches.append(entry)
    finally:
        if model is not None and was_training:
            model.train()
    return {"micro_batches": batches, "fp32": why_not is None, "why_not_fp32": why_not}


def _targets(labels: torch.Tensor | None) -> int | None:
    """The tokens a batch trains on: labels other than -100 after the shift (a sequence's first is never one)."""
    return int((labels[..., 1:] != -100).sum()) if labels is not None else None


def _alone(tokens: torch.Tensor, labels: torch.Tensor | None) -> dict[str, Any]:
    batch = {"input_ids": tokens[None], "position_ids": torch.arange(len(tokens), device=tokens.device)[None]}
    return {**batch, "labels": labels[None]} if labels is not None else batch


def verdict(ranks: dict[str, dict[str, Any]], precision: str) -> dict[str, Any]:
    """Over every rank: "rows" (a micro-batch non-finite again in fp32, `culprits` the rows that are alone; or a
    step with no target token at all), "numerics" (all finite in fp32: the run's precision), "not-reproduced" (an
    fp32 run, finite again), or "unknown" (no fp32 re-run, or it failed)."""
    batches = [
        (f"rank {rank} micro-batch {i + 1}", mb)
        for rank, t in sorted(ranks.items(), key=lambda kv: int(kv[0]))
        for i, mb in enumerate(t.get("micro_batches", []))
    ]
    if batches and all(mb.get("targets") == 0 for _, mb in batches):
        # the step's loss is the sum over its target tokens over their count on every rank: 0/0
        return {
            "verdict": "rows",
            "empty": True,
            "again": [name for name, _ in batches],
            "culprits": sorted({row for _, mb in batches for row in mb["rows"]}),
        }
    again = [(name, mb) for name, mb in batches if (mb.get("fp32") or {}).get("finite") is False]
    if again:
        culprits = {
            row
            for _, mb in again
            for row, alone in zip(mb["rows"], mb.get("alone", []))
            if alone.get("finite") is False
        }
        return {"verdict": "rows", "again": [name for name, _ in again], "culprits": sorted(culprits)}
    failed = [name for name, mb in batches if mb.get("targets") != 0 and "finite" not in (mb.get("fp32") or {})]
    if failed or not all(t.get("fp32") for t in ranks.values()):
        return {
            "verdict": "unknown",
            "failed": failed,
            "why": next((t["why_not_fp32"] for t in ranks.values() if t.get("why_not_fp32")), None),
        }
    return {"verdict": "numerics" if precision in ("bf16", "fp16") else "not-reproduced"}
