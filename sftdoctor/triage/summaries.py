"""Turn a signature's matches into findings with the specifics a reader needs.

Every summary holds a bounded amount of state (first match, counts, one entry per rank), so a
log of any length is summarised in constant memory.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from sftdoctor.findings import Finding, Severity
from sftdoctor.run.gpus import version_tuple
from sftdoctor.triage import trainer_lines
from sftdoctor.triage.scan import Line
from sftdoctor.triage.signatures import Signature

MAX_TEXT = 400
MAX_RANKS = 4096


@dataclass
class Located:
    """A finding, where in the log it first showed, and whether it is a cause or a symptom."""

    line: int
    role: str
    finding: Finding


@dataclass
class Context:
    """What the whole log says, for summaries that need more than their own lines."""

    ranks_seen: set[int] = field(default_factory=set)
    first_failure: dict[str, Any] = field(default_factory=dict)


def ranks_text(ranks) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'."""
    ranks = sorted(ranks)
    if not ranks:
        return ""
    runs, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None]):
        if cur != prev + 1 if cur is not None else True:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs)


def fill(template: str, groups: dict[str, Any]) -> str:
    return template.format_map(defaultdict(lambda: "?", {k: v for k, v in groups.items() if v is not None}))


def where(line: Line) -> str:
    return f"line {line.number}" + (f", rank {line.rank}" if line.rank is not None else "")


def before(sig: Signature, line: Line) -> tuple[int, tuple[bytes, ...]]:
    """The lines of `sig`'s needle that the scan skipped before `line`: how many, and the last few."""
    needles = [sig.needle] if isinstance(sig.needle, str) else sig.needle
    return next((line.before[n.encode()] for n in needles if n.encode() in line.before), (0, ()))


def clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


class Summary:
    def add(self, sig: Signature, line: Line, groups: dict[str, Any]) -> None:
        raise NotImplementedError

    def results(self, ctx: Context) -> list[Located]:
        raise NotImplementedError


class Generic(Summary):
    """One finding per signature: the first match's specifics, how often and on which ranks."""

    def __init__(self, sig: Signature):
        self.sig, self.first, self.groups, self.count, self.ranks = sig, None, {}, 0, set()

    def add(self, sig, line, groups):
        self.count += 1
        if line.rank is not None and len(self.ranks) < MAX_RANKS:
            self.ranks.add(line.rank)
        if self.first is None:
            self.first, self.groups = line, groups

    def results(self, ctx):
        if self.first is None or self.sig.role not in ("root", "symptom"):
            return []
        sig, first = self.sig, self.first
        title = fill(sig.title, self.groups) if sig.title else first.text
        seen = f"; {self.count} times" if self.count > 1 else ""
        on = f" on {ranks_text(self.ranks)}" if len(self.ranks) > 1 else ""
        finding = _sig_finding(
            Severity(sig.severity),
            sig,
            title,
            f"first at {where(first)}{seen}{on}: {clip(first.text)}",
            sig.fix,
            _evidence(sig, first, self.count, self.ranks, self.groups),
        )
        return [Located(first.number, sig.role, finding)]


def _sig_finding(severity: Severity, sig: Signature, title: str, detail: str, fix, evidence: dict) -> Finding:
    """The finding of a matched signature: its kb topic is both what to explain and the finding's id."""
    return Finding(severity, title, detail, fix, sig.topic, evidence, sig.topic)


def _evidence(sig: Signature, first: Line, count: int, ranks, specifics: dict[str, Any]) -> dict[str, Any]:
    return {
        "signature": sig.id,
        "line": first.number,
        "rank": first.rank,
        "count": count,
        "ranks": sorted(ranks),
        "text": clip(first.text),
        **{k: v for k, v in specifics.items() if v is not None},
    }


class NcclWatchdog(Summary):
    """NCCL watchdog timeouts: which collective, on which ranks, and who is at another sequence number."""

    def __init__(self):
        self.by_rank: dict[int | None, dict[str, Any]] = {}
        self.work: dict[int | None, dict[str, Any]] = {}  # "... at work: N, last completed NCCL work: M"
        self.first: Line | None = None
        self.sig: Signature | None = None
        self.count = 0
        self.prep: dict[str, Any] | None = None  # the data preparation's bar last seen before the first timeout

    def add(self, sig, line, groups):
        if sig.id == "data-prep-progress":
            if (self.first is None or line.number <= self.first.number) and (bar := data_bar(line)):
                self.prep = bar
            return
        if sig.id == "nccl-watchdog-timeout-wrapped" and whole_watchdog(line):
            return  # a line that holds the message whole: the plain signature took it
        if groups.get("work") is not None:
            if len(self.work) < MAX_RANKS:
                self.work.setdefault(line.rank, groups)
            return
        self.count += 1
        if self.first is None:
            self.first, self.sig = line, sig
        rank = _int(groups["rank"]) if groups.get("rank") is not None else line.rank  # "[3] is setting up NCCL ..."
        if rank not in self.by_rank and len(self.by_rank) < MAX_RANKS:
            self.by_rank[rank] = {
                "op": groups.get("op") or STORE_WAITS.get(sig.id),
                "seq": _int(groups.get("seq")),
                "timeout_ms": _int(groups.get("timeout_ms")),
            }

    def results(self, ctx):
        if self.first is None:
            return []
        entries = dict(self.by_rank)
        for rank, work in self.work.items():  # ranks whose only line is the work summary
            entries.setdefault(rank, {"op": None, "seq": _int(work["work"]), "timeout_ms": None})
        seq = _majority(e["seq"] for e in entries.values())
        # the op of the ranks at that SeqNum: on a tie (rank 0 in a reduce-scatter, rank 1 in an all-gather) op and
        # SeqNum taken apart could name a collective no rank is in
        op = _majority(e["op"] for e in entries.values() if e["seq"] == seq) or _majority(
            e["op"] for e in entries.values()
        )
        timeout = _majority(e["timeout_ms"] for e in entries.values())
        timed_out = {r for r in entries if r is not None}
        title = "NCCL collective timed out: " + (op or "a collective") + (f" SeqNum={seq}" if seq is not None else "")
        if timeout:
            title += f" after {timeout / 1000:g} s"
        if timed_out:
            title += f" on {ranks_text(timed_out)}"
        notes = []
        odd = {
            r: e
            for r, e in entries.items()
            if r is not None and e["op"] not in STORE_WAITS.values() and _differs(e, op, seq)
        }
        if odd:
            where_odd = ", ".join(f"rank {r} at {e['op'] or '?'} SeqNum={e['seq']}" for r, e in sorted(odd.items()))
            notes.append(
                f"desync: {where_odd} while the others are at {op} SeqNum={seq}; the ranks are not in the same "
                "collective (a rank-dependent branch, or a rank that skipped or repeated a step)"
            )
        silent = sorted(ctx.ranks_seen - timed_out) if timed_out else []
        if silent:
            notes.append(
                f"{ranks_text(silent)} reported no timeout: the collective waits for "
                f"{'it' if len(silent) == 1 else 'them'} (stuck elsewhere, or dead: read its lines and stack first)"
            )
        if work := next(iter(self.work.values()), None):
            notes.append(f"last completed NCCL work {work['last_completed']}, last enqueued {work['last_enqueued']}")
        failed = ctx.first_failure
        if failed.get("exitcode") is not None:
            notes.append(f"the launcher saw {_who_failed(failed)} fail first (exitcode {failed['exitcode']})")
        detail = "; ".join(notes + [f"first at {where(self.first)}: {clip(self.first.text)}"])
        specifics = {
            "op": op,
            "seq": seq,
            "timeout_ms": timeout,
            "seq_by_rank": {str(r): e["seq"] for r, e in entries.items() if r is not None},
            "desync": sorted(odd) or None,
            "silent_ranks": silent or None,
        }
        fix, explain = self.sig.fix, self.sig.topic
        if waited := rank0_busy(self.prep, entries, seq, timeout, timed_out):
            title, fix, explain, extra = waited
            specifics.update(extra)
        evidence = _evidence(self.sig, self.first, self.count, timed_out, specifics)
        finding = Finding(Severity.ERROR, title, detail, fix, explain, evidence, self.sig.topic)
        return [Located(self.first.number, self.sig.role, finding)]


