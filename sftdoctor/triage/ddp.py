"""Summaries of torch's DDP reducer errors (torch/csrc/distributed/c10d/reducer.cpp, torch 1.9-2.13): which
parameters got no gradient, or one twice, on which rank, and what those parameters are (LoRA adapters, a
vision tower, MoE experts), so that the fix names them.

    "Expected to have finished reduction in the prior iteration before starting a new one. ..." then
    "Parameters which did not receive grad for rank N: a.weight, b.bias" (TORCH_DISTRIBUTED_DEBUG=INFO/DETAIL)
    and "Parameter indices which did not receive grad for rank N: 36 37"; with find_unused_parameters on, the
    message says "Since `find_unused_parameters=True` is enabled"; with static_graph, "your training graph has
    changed in this iteration".
    "Expected to mark a variable ready only once. ..." then "Parameter at index N [with name X] has been
    marked as ready twice."

Registered in triage/registry.py."""

from __future__ import annotations

import re

from sftdoctor.findings import Finding, Severity
from sftdoctor.run.unused_params import kind, kinds
from sftdoctor.triage.signatures import signatures
from sftdoctor.triage.summaries import Located, Summary, _evidence, clip, ranks_text, where

MAX_NAMES = 64
SHOWN = 3
NAME = re.compile(r"[A-Za-z_][\w.]*\w")


class DdpUnused(Summary):
    """One finding for the reducer's "Expected to have finished reduction" and the parameter lists after it."""

    def __init__(self):
        self.sig = self.first = None
        self.count, self.ranks, self.mode = 0, set(), "off"
        self.rank, self.indices, self.names = None, [], []
        self.arg = None  # ddp_find_unused_parameters as the log's command line or TrainingArguments dump set it

    def add(self, sig, line, groups):
        if sig.id == "ddp-find-unused-on":
            self.mode = "on"
        elif sig.id == "ddp-static-graph-changed":
            self.mode = "static_graph"
            if self.sig is None:  # its backward form (no header before it) is a message of its own
                self._header(sig, line)
        elif sig.id == "ddp-find-unused-arg":
            self.arg = self.arg or groups["value"]
        elif sig.id == "ddp-unreduced-params":
            self._params(line, groups)
        else:
            self._header(sig, line)

    def _header(self, sig, line):
        self.count += 1
        self.ranks.add(line.rank)
        if self.sig is None:
            self.sig, self.first = sig, self.first or line

    def _params(self, line, groups):
        rank = int(groups["rank"])
        if self.rank is None:
            self.rank = rank
        if rank != self.rank:
            return  # the first rank's list: the others repeat it or differ only by routing
        listed = groups.get("list") or ""
        if groups.get("what") == "Parameter indices" or re.fullmatch(r"[\d\s,]*", listed):
            self.indices = self.indices or [int(i) for i in re.findall(r"\d+", listed)][:MAX_NAMES]
        else:
            self.names = self.names or NAME.findall(listed)[:MAX_NAMES]
        if self.first is None:
            self.first = line

    def results(self, ctx):

        if self.first is None:
            return []
        sig = self.sig or _signature("ddp-unfinished-reduction")
        printed = sorted(r for r in self.ranks if r is not None)
        rank = self.rank if self.rank is not None else next(iter(printed), None)
        found = kinds(self.names)
        seen = self._seen(found)
        on = f" on rank {rank}" if rank is not None else ""
        if self.mode == "on":
            title = (
                f"DDP: a step's outputs did not all reach the loss{on}, although find_unused_parameters=True: {seen}"
            )
        elif self.mode == "static_graph":
            title = f"DDP static_graph=True, but the parameters a step uses changed between steps{on}" + (
                f": {seen}" if self.names or self.indices else ""
            )
        else:
            title = (
                f"DDP waited for gradients that never came{on}: {seen}; find_unused_parameters was off{_arg(self.arg)}"
            )
        ranks = {r for r in self.ranks if r is not None}
        often = f"; {self.count} times on {ranks_text(ranks)}" if len(ranks) > 1 else ""
        detail = f"first at {where(self.first)}{often}: {clip(self.first.text)}"
        evidence = _evidence(
            sig,
            self.first,
            max(self.count, 1),
            ranks,
            {
                "rank": rank,
                "indices": self.indices or None,
                "names": self.names or None,
                "kinds": found or None,
                "find_unused_parameters": self.mode,
                "ddp_find_unused_parameters_arg": self.arg,
            },
        )
        finding = Finding(Severity.ERROR, title, detail, _fix(self.mode, found), sig.topic, evidence, sig.topic)
        return [Located(self.first.number, "root", finding)]

    def _seen(self, found: list[str]) -> str:
        if self.names:
            listed = ", ".join(self.names[:SHOWN]) + (", …" if len(self.names) > SHOWN else "")
            return f"{len(self.names)} parameters got no gradient ({', '.join(found)}: {listed})"
        if self.indices:
            listed = ", ".join(map(str, self.indices[:8])) + (", …" if len(self.indices) > 8 else "")
            return f"{len(self.indices)} parameters got no gradient (indices {listed})"
        return "parameters got no gradient in the step before"


