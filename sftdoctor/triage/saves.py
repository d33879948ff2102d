"""Summaries for two failures whose finding needs more than one line's groups: a save that ran out of disk (the
file being written, announced on an earlier line) and DeepSpeed's batch assertion (which of its numbers is off)."""

from __future__ import annotations

import re

from sftdoctor.findings import Finding, Severity
from sftdoctor.triage.scan import Line
from sftdoctor.triage.summaries import Located, Summary, _evidence, clip, where

# Where the writer was saving: the Trainer (trainer.py, 4.x-5.25: "Saving model checkpoint to X") and DeepSpeed's
# checkpoint engine (torch_checkpoint_engine.py, 0.9-0.19.8: "[Torch] Saving X...") announce each file before writing
# it. Read from the lines just before the failure, not as a signature: a run announces a save at every save_steps, and
# a needle for it would cost every log the scan of those lines.
_SAVING = re.compile(r"Saving model checkpoint to (\S+)|\[Torch\] Saving (\S+?)(?:\.\.\.)?\s*$")


def saving_before(line: Line) -> str | None:
    """The file or folder announced last in the lines before `line` (the 1 KiB the scan keeps), if any."""
    for text in line.earlier(40):
        if match := _SAVING.search(text):
            return match[1] or match[2]
    return None


class DiskFull(Summary):
    """The first failed write of a save, with the path the Trainer or DeepSpeed said it was saving just before."""

    def __init__(self):
        self.sig = self.first = None
        self.groups: dict = {}
        self.count, self.ranks, self.saving = 0, set(), None

    def add(self, sig, line, groups):
        self.count += 1
        if line.rank is not None:
            self.ranks.add(line.rank)
        if self.first is None:
            self.sig, self.first, self.groups = sig, line, groups
            self.saving = saving_before(line)
        elif sig.id == "disk-full-enospc" and self.sig.id != sig.id:  # the errno is the clearer cause: name it
            self.sig, self.groups = sig, {**self.groups, **groups}

    def results(self, ctx):
        if self.first is None:
            return []
        g, path = self.groups, self.groups.get("path") or self.saving
        where_to = f" while writing {path}" if path else ""
        if g.get("error") and ("122" in g["error"] or "quota" in g["error"]):
            cause = "the disk quota is exhausted (errno 122)"
        elif g.get("error"):
            cause = "the disk is full (errno 28, no space left on device)"
        else:
            part = f" {g['file']}" if g.get("file") else ""
            cause = f"torch.save could not write{part} (a full disk or quota, most often)"
        specifics = {k: v for k, v in {**g, "saving": self.saving}.items() if v is not None}
        finding = Finding(
            Severity.ERROR,
            f"{cause}{where_to}",
            f"first at {where(self.first)}: {clip(self.first.text)}",
            self.sig.fix,
            self.sig.topic,
            _evidence(self.sig, self.first, self.count, self.ranks, specifics),
            self.sig.topic,
        )
        return [Located(self.first.number, "root", finding)]


def batch_fix(train: int, micro: int, acc: int, world: int) -> str:
    """Which of DeepSpeed's three batch keys disagrees, given the world size it saw, and the value that fits."""
    per_step = micro * world
    if world == 1 and train % (micro * acc) == 0 and train > micro * acc:
        return (
            f"DeepSpeed saw world_size 1: the processes did not form one group (launch with torchrun/deepspeed, "
            f"or DeepSpeed read the config before torch.distributed was up); with {train // (micro * acc)} ranks "
            f"the numbers agree"
        )
    if train % per_step == 0:
        return (
            f"gradient_accumulation_steps should be {train // per_step} (= {train} / ({micro} x {world})); "
            f'or set train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps to "auto"'
        )
    return (
        f"{train} is not a multiple of {micro} per GPU x {world} ranks = {per_step}: set train_batch_size to "
        f'{micro * acc * world} (or a multiple of {per_step}), or all three batch keys to "auto" under the '
        "Trainer"
    )


class DeepSpeedBatch(Summary):
    def __init__(self):
        self.sig = self.first = None
        self.groups: dict = {}
        self.count = 0

    def add(self, sig, line, groups):
        self.count += 1
        if self.first is None:
            self.sig, self.first, self.groups = sig, line, groups

    def results(self, ctx):
        if self.first is None:
            return []
        g = self.groups
        train, micro, acc, world = (int(g[k]) for k in ("train", "micro", "acc", "world"))
        title = (
            f"DeepSpeed's batch check: train_batch_size {train} != {micro} per GPU x {acc} accumulation x "
            f"world size {world} = {micro * acc * world}"
        )
        numbers = {
            "train_batch_size": train,
            "micro_batch_per_gpu": micro,
            "gradient_accumulation_steps": acc,
            "world_size": world,
        }
        finding = Finding(
            Severity.ERROR,
            title,
            f"first at {where(self.first)}: {clip(self.first.text)}",
            batch_fix(train, micro, acc, world),
            self.sig.topic,
            _evidence(self.sig, self.first, self.count, set(), numbers),
            self.sig.topic,
        )
        return [Located(self.first.number, "root", finding)]