def _who_failed(failed: dict[str, Any]) -> str:
    """The rank (or local rank) torchrun's failure block names, in words."""
    return next(
        (
            f"{label} {failed[key]}"
            for key, label in (("rank", "rank"), ("local_rank", "local rank"))
            if failed.get(key) is not None
        ),
        "a rank",
    )


def _majority(values):
    """The most common value; on a tie the highest (for sequence numbers: the ranks that are ahead and waiting)."""
    counts = Counter(v for v in values if v is not None)
    return max(counts, key=lambda v: (counts[v], str(v).isdecimal() and int(v), str(v))) if counts else None


def _differs(entry: dict[str, Any], op, seq) -> bool:
    """Another collective than the majority's: a different sequence number, or a different op."""
    return any(
        entry[key] is not None and common is not None and entry[key] != common
        for key, common in (("seq", seq), ("op", op))
    )


def _int(value):
    return int(value) if value is not None and str(value).lstrip("-").isdecimal() else value


_SIZE = r"(\d+(?:\.\d+)? (?:bytes|[KMGT]iB|B))"
_OOM_FIELDS = {
    "tried": re.compile(rf"Tried to allocate {_SIZE}"),
    "gpu": re.compile(r"\(GPU (\d+);|GPU (\d+) has a total capacity"),  # some builds print "GPU  has"
    "total": re.compile(rf"{_SIZE} total capacity|total capacity of {_SIZE}"),
    "free": re.compile(rf"{_SIZE} free;|of which {_SIZE} is free"),
    "allocated": re.compile(rf"{_SIZE} already allocated|Of the allocated memory {_SIZE} is allocated by PyTorch"),
    "reserved": re.compile(rf"{_SIZE} reserved in total by PyTorch"),
    "unallocated": re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated"),
}
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def size_bytes(text: str | None) -> float | None:
    if not text:
        return None
    number, unit = text.split()
    return float(number) * _UNITS[unit]


def oom_fields(text: str) -> dict[str, Any]:
    out = {}
    for name, pattern in _OOM_FIELDS.items():
        if match := pattern.search(text):
            value = next(g for g in match.groups() if g is not None)
            out[name] = int(value) if name == "gpu" else value
    return out


class CudaOom(Summary):
    """CUDA OOMs: the size asked, the memory left, per rank; fragmentation when reserved >> allocated."""

    def __init__(self):
        self.first = self.sig = None
        self.fields: dict[str, Any] = {}
        self.count, self.ranks = 0, set()

    def add(self, sig, line, groups):
        self.count += 1
        if line.rank is not None and len(self.ranks) < MAX_RANKS:
            self.ranks.add(line.rank)
        fields = oom_fields(line.text)
        if self.first is None or (len(fields) > len(self.fields) and self.sig.id == sig.id):
            # keep the first OOM, but prefer its fullest copy (tracebacks repeat the message in pieces)
            if self.first is None:
                self.first, self.sig = line, sig
            self.fields = fields

    def results(self, ctx):
        if self.first is None:
            return []
        f = self.fields
        title = "CUDA out of memory"
        if self.first.rank is not None:
            title += f" on rank {self.first.rank}"
        if "tried" in f:
            title += f": asked {f['tried']}"
            if "free" in f:
                title += f", {f['free']} free"
            if "total" in f:
                title += f" of {f['total']}"
            if "gpu" in f:
                title += f" (GPU {f['gpu']})"
        notes = []
        unallocated = size_bytes(f.get("unallocated"))
        if unallocated is None and f.get("reserved") and f.get("allocated"):
            unallocated = size_bytes(f["reserved"]) - size_bytes(f["allocated"])
        if unallocated is not None and unallocated >= max(2**30, (size_bytes(f.get("tried")) or 0)):
            notes.append(
                f"{unallocated / 2**30:.2f} GiB is reserved by PyTorch but unallocated: fragmentation; "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may be enough"
            )
        if len(self.ranks) > 1:
            notes.append(f"seen on {ranks_text(self.ranks)}")
        detail = "; ".join(notes + [f"first at {where(self.first)}: {clip(self.first.text)}"])
        finding = _sig_finding(
            Severity.ERROR,
            self.sig,
            title,
            detail,
            self.sig.fix,
            _evidence(self.sig, self.first, self.count, self.ranks, f),
        )
        return [Located(self.first.number, "root", finding)]


_FIELD = re.compile(r"""['"](\w+)['"]:\s*['"]?([^,'"}\s]+)""")


def log_fields(text: str) -> dict[str, str]:
    return dict(_FIELD.findall(text))