def _arg(value: str | None) -> str:
    if value is None:
        return ""
    if value.lower() == "none":
        return (
            " (ddp_find_unused_parameters=None in the log: transformers then passes False whenever gradient "
            "checkpointing is on)"
        )
    return f" (the log sets ddp_find_unused_parameters {value})"


FIXES = {
    "vision tower": "a text-only batch never reaches the vision tower: freeze it (requires_grad_(False) on its "
    "parameters; LLaMA-Factory freeze_vision_tower: true, ms-swift freeze_vit) or set "
    "ddp_find_unused_parameters=True",
    "audio tower": "a text-only batch never reaches the audio tower: freeze it, or set ddp_find_unused_parameters=True",
    "MoE experts": "experts no token was routed to in that step: set ddp_find_unused_parameters=True",
    "multi-token prediction layers": "the loss never uses the multi-token prediction layers: freeze them, or set "
    "ddp_find_unused_parameters=True",
    "LoRA adapters": "adapters on modules the forward skips: drop those modules from target_modules (exclude the "
    "vision tower, unused heads), or set ddp_find_unused_parameters=True",
    "modules_to_save copies": "a modules_to_save copy of a module the forward skips (or that a tied weight bypasses): "
    "remove it from modules_to_save, or set ddp_find_unused_parameters=True",
}
UNNAMED = (
    "set ddp_find_unused_parameters=True (TrainingArguments/SFTConfig; transformers turns it off whenever "
    "gradient checkpointing is on, and TRL's SFTConfig turns checkpointing on), or find_unused_parameters=True "
    "in DistributedDataParallel / accelerate's DistributedDataParallelKwargs; rerun with "
    "TORCH_DISTRIBUTED_DEBUG=DETAIL to print the parameters' names"
)


def _fix(mode: str, found: list[str]) -> str:
    if mode == "on":
        return (
            "make every output of forward() reach the loss (or return only what the loss uses), and use "
            "parameters only inside forward(); `sftdoctor explain ddp-unused-parameters`"
        )
    if mode == "static_graph":
        return "set static_graph=False (ddp_static_graph) and ddp_find_unused_parameters=True"
    base = next((label for label in FIXES for k in found if k.startswith(label) or k.endswith(label)), None)
    return (FIXES[base] if base else UNNAMED) + "; `sftdoctor explain ddp-unused-parameters`"


class DdpReadyTwice(Summary):
    """One finding for the reducer's "Expected to mark a variable ready only once": the parameter, its rank."""

    def __init__(self):
        self.sig = self.first = None
        self.count, self.ranks, self.param = 0, set(), {}

    def add(self, sig, line, groups):
        if sig.id == "ddp-ready-twice-param":
            if not self.param:
                self.param = {"index": int(groups["index"]), "name": groups.get("name"), "rank": line.rank}
            if self.first is not None:
                return
        else:
            self.count += 1
            self.ranks.add(line.rank)
        if self.first is None:
            self.sig, self.first = sig, line

    def results(self, ctx):

        if self.first is None:
            return []
        sig = self.sig if self.sig.role == "root" else _signature("ddp-ready-twice")
        index, name = self.param.get("index"), self.param.get("name")
        rank = self.param.get("rank") if self.param else self.first.rank
        what = kind(name) if name else None
        named = (f" ({name}, {what})" if what != "other" else f" ({name})") if name else ""
        param = f"parameter {index}{named}" if index is not None else "a parameter"
        title = (
            f"DDP marked {param} ready twice in one step"
            + (f" on rank {rank}" if rank is not None else "")
            + ": reentrant activation checkpointing under DDP, or a parameter used outside forward()"
        )
        ranks = {r for r in self.ranks if r is not None}
        evidence = _evidence(
            sig, self.first, max(self.count, 1), ranks, {"index": index, "name": name, "kind": what, "rank": rank}
        )
        finding = Finding(
            Severity.ERROR,
            title,
            f"first at {where(self.first)}: {clip(self.first.text)}",
            sig.fix,
            sig.topic,
            evidence,
            sig.topic,
        )
        return [Located(self.first.number, "root", finding)]


def _signature(sig_id: str):

    return next(s for s in signatures() if s.id == sig_id)