class LossLog(Summary):
    """Logged losses and gradient norms, in any trainer's format (trainer_lines.py): where they first went
    non-finite, and the trend of the finite entries just before. Megatron's quiet forms too: a loss field
    that vanishes from the iteration lines, its NaN-iterations counter, and skipped iterations that go on."""

    RECENT = 5
    SKIPPING = 3  # logged intervals in a row with skipped iterations, after one without, that make a warning

    def __init__(self):
        self.first_bad: tuple[Line, dict[str, str], list[dict[str, str]], int] | None = None
        self.finite = 0  # lines seen here that held a nan/inf elsewhere (a learning rate) but a finite loss
        self.bad = 0
        self.sig = None
        self.last_line = 0  # a line two signatures match is one entry
        self.recent: deque[dict[str, str]] = deque(maxlen=self.RECENT)  # finite entries seen here (a Megatron
        # line holds "nan iterations", so every one is seen here and no tally keeps them)
        self.megatron_losses: list[str] = []  # the loss fields Megatron's lines have shown
        self.advanced = False  # a Megatron interval without skipped iterations was seen
        self.skipping: list = []  # [first Line, intervals, iterations skipped, sig] of the current run
        self.consumed = 0  # the last line of the Megatron entry read last (a wrapped one spans several)
        self.settings = RunSettings()  # what the log says of the precision and DeepSpeed, for the fix

    def add(self, sig, line, groups):
        if sig.id in RUN_SETTINGS:
            self.settings.add(sig.id, line, groups)
            return
        if line.number == self.last_line or line.number <= self.consumed:
            return  # a line two signatures match is one entry; so is a wrapped Megatron line
        self.last_line = line.number
        values = _entry(sig, line, groups)
        if trainer_lines.megatron(line.text) is not None:
            values.update(self._megatron(sig, line))
        if "loss" not in values and "grad_norm" not in values:
            return
        if not _non_finite(values):
            self.finite += 1
            self.recent.append(values)
            return
        self.bad += 1
        if self.first_bad is None:
            skipped, recent = before(sig, line)
            trend = [_entry_fields(raw.decode("utf-8", "replace")) for raw in recent] or list(self.recent)
            self.first_bad, self.sig = (line, values, trend, skipped + self.finite + 1), sig

    def _megatron(self, sig, line: Line) -> dict[str, str]:
        """What a Megatron iteration line says beyond its values: a NaN the line hides. A line a paste wrapped
        is read whole: the counters are at its end."""
        lines = trainer_lines.entry(line.text, line.after(WRAPPED))
        fields = trainer_lines.megatron_entry(lines)
        self.consumed = line.number + len(lines) - 1  # (blank lines between would make it more: they are rare)
        losses = trainer_lines.megatron_losses(fields)
        skipped = trainer_lines.count(fields, "number of skipped iterations")
        nans = trainer_lines.count(fields, "number of nan iterations")
        self._skipped(sig, line, skipped)
        at = {"step": fields["iteration"], "step_label": "iteration"}
        for kind, key in (("loss", next(iter(losses), None)), ("grad_norm", "grad norm")):
            if key in fields:
                at.update({kind: (fields[key].split() or [""])[0], f"{kind}_key": key})
        if nans:
            return {
                **at,
                "loss": "nan",
                "loss_key": (losses or self.megatron_losses or ["the loss"])[0],
                "note": f"Megatron counted {nans} iteration{'s' if nans > 1 else ''} with a non-finite loss in "
                "this logging interval (number of nan iterations)",
            }
        if losses:
            self.megatron_losses = losses
            return at
        if skipped == 0:  # iterations advanced, yet no average to print: it was NaN (`if avg > 0.0` is false)
            key = self.megatron_losses[0] if self.megatron_losses else "the loss"
            return {
                **at,
                "loss": "nan",
                "loss_key": key,
                "note": f"{key} vanished from the iteration line with 0 "
                "skipped iterations: Megatron prints a loss only when its average is > 0, so it was NaN",
            }
        if skipped is None and self.megatron_losses:  # a fork that prints no counters: the field it printed is gone
            key = self.megatron_losses[0]
            return {
                **at,
                "loss": "nan",
                "loss_key": key,
                "note": f"{key}, printed on the iteration lines before, "
                "vanished from this one: Megatron prints a loss only when its average is > 0, so it was NaN (the "
                "line has no skipped-iterations counter to tell an fp16 skip apart)",
            }
        return at

    def _skipped(self, sig, line: Line, skipped: int | None) -> None:
        if not skipped:
            self.advanced, self.skipping = self.advanced or skipped == 0, []
        elif self.advanced:  # skips at the very start are fp16's loss scale settling
            if not self.skipping:
                self.skipping = [line, 0, 0, sig]
            self.skipping[1] += 1
            self.skipping[2] += skipped

    def results(self, ctx):
        if self.first_bad is None:
            return self._skipping()
        line, values, trend, entry = self.first_bad
        kinds = _non_finite(values)
        which = " and ".join(values.get(f"{kind}_key", kind) for kind in kinds)
        at = (
            f"{values.get('step_label', 'step')} {values['step']}"
            if "step" in values
            else f"line {line.number}"
            if self.sig.id == "trainer-dict-fragment"
            else f"logged entry {entry}"
        )
        if "epoch" in values:
            at += f" (epoch {values['epoch']})"
        title = f"{which} went {values['grad_norm'] if kinds == ['grad_norm'] else values['loss']} at {at}"
        notes = [f"{self.bad} non-finite entr{'y' if self.bad == 1 else 'ies'}"]
        if "note" in values:
            notes.append(values["note"])
        if kinds == ["grad_norm"] and "loss" in values:
            notes.append(
                f"the loss still reads {values['loss']}: transformers' logging_nan_inf_filter hides a "
                "non-finite loss in the log, the weights are already being corrupted"
                if self.sig.id in _HF
                else f"the loss still reads {values['loss']}: the gradients are already non-finite, and "
                "unless the optimizer skips the step the weights are being corrupted"
            )
        if trend:
            notes.append(
                "the entries before it: "
                + ", ".join(
                    f"loss {t.get('loss', '?')}" + (f" grad_norm {t['grad_norm']}" if "grad_norm" in t else "")
                    for t in trend
                )
            )
        detail = "; ".join(notes) + f"; first at {where(line)}: {clip(line.text)}"
        specifics = {
            "first_bad_entry": entry,
            "step": _int(values.get("step")),
            "epoch": values.get("epoch"),
            "last_finite_loss": trend[-1].get("loss") if trend else None,
            "non_finite_entries": self.bad,
            "grad_norms_before": [t.get("grad_norm") for t in trend] or None,
            "key": values.get(f"{kinds[0]}_key"),
            "step_label": values.get("step_label"),
        }
        fix = nan_fix(trend, self.settings, self.sig.id.startswith("megatron"))
        specifics["settings"] = self.settings.shown() or None
        finding = _sig_finding(
            Severity.ERROR, self.sig, title, detail, fix, _evidence(self.sig, line, self.bad, set(), specifics)
        )
        return [Located(line.number, "root", finding)]

    def _skipping(self) -> list[Located]:
        if not self.skipping or self.skipping[1] < self.SKIPPING:
            return []
        line, intervals, iterations, sig = self.skipping
        title = (
            f"skipped iterations in {intervals} logged intervals in a row ({iterations} iterations), "
            f"from line {line.number}"
        )
        detail = (
            "Megatron skips an update whose gradients overflowed or went NaN. After iterations that advanced, "
            f"a run of skips that does not end means the run no longer learns; first at {where(line)}: "
            f"{clip(line.text)}"
        )
        specifics = {"intervals": intervals, "skipped_iterations": iterations}
        finding = _sig_finding(
            Severity.WARNING, sig, title, detail, sig.fix, _evidence(sig, line, intervals, set(), specifics)
        )
        return [Located(line.number, "root", finding)]


RUN_SETTINGS = ("log-precision", "log-deepspeed-version", "log-overlap-comm")


class RunSettings:
    """What a log says of the run's precision, DeepSpeed version and ZeRO overlap_comm: the first line of each."""

    def __init__(self):
        self.precision: dict[str, Line] = {}  # "fp16" / "bf16" -> the first line that shows it on
        self.deepspeed: str | None = None
        self.overlap: tuple[bool, int | None] | None = None  # overlap_comm, the ZeRO stage on that line

    def add(self, sig_id: str, line: Line, groups: dict[str, Any]) -> None:
        if sig_id == "log-precision":
            flag = {"bfloat16": "bf16", "float16": "fp16"}.get(groups.get("flag"), groups.get("flag"))
            if flag and groups.get("on") in (None, "True", "true") and len(self.precision) < 2:
                self.precision.setdefault(flag, line)
        elif sig_id == "log-deepspeed-version":
            self.deepspeed = self.deepspeed or groups.get("deepspeed")
        elif self.overlap is None and groups.get("overlap"):
            self.overlap = (groups["overlap"] in ("True", "true"), _int(groups.get("stage")))

    def shown(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in {
                "precision": sorted(self.precision) or None,
                "deepspeed": self.deepspeed,
                "overlap_comm": self.overlap and self.overlap[0],
            }.items()
            if v is not None
        }


def nan_fix(trend: list[dict[str, str]], settings: RunSettings, megatron: bool) -> str:
    """The fix of a non-finite loss from what the log shows: the gradient norm before it, the precision, a
    DeepSpeed release with a known gradient race; never a precision change the log says the run already made."""
    clip = "--clip-grad 1.0" if megatron else "max_grad_norm = 1.0"
    parts = []
    norms = [v for v in (_float(t.get("grad_norm")) for t in trend) if v is not None]
    if len(norms) >= 2 and norms[-1] > 4 * max(norms[0], 1e-12) and norms[-1] > 1:
        parts.append(
            f"the gradient norm grew from {norms[0]:g} to {norms[-1]:g} over the entries before it: a lower "
            f"learning rate with a longer warmup, and {clip}"
        )
    else:
        parts.append(f"a lower learning rate with warmup, {clip}")
    precision = settings.precision
    if set(precision) == {"fp16"}:
        parts.insert(
            0,
            f"the log shows fp16 ({where(precision['fp16'])}): train in bf16 where the GPU has it (Ampere "
            "or newer), whose range is fp32's",
        )
    elif set(precision) == {"bf16"}:
        parts.append(
            f"the run is already bf16 ({where(precision['bf16'])}): not an fp16 overflow; trace the step's "
            "rows (`sftdoctor train` names them) and check the data"
        )
    elif not precision:
        parts.append("the log does not show the precision: if it is fp16, bf16 instead")
    if advisory := _overlap_advisory(settings):
        parts.insert(0, advisory)
    return "; ".join(parts) + "; `sftdoctor explain nan-loss`"


def _float(text: str | None) -> float | None:
    """A finite logged number (`3.2`, `'3.2'`, `tensor(3.2, device='cuda:0')`), else None."""
    match = re.search(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text or "")
    return float(match[0]) if match and not trainer_lines.non_finite(text) else None


def _overlap_advisory(settings: RunSettings) -> str | None:
    """DeepSpeed's ZeRO overlap_comm gradient races (checks/advisories.py has the releases), when the log names
    the version and overlap_comm is on."""
    if settings.deepspeed is None or settings.overlap is None or not settings.overlap[0]:
        return None
    from sftdoctor.checks.advisories import ADVISORIES

    stage = settings.overlap[1]
    wanted = "deepspeed-zero3-overlap-torch210" if stage == 3 else "deepspeed-overlap-comm-zero12"
    advisory = next(a for a in ADVISORIES if a.id == wanted)
    fixed = advisory.affected[1]
    if version_tuple(settings.deepspeed) >= version_tuple(fixed):
        return None
    return (
        f"DeepSpeed {settings.deepspeed} with overlap_comm on has a known gradient race that gives NaN losses "
        f"(fixed in {fixed}): {advisory.fix}"
    )


_HF = ("trainer-loss-dict", "sftdoctor-step-line")  # transformers' own logging, with its NaN filter
WRAPPED = 6  # physical lines a wrapped entry may span around the one that names a loss


def _entry(sig: Signature, line: Line, groups: dict[str, Any]) -> dict[str, str]:
    """The values of one logged entry: a Trainer dict's fields (or the signature's groups), else whatever
    loss and gradient norm the line holds, in any trainer's format, with its step."""
    values = {**log_fields(line.text), **{k: v for k, v in groups.items() if v is not None}}
    if "loss" in values:
        return values
    found = trainer_lines.fields(line.text)
    if not _non_finite(found):
        for joined in trainer_lines.joins(trainer_lines.entry(line.text, line.after(WRAPPED))):
            if _non_finite(wrapped := trainer_lines.fields(joined)):
                found = wrapped
                break
    values.update(found)
    if at := _step(line):
        values["step_label"], values["step"] = at[0], str(at[1])
    return values


def _step(line: Line) -> tuple[str, int] | None:
    """The step the line is at: on it, else (a line a paste wrapped) in the entry it belongs to: the lines
    before it back to the entry's start, and the lines after that go on with it."""
    if at := trainer_lines.step(line.text):
        return at
    lines = [line.text]
    if not trainer_lines.starts_entry(line.text):
        for earlier in line.earlier(WRAPPED):
            lines.insert(0, earlier)
            if trainer_lines.starts_entry(earlier) or trainer_lines.step(earlier):
                break
    after = line.after(WRAPPED)
    forward = trainer_lines.entry(line.text, after)[1:]
    if len(forward) < len(after) and trainer_lines.counter_only(after[len(forward)]):
        forward.append(after[len(forward)])  # a progress bar's counter printed after its description
    return next(filter(None, map(trainer_lines.step, trainer_lines.joins(lines + forward))), None)


def _entry_fields(text: str) -> dict[str, str]:
    """The loss and gradient norm of a line a tally kept, for the trend."""
    fields = log_fields(text)
    return fields if "loss" in fields else trainer_lines.fields(text)


WARN_SCALE = 32  # a dynamic fp16 loss scale this low means almost every step overflows


def _non_finite(values: dict[str, str]) -> list[str]:
    return [k for k in ("loss", "grad_norm") if trainer_lines.non_finite(values.get(k))]


class LossScale(Summary):
    """fp16 loss-scale trajectory: the early warm-up from 2^16 or 2^32 is normal; a fall to the floor is not."""

    KEEP = 8

    def __init__(self):
        self.head: list[float] = []
        self.tail: deque[float] = deque(maxlen=self.KEEP)
        self.last: float | None = None
        self.dropped = False
        self.overflows = 0
        self.lowest: float | None = None
        self.first: Line | None = None
        self.sig = None
        self.floor: tuple[Line, Signature] | None = None

    def add(self, sig, line, groups):
        if sig.id.endswith("minimum"):
            self.floor = self.floor or (line, sig)
        else:
            self.overflows += 1
            self.first, self.sig = self.first or line, self.sig or sig
            for value in (groups.get("scale"), groups.get("next")):
                if value is not None:
                    self._push(float(value))

    def _push(self, value: float) -> None:
        self.lowest = value if self.lowest is None else min(self.lowest, value)
        if value == self.last:
            return
        self.last = value
        if len(self.head) < self.KEEP:
            self.head.append(value)
        else:
            self.dropped = self.dropped or len(self.tail) == self.KEEP
            self.tail.append(value)

    def trajectory(self) -> str:
        values = [f"{v:g}" for v in self.head] + (["…"] if self.dropped else []) + [f"{v:g}" for v in self.tail]
        return " → ".join(values)

    def results(self, ctx):
        out = []
        specifics = {"overflows": self.overflows, "lowest_scale": self.lowest, "trajectory": self.trajectory()}
        if self.floor:
            line, sig = self.floor
            title = "fp16 loss scale at its minimum: DeepSpeed stopped the run"
            history = (
                f"{self.overflows} overflow steps before it, loss scale {self.trajectory()}; " if self.overflows else ""
            )
            detail = f"{history}at {where(line)}: {clip(line.text)}"
            out.append(
                Located(
                    line.number,
                    "root",
                    _sig_finding(
                        Severity.ERROR, sig, title, detail, sig.fix, _evidence(sig, line, 1, set(), specifics)
                    ),
                )
            )
        elif self.first and self.lowest is not None and self.lowest < WARN_SCALE:
            severity = Severity.ERROR if self.lowest <= 1 else Severity.WARNING
            title = f"fp16 loss scale fell to {self.lowest:g} after {self.overflows} overflow steps"
            detail = (
                f"loss scale {self.trajectory()}; below {WARN_SCALE} nearly every step overflows (the early fall "
                f"from 2^16 or 2^32 to a few thousand is normal); first at {where(self.first)}"
            )
            out.append(
                Located(
                    self.first.number,
                    "root",
                    _sig_finding(
                        severity,
                        self.sig,
                        title,
                        detail,
                        self.sig.fix,
                        _evidence(self.sig, self.first, self.overflows, set(), specifics),
                    ),
                )
            )
        return out


class NcclError(Summary):
    """NCCL errors: the error kind, the NCCL version and the first NCCL WARN (usually the real reason)."""

    def __init__(self):
        self.first = self.sig = None
        self.kinds: Counter = Counter()
        self.groups: dict[str, Any] = {}
        self.ranks: set[int] = set()
        self.warn: tuple[Line, str] | None = None
        self.count = 0

    def add(self, sig, line, groups):
        if sig.role == "context":  # NCCL WARN, or the `Last error:` torch quotes from NCCL
            if self.warn is None:
                self.warn = (line, groups.get("last") or groups.get("warn") or line.text)
            return
        self.count += 1
        self.kinds[groups.get("kind") or ("shared-memory error" if sig.id == "nccl-shm" else sig.id)] += 1
        if sig.id == "nccl-shm" and self.warn is None:
            self.warn = (line, line.text)
        if line.rank is not None and len(self.ranks) < MAX_RANKS:
            self.ranks.add(line.rank)
        if self.first is None:
            self.first, self.sig, self.groups = line, sig, groups

    def results(self, ctx):
        if self.first is None:
            return []
        kind = self.kinds.most_common(1)[0][0]
        title = f"NCCL {kind}"
        if self.groups.get("nccl"):
            title += f" (NCCL {self.groups['nccl']})"
        if self.ranks:
            title += f" on {ranks_text(self.ranks)}"
        notes = []
        if self.warn is not None:
            notes.append(f"NCCL's own reason ({where(self.warn[0])}): {clip(self.warn[1])}")
        else:
            notes.append(
                "no NCCL WARN line in the log: rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see why"
            )
        detail = "; ".join(notes) + f"; first error at {where(self.first)}: {clip(self.first.text)}"
        specifics = {"kind": kind, "nccl": self.groups.get("nccl"), "reason": clip(self.warn[1]) if self.warn else None}
        fix = self.sig.fix
        if self.warn is not None and _SHM.search(self.warn[1]):  # NCCL's shm transport (transport/shm.cc, shmutils.cc)
            title += ": /dev/shm is too small for NCCL's shared-memory segments"
            fix = (
                "give the container more shared memory (docker --shm-size=16g or --ipc=host; Kubernetes: an emptyDir "
                "with medium: Memory on /dev/shm), or NCCL_SHM_DISABLE=1 (slower); `sftdoctor explain nccl-error`"
            )
        finding = _sig_finding(
            Severity.ERROR,
            self.sig,
            title,
            detail,
            fix,
            _evidence(self.sig, self.first, self.count, self.ranks, specifics),
        )
        return [Located(self.first.number, self.sig.role, finding)]


# NCCL's words when a shared-memory segment cannot be made: "failed to extend /dev/shm/nccl-X to N bytes",
# "Error while creating shared memory segment /dev/shm/nccl-X", "Call to posix_fallocate failed".
_SHM = re.compile(r"/dev/shm|shared memory segment|posix_fallocate")

SIGNALS = {-9: "SIGKILL", -7: "SIGBUS", -6: "SIGABRT", -11: "SIGSEGV", -15: "SIGTERM"}


class Failures(Summary):
    """The launcher's account (torchrun's Root Cause block, DeepSpeed's return codes): who failed first, how.

    A rank killed with -9 is the kernel's OOM killer far more often than anything else; -7 is a bus error,
    almost always /dev/shm too small. Other exit codes are context for the other findings."""

    def __init__(self):
        self.in_root = False
        self.pending_rank: int | None = None
        self.first: dict[str, Any] = {}
        self.line: Line | None = None
        self.sig = None

    def add(self, sig, line, groups):
        if sig.id == "torchrun-root-cause":
            self.in_root, self.first = True, {}
        elif sig.id == "torchrun-failures":
            self.in_root = False
        elif (code := groups.get("exitcode") or groups.get("code")) is not None:
            if self.first and not self.in_root:
                return
            rank, local = self.pending_rank, groups.get("local_rank") or groups.get("ds_local_rank")
            self.first = {"rank": rank, "local_rank": _int(local), "exitcode": int(code)}
            self.pending_rank = None
            self.line, self.sig = line, sig
            self.in_root = False
        elif groups.get("rank") is not None:
            self.pending_rank = _int(groups["rank"])

    def results(self, ctx):
        ctx.first_failure = {**self.first, "at": self.line} if self.first else {}
        code = self.first.get("exitcode")
        if code not in (-9, -7) or self.line is None:
            return []
        if self.first.get("rank") is not None:
            who = f"rank {self.first['rank']}"
        elif self.first.get("local_rank") is not None:
            who = f"local rank {self.first['local_rank']}"
        else:
            who = "a rank"
        if code == -9:
            title = f"{who} was killed with SIGKILL (exitcode -9): most often the host's OOM killer"
            fix = (
                "check `dmesg -T | grep -i 'killed process'`; load the model once per node (low_cpu_mem_usage), "
                "turn off ZeRO CPU offload or lower dataloader/map workers"
            )
        else:
            title = f"{who} died of SIGBUS (exitcode -7): shared memory (/dev/shm) exhausted"
            fix = (
                "give the container more shared memory (docker --shm-size=16g / --ipc=host) or fewer dataloader workers"
            )
        detail = f"the first failure torchrun or DeepSpeed reported, at {where(self.line)}: {clip(self.line.text)}"
        finding = Finding(
            Severity.ERROR,
            title,
            detail,
            fix,
            "host-oom",
            _evidence(
                self.sig,
                self.line,
                1,
                set(),
                {
                    "failed_rank": self.first.get("rank"),
                    "failed_local_rank": self.first.get("local_rank"),
                    "exitcode": code,
                    "signal": SIGNALS.get(code),
                },
            ),
            "host-oom",
        )
        return [Located(self.line.number, "root", finding)]


class CudaBuild(Summary):
    """An extension that refused torch's CUDA build (apex, xformers, torchvision/torchaudio, bitsandbytes,
    flash-attn): the first refusal, with the toolkit (nvcc -V, CMake) and torch the log printed before it."""

    def __init__(self):
        self.toolkit: str | None = None
        self.torch_version: str | None = None
        self.first: tuple[Signature, Line, dict[str, Any]] | None = None
        self.count = 0

    def add(self, sig, line, groups):
        if sig.role == "context":
            self.toolkit = groups.get("toolkit") or self.toolkit
            self.torch_version = groups.get("torch_version") or self.torch_version
            return
        if sig.id == "xformers-built-for" and groups.get("have_cu") in (None, groups["built_cu"]):
            return  # built for another torch of the same CUDA: not a CUDA mismatch
        self.count += 1
        if self.first is None:
            self.first = (sig, line, {"installed": self.toolkit, **{k: v for k, v in groups.items() if v is not None}})

    def results(self, ctx):
        if self.first is None:
            return []
        sig, line, groups = self.first
        torch_cuda = _cuda_of(self.torch_version)
        if sig.id == "bitsandbytes-cuda-library":
            groups = {**groups, "torch": _bnb_cuda(groups["torch"])}
        title = _refusal(sig.id, groups, torch_cuda)
        seen = f"; {self.count} times" if self.count > 1 else ""
        detail = f"first at {where(line)}{seen}: {clip(line.text)}"
        specifics = {"torch": torch_cuda, **groups} if sig.id != "xformers-built-for" else groups
        finding = _sig_finding(
            Severity.ERROR,
            sig,
            title,
            detail,
            fill(sig.fix, groups),
            _evidence(sig, line, self.count, set(), specifics),
        )
        return [Located(line.number, "root", finding)]


def _refusal(sig_id: str, g: dict[str, Any], torch_cuda: str | None) -> str:
    """The title of an extension's CUDA refusal, in its own terms."""
    if sig_id == "apex-cuda-mismatch":
        return f"nvcc is CUDA {g['installed'] or '?'}, torch was built with CUDA {g['torch']}: apex refuses to build"
    if sig_id == "xformers-built-for":
        return (
            f"xformers was built for torch {g['built_torch']}+{g['built_cu']} (CUDA {_xformers_cuda(g['built'])}), "
            f"this torch is {g['have_torch']}+{g['have_cu']}: its kernels will not load"
        )
    if sig_id == "companion-cuda-mismatch":
        return (
            f"{g['ext']} was built for CUDA {g['installed']}, torch for CUDA {g['torch']}: {g['ext']} refuses to load"
        )
    if sig_id == "bitsandbytes-cuda-library":
        built = f" (it was built with CUDA {g['installed']})" if g["installed"] else ""
        return f"bitsandbytes has no library for torch's CUDA {g['torch']}{built}"
    found = f", found {g['installed']}" if g["installed"] else ""
    torch = f" (torch is built with CUDA {torch_cuda})" if torch_cuda else ""
    return f"{g['ext']} needs nvcc CUDA {g['minimum']} or newer{found}{torch}"


def _cuda_of(torch_version: str | None) -> str | None:
    """2.0.1+cu117 -> 11.7."""
    match = re.search(r"\+cu(\d+)(\d)$", torch_version or "")
    return f"{match[1]}.{match[2]}" if match else None


def _xformers_cuda(code: str) -> str:
    """xformers' setup.py writes CUDA as major * 100 + the minor's first digit: 1201 -> 12.1."""
    return f"{int(code) // 100}.{int(code) % 100}" if code.isdecimal() else code


def _bnb_cuda(code: str) -> str:
    """bitsandbytes names its libraries by CUDA major and minor run together: 121 -> 12.1."""
    return f"{code[:-1]}.{code[-1]}" if code.isdecimal() and len(code) > 1 else code


class Crash(Summary):
    """What shows that the run failed, whatever its cause: Python tracebacks and exception lines per rank, a
    non-zero exit status, a fatal signal, a cancelled job, a wait that timed out, a C++ error line of torch.
    Only read when no signature names a cause: then the verdict is "failed: cause not recognised", quoting the
    innermost exception (the first of its chain: the one raised deepest) of the first rank to fail."""

    def __init__(self):
        self.exceptions: dict[int | None, Line] = {}  # per rank, its first exception line
        self.tracebacks: dict[int | None, Line] = {}  # per rank, its first traceback header
        self.other: Line | None = None  # the first other sign of a failure
        self.what = ""  # what that sign is

    def add(self, sig, line, groups):
        if sig.id == "python-exception":
            if line.rank not in self.exceptions and len(self.exceptions) < MAX_RANKS:
                self.exceptions[line.rank] = line
        elif sig.id == "python-traceback":
            if line.rank not in self.tracebacks and len(self.tracebacks) < MAX_RANKS:
                self.tracebacks[line.rank] = line
        elif self.other is None and (what := _failure_sign(sig.id, groups)):
            self.other, self.what = line, what

    def results(self, ctx):
        return []

    @property
    def first(self) -> Line | None:
        """The first exception line of the log (any rank)."""
        return min(self.exceptions.values(), key=lambda line: line.number, default=None)

    def shows_failure(self, ctx: Context) -> bool:
        return bool(self.exceptions or self.tracebacks or self.other or (ctx.first_failure.get("exitcode") or 0))

    def _exception_said(self, line: Line, launcher: str) -> tuple[str, str, dict[str, Any]]:
        """Title, detail and evidence of an exception no signature explains."""
        quote = clip(line.joined(1) if line.text.rstrip().endswith(":") else line.text)
        who = f"rank {line.rank}, " if line.rank is not None else ""
        title = f"the run failed: {quote} ({who}line {line.number}; cause not recognised)"
        detail = (
            "the innermost exception of the first rank to fail, where no known failure signature matched"
            + (f"; {ranks} ranks raised one" if (ranks := sum(r is not None for r in self.exceptions)) > 1 else "")
            + launcher
        )
        return title, detail, {"line": line.number, "rank": line.rank, "text": quote}

    def _no_exception_line(
        self, failed: dict[str, Any], cascade: int, launcher: str
    ) -> tuple[Line | None, str, str, dict[str, Any]]:
        """The line shown, title, detail and evidence of a failure the log gives no exception line for: a cut
        traceback, another sign of failure, the launcher's word, or only the job torn down."""
        line = min(self.tracebacks.values(), key=lambda found: found.number, default=None) or self.other
        if line is not None and line in self.tracebacks.values():
            sign = "a Python traceback with no exception line (the paste or the log was cut before it)"
        elif line is not None:
            sign = self.what
        elif (line := failed.get("at")) is not None:
            sign, launcher = (
                f"the launcher saw {_who_failed(failed)} fail (exitcode {failed['exitcode']}) and the log holds no "
                "traceback",
                "",
            )
        else:
            sign = "the launcher tore the job down and the log holds no traceback"
        title = f"the run failed: {sign}; cause not recognised"
        detail = (
            f"first at {where(line)}: {clip(line.text)}"
            if line is not None
            else f"{cascade} cascade line{'s' if cascade != 1 else ''} (the launcher tearing the job down)"
        ) + launcher
        evidence = {
            "line": line.number if line else None,
            "rank": line.rank if line else None,
            "text": clip(line.text) if line else None,
        }
        return line, title, detail, evidence

    def unrecognised(self, ctx: Context, cascade: int) -> Located | None:
        """The finding for a log that shows a failure no signature explains, or None when it shows none."""
        if not (self.shows_failure(ctx) or cascade):
            return None
        failed = ctx.first_failure
        rank = failed.get("rank") if failed.get("rank") in self.exceptions else None
        line = self.exceptions.get(rank) if rank is not None else self.first
        launcher = (
            f"; the launcher saw rank {failed['rank']} fail first (exitcode {failed['exitcode']})"
            if failed.get("rank") is not None and failed.get("exitcode")
            else ""
        )
        if line is not None:
            title, detail, evidence = self._exception_said(line, launcher)
        else:
            line, title, detail, evidence = self._no_exception_line(failed, cascade, launcher)
        fix = (
            "read the lines above that one, under the same rank's prefix; with no traceback, rerun with "
            "`torchrun --tee 3 --log-dir logs/` (one file per rank) or @record on main, which puts the failing rank's "
            "traceback in torchrun's Root Cause block; `sftdoctor explain crash-log`"
        )
        finding = Finding(
            Severity.ERROR,
            title,
            detail,
            fix,
            "crash-log",
            {
                "signature": "crash-log",
                **evidence,
                "failed_rank": failed.get("rank"),
                "exitcode": failed.get("exitcode"),
            },
            "crash-log",
        )
        return Located(line.number if line else 0, "root", finding)


def _failure_sign(sig_id: str, groups: dict[str, Any]) -> str | None:
    """What a context line says of a failure, or None when it says none (an exit status of 0)."""
    if sig_id == "exit-status":
        code = _int(groups.get("code"))
        return f"a process exited with status {code}" if code not in (0, None) else None
    if sig_id == "fatal-signal":
        return f"a process died of {groups.get('signal') or 'a fatal signal'}"
    if sig_id == "slurm-cancelled":
        return "Slurm cancelled the job" + (f" ({groups['why'].strip().lower()})" if groups.get("why") else "")
    if sig_id == "wait-timed-out":
        return "a distributed wait timed out"
    if sig_id == "torch-cpp-error":
        return "torch's C++ side logged an error"
    return None


# ---------------------------------------------------------------- rank 0's store lost (kb topic store-lost)

# Words of a store client's failure: rank 0 raising one of these is itself a client of node 0's agent, not a cause.
_STORE_WORDS = re.compile(r"ncclUniqueId|got 0 bytes|sent 0 bytes|Connection reset by peer|Broken pipe|TCPStore")


class StoreLost(Summary):
    """Ranks that lost rank 0's TCPStore (kb topic store-lost): rank 0, or node 0's torchrun agent, died first.

    The cause is rank 0's death, never the network the message names. What the log shows of why rank 0 died
    comes first: a cause another signature names (an OOM on rank 0, torchrun's exitcode -9 for it) is the root and
    this finding its symptom; rank 0's own exception that nothing else names is quoted here, as the root. Store
    errors with no failure anywhere in the log (the heartbeat's warnings as a healthy run ends, rank 0 first) are
    info only."""

    def __init__(self):
        self.lost: dict[int | None, tuple[Line, dict[str, Any]]] = {}  # ncclUniqueId gets that found the store gone
        self.client: dict[int | None, tuple[Line, dict[str, Any]]] = {}  # TCPStore client errors
        self.heartbeat: dict[int | None, tuple[Line, dict[str, Any]]] = {}  # the NCCL heartbeat's store checks
        self.rank0: Line | None = None  # rank 0's first exception that is not a store client's
        self.raised = False  # an exception line on any rank: the run failed
        self.sig: Signature | None = None

    def add(self, sig, line, groups):
        if sig.id == "store-lost-exception":
            self.raised = True
            if (
                line.rank == 0
                and self.rank0 is None
                and not _STORE_WORDS.search(line.text)
                and not line.text.startswith("Traceback")
            ):
                self.rank0 = line
            return
        rank = _int(groups["rank"]) if groups.get("rank") is not None else line.rank
        bucket = {"store-lost-unique-id": self.lost, "store-lost-client": self.client}.get(sig.id, self.heartbeat)
        if rank not in bucket and len(bucket) < MAX_RANKS:
            bucket[rank] = (line, groups)
        if sig.role == "symptom" and self.sig is None:
            self.sig = sig

    def results(self, ctx):
        seen = {**self.heartbeat, **self.client, **self.lost}
        if not seen:
            return []
        first, groups = min(seen.values(), key=lambda found: found[0].number)
        ranks = sorted(r for r in seen if r is not None)
        remote = next((g["remote"] for _, g in self.client.values() if g.get("remote")), None)
        error = next((g.get("error") for _, g in [*self.lost.values(), *self.client.values()] if g.get("error")), None)
        specifics = {
            "dead_rank": 0,
            "store": remote,
            "error": error,
            "unique_id_ranks": sorted(r for r in self.lost if r is not None) or None,
        }
        who = ranks_text(ranks) if ranks else "the other ranks"
        failed = ctx.first_failure
        died_of_it = bool(self.lost) or any(g.get("exc") for _, g in self.client.values())  # raised, not warned
        if not (died_of_it or self.raised or failed.get("exitcode")):
            title = (
                f"{who} found rank 0's TCPStore gone ({error or 'closed'}) and this log shows no failure: at the "
                "end of a run, rank 0 exiting first (harmless); else rank 0's own lines say why it stopped"
            )
            fix = "nothing to do; a dist.barrier() before destroy_process_group() quiets it"
            return self._not_the_failure(title, fix, first, len(seen), ranks, specifics)
        cause, named, at = self._cause(failed)
        if not died_of_it and at is None and not cause:
            # only the heartbeat's and the client's warnings, in a run that failed elsewhere: the store went away as
            # the job was torn down, which says nothing of who failed first
            title = (
                f"{who} found rank 0's TCPStore gone ({error or 'closed'}) as the failed job was torn down: "
                "rank 0 (or node 0's torchrun agent) exited; the failure itself is elsewhere"
            )
            return self._not_the_failure(title, self._sig().fix, first, len(seen), ranks, specifics)
        title = f"{who} lost rank 0's TCPStore ({error or 'its socket closed'}): rank 0 died first" + (
            f": {cause}" if cause else "; its own lines (or node 0's) say why"
        )
        at_store = f" at {remote}" if remote else ""
        notes = [
            f"the c10d store lives in rank 0's process (or node 0's torchrun agent){at_store}; when it dies"
            " every other rank's next store call fails with these words: not a network fault"
        ]
        if cause:
            notes.append(f"rank 0: {cause}" + (f" (line {at.number})" if at is not None else ""))
        detail = "; ".join(notes + [f"first at {where(first)}: {clip(first.text)}"])
        sig = self._sig()
        specifics["rank0_cause"] = cause
        shown = at if at is not None and not named else first  # rank 0's own exception, when it is the cause shown
        finding = Finding(
            Severity.ERROR,
            title,
            detail,
            sig.fix,
            "store-lost",
            _evidence(sig, shown, len(seen), ranks, specifics),
            "store-lost",
        )
        return [Located(shown.number, "symptom" if named else "root", finding)]

    def _not_the_failure(self, title: str, fix: str, first: Line, count: int, ranks, specifics) -> list[Located]:
        """An info finding: the store went away, and that is not why the run failed (if it did)."""
        evidence = _evidence(self._sig(), first, count, ranks, specifics)
        detail = f"first at {where(first)}: {clip(first.text)}"
        finding = Finding(Severity.INFO, title, detail, fix, "store-lost", evidence, "store-lost")
        return [Located(first.number, "context", finding)]

    def _cause(self, failed: dict[str, Any]) -> tuple[str | None, bool, Line | None]:
        """(why rank 0 died, as the log says; whether another signature names it as a root cause; its line)."""
        if self.rank0 is not None:
            return clip(self.rank0.text), _named_elsewhere(self.rank0.text), self.rank0
        code = failed.get("exitcode")
        if code is not None and 0 in (failed.get("rank"), failed.get("local_rank")):
            signal = f" ({SIGNALS[code]})" if code in SIGNALS else ""
            return f"the launcher saw it exit with exitcode {code}{signal}", code in (-9, -7), None
        return None, False, None

    def _sig(self) -> Signature:
        from sftdoctor.triage.signatures import signatures

        return self.sig or next(s for s in signatures() if s.id == "store-lost-unique-id")


def _named_elsewhere(text: str) -> bool:
    """Whether a cause signature of another topic (a CUDA OOM, a version mismatch) explains this exception line."""
    from sftdoctor.triage.signatures import signatures

    return any(
        s.role == "root"
        and s.topic not in ("store-lost", "crash-log")
        and any(n in text for n in ([s.needle] if isinstance(s.needle, str) else s.needle))
        and s.regex.search(text)
        for s in signatures()
    )


# ---------------------------------------------------------------- the others waited for rank 0 (data-prep-timeout)

# Store waits that end a rank's wait for rank 0 (nccl-timeout.md): the op each is reported as.
STORE_WAITS = {"store-wait-timeout": "c10d store wait", "nccl-unique-id-timeout": "ncclUniqueId get from rank 0"}
# A datasets map/filter bar (tqdm, unit " examples"; "ex" and "ba" in datasets 1.x): "Tokenizing Prompts (num_proc=64):
#  92%|█████████▏| 328986/359152 [29:58<12:05, 41.59 examples/s]". The last one drawn on the line is read.
DATA_BAR = re.compile(
    r"^(?:.*[\r\]])?[^\r\]]*?(?<![\w,.-])(?P<desc>[A-Z][\w ,.-]{1,80}?)"
    r"(?: \(num_proc=(?P<num_proc>\d+)\))?: +(?P<pct>\d+)%\|[^|]*\| *(?P<done>\d+)/(?P<total>\d+) "
    r"\[(?P<elapsed>[\d:]+)<[^\]]*?(?:examples|ex|ba)/s\]"
)
STARTUP_SEQ = 8  # a timed-out collective this early (main_process_first's barrier is among the first) is at start-up


def whole_watchdog(line: Line) -> bool:
    """Whether the line holds the watchdog's message whole (the plain signature's match)."""
    return bool(_signature_regex("nccl-watchdog-timeout").search(line.text))


@functools.cache
def _signature_regex(sig_id: str) -> re.Pattern:
    from sftdoctor.triage.signatures import signatures

    return next(s for s in signatures() if s.id == sig_id).regex


def data_bar(line: Line) -> dict[str, Any] | None:
    """The data preparation's progress bar on `line`, or on it and the two lines before (a paste that wrapped it)."""
    match = DATA_BAR.search(line.text) or DATA_BAR.search(" ".join([*reversed(line.earlier(2)), line.text]))
    return match.groupdict() if match else None


def rank0_busy(prep: dict[str, Any] | None, entries: dict, seq, timeout_ms, ranks) -> tuple[str, str, str, dict] | None:
    """(title, fix, topic, specifics) of a timeout at start-up while rank 0 was still busy: preparing the data when
    its progress bar was the last thing printed, else at least not yet at its first collective. None otherwise."""
    store_wait = next((e["op"] for e in entries.values() if e["op"] in STORE_WAITS.values()), None)
    if not store_wait and not (prep and seq is not None and seq <= STARTUP_SEQ):
        return None
    who = ranks_text(ranks) if ranks else "the other ranks"
    after = f" after {timeout_ms / 1000:g} s" if timeout_ms else ""
    if prep:
        done = f"{prep['done']}/{prep['total']} rows ({prep['pct']}%) after {prep['elapsed']}"
        title = (
            f"{who} gave up{after} waiting for rank 0, which was still preparing the data "
            f"({prep['desc'].strip()}: {done}): the process-group timeout is shorter than the data preparation"
        )
        fix = (
            "prepare the data once before the launch (tokenize and save_to_disk, or keep the datasets cache) or "
            "raise ddp_timeout above its measured time (`sftdoctor check --config RUN.toml` measures it: "
            "data-prep-timeout); more dataset_num_proc shortens it"
        )
        specifics = {
            "data_prep": prep["desc"].strip(),
            "rows_done": _int(prep["done"]),
            "rows_total": _int(prep["total"]),
            "elapsed": prep["elapsed"],
            "num_proc": _int(prep.get("num_proc")),
            "waiting_in": store_wait or "barrier",
        }
        return title, fix, "data-prep-timeout", specifics
    title = (
        f"{who} gave up{after} waiting for rank 0 to reach its first collective ({store_wait}): rank 0 was still "
        "busy (preparing the data, downloading, a prompt waiting for input) or stuck"
    )
    fix = (
        "read what rank 0 printed last; data preparation on rank 0 first (main_process_first) must end within "
        "ddp_timeout: prepare it before the launch or raise ddp_timeout (`sftdoctor explain data-prep-timeout`)"
    )
    return title, fix, "data-prep-timeout", {"waiting_in": store_wait}
