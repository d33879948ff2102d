"""Log triage (`sftdoctor explain --log`): read a failed run's log and name what went wrong.

The signatures live with the knowledge they point to, in the kb topics' front matter
(signatures.py); the scanner streams the log (scan.py); summaries turn matches into findings
with specifics (summaries.py); `diagnose` puts the root cause before its cascade.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import BinaryIO

from sftdoctor.findings import Finding, Severity
from sftdoctor.triage import parallel
from sftdoctor.triage.registry import SUMMARIES
from sftdoctor.triage.scan import CHUNK, Line, Totals, candidate_lines, decode, read_chunks
from sftdoctor.triage.signatures import Signature, signatures
from sftdoctor.triage.summaries import Context, Crash, Generic, Located, Summary


@dataclass
class Diagnosis:
    source: str
    findings: list[Located]  # the root cause first, then the rest in log order
    root: Located | None
    bytes: int = 0
    lines: int = 0
    cascade: Counter = field(default_factory=Counter)
    benign: int = 0
    matched: Counter = field(default_factory=Counter)  # lines per signature id, every role
    failed: bool = False  # the log shows a failure (a traceback, a failed rank, an exit status, a cascade)

    @property
    def problems(self) -> bool:
        return any(loc.finding.severity.rank >= Severity.WARNING.rank for loc in self.findings)

    @property
    def verdict(self) -> str:
        """root-cause, failed-unrecognised (a failure no signature explains: the crash finding is the root) or
        nothing-recognised (no failure and no known problem; info findings at most: the only verdict exiting 0)."""
        if self.root is None:
            return "nothing-recognised"
        return "failed-unrecognised" if self.root.finding.id == "crash-log" else "root-cause"


def diagnose(
    stream: BinaryIO, source: str = "-", chunk: int = CHUNK, jobs: int = 1, range_size: int | None = None
) -> Diagnosis:
    """Read the log in `stream` and say what went wrong. A regular file of PARALLEL_MIN bytes or
    more is split across `jobs` processes (`range_size` forces the split, for tests)."""
    by_needle = _by_needle(signatures())
    totals, hits = _hits(stream, by_needle, chunk, jobs, range_size)
    summaries: dict[str, Summary] = {}
    ctx, matched = Context(), Counter()
    for hit in hits:
        _take(hit, by_needle, summaries, ctx, matched)
    roles = {s.id: s.role for s in signatures()}
    cascade = Counter({sig_id: n for sig_id, n in matched.items() if roles[sig_id] == "cascade"})
    benign = sum(n for sig_id, n in matched.items() if roles[sig_id] == "benign")
    diagnosis = Diagnosis(source, _results(summaries, ctx), None, totals.bytes, totals.lines, cascade, benign, matched)
    return _order(diagnosis, summaries.get("exception") or Crash(), ctx)


def _by_needle(sigs: tuple[Signature, ...]) -> dict[bytes, list[Signature]]:
    by_needle: dict[bytes, list[Signature]] = {}
    for sig in sigs:
        for needle in [sig.needle] if isinstance(sig.needle, str) else sig.needle:
            by_needle.setdefault(needle.encode(), []).append(sig)
    return by_needle


def _hits(stream: BinaryIO, by_needle, chunk: int, jobs: int, range_size: int | None):
    """(the bytes and lines read, complete once the hits are all taken; the hits): several processes
    for a big file, else one stream."""
    only_if = _only_if(by_needle)
    path = getattr(stream, "name", None) if range_size else parallel.eligible(stream, jobs)
    if path:
        scan = parallel.ParallelScan(path, by_needle, only_if, max(jobs, 1), range_size or parallel.RANGE)
        return scan.totals, scan
    totals = Totals()
    return totals, candidate_lines(read_chunks(stream, chunk), by_needle, only_if=only_if, totals=totals)


def _take(hit, by_needle, summaries: dict[str, Summary], ctx: Context, matched: Counter) -> None:
    """Match one candidate line against the signatures of the needles in it."""
    here = (
        by_needle[hit.needles[0]]
        if len(hit.needles) == 1
        else list(dict.fromkeys(s for n in hit.needles for s in by_needle[n]))
    )
    line = decode(hit)
    if calm := next((s for s in here if s.role == "benign" and s.regex.search(line.text)), None):
        matched[calm.id] += 1
        return
    if line.rank is not None and len(ctx.ranks_seen) < 4096:
        ctx.ranks_seen.add(line.rank)
    for sig in here:
        if sig.role == "benign" or not (match := _search(sig, line)):
            continue
        matched[sig.id] += 1
        if sig.role != "cascade":
            at = line if sig.wraps or match.start() <= QUOTE_BEFORE else _from(line, match.start())
            _summary(summaries, sig).add(sig, at, _groups(match))


def _search(sig: Signature, line: Line):
    """The signature's match in the line, or in it and the lines it wraps onto: joined at a space, else (a
    terminal that cut a word at its width) with nothing between."""
    if not sig.wraps:
        return sig.regex.search(line.text)
    return sig.regex.search(line.joined(sig.wraps)) or sig.regex.search(line.joined(sig.wraps, ""))


QUOTE_BEFORE = 160  # a progress bar or a long prefix before the message is cut from the quote


def _from(line: Line, start: int) -> Line:
    return dataclasses.replace(line, text="…" + line.text[start - QUOTE_BEFORE // 2 :])


def _groups(match) -> dict:
    """Named groups; NAME_2, NAME_3 (alternatives of one regex) fill NAME when it is empty."""
    groups = match.groupdict()
    for name in [n for n in groups if n.rpartition("_")[2].isdecimal()]:
        value, base = groups.pop(name), name.rpartition("_")[0]
        if groups.get(base) is None:
            groups[base] = value
    return groups


def _summary(summaries: dict[str, Summary], sig: Signature) -> Summary:
    key = sig.summariser or sig.id
    if key not in summaries:
        summaries[key] = SUMMARIES[sig.summariser]() if sig.summariser else Generic(sig)
    return summaries[key]


def _only_if(by_needle: dict[bytes, list[Signature]]) -> dict[bytes, tuple[tuple[bytes, ...], int]]:
    """Needles whose every signature looks only at lines with one of some words: the words, and how many lines
    after the needle's they may be on (a message that wraps)."""
    return {
        needle: (tuple(w.encode() for s in group for w in s.only_if), max(s.wraps for s in group))
        for needle, group in by_needle.items()
        if all(s.only_if for s in group)
    }


def _results(summaries: dict[str, Summary], ctx: Context) -> list[Located]:
    # The launcher's account of who failed first feeds the others' details, so it goes first.
    order = sorted(summaries.items(), key=lambda kv: kv[0] != "failures")
    return [loc for _, summary in order for loc in summary.results(ctx)]


def _order(diagnosis: Diagnosis, crash: Crash, ctx: Context) -> Diagnosis:
    """The root cause first: a cause (or, with none, a symptom) of warning level or above. An info finding (an
    advisory, a deprecation) is never the root cause. A log that shows a failure no such finding explains gets
    the crash finding as its root: "failed: cause not recognised"."""
    found = sorted(diagnosis.findings, key=lambda loc: loc.line)
    serious = [loc for loc in found if loc.finding.severity.rank >= Severity.WARNING.rank]
    root = next((loc for loc in serious if loc.role == "root"), None) or next(iter(serious), None)
    total_cascade = sum(diagnosis.cascade.values())
    diagnosis.failed = (
        crash.shows_failure(ctx) or total_cascade > 0 or any(loc.finding.severity is Severity.ERROR for loc in serious)
    )
    if root is None:
        unrecognised = crash.unrecognised(ctx, total_cascade)
        diagnosis.findings = [unrecognised, *found] if unrecognised else found
        diagnosis.root = unrecognised
        return diagnosis
    rest = []
    for loc in found:
        if loc is root:
            continue
        if loc.role == "symptom" and loc.line > root.line:
            note = f"after the {root.finding.id} at line {root.line}, probably its consequence. "
            loc = dataclasses.replace(loc, finding=dataclasses.replace(loc.finding, detail=note + loc.finding.detail))
        rest.append(loc)
    diagnosis.findings, diagnosis.root = [root, *rest], root
    return diagnosis


def add_dumps_finding(diagnosis: Diagnosis, finding: Finding) -> None:
    """The flight recorder's account of a stall (read from dumps beside the log, not from a line of it): after the
    log's root cause, or the root cause itself when the log names none and the dumps show a failing collective."""
    located = Located(0, "context", finding)
    unexplained = diagnosis.root is None or diagnosis.verdict == "failed-unrecognised"
    if unexplained and finding.severity is Severity.ERROR:
        diagnosis.root = located
        diagnosis.findings = [located, *diagnosis.findings]
        return
    at = diagnosis.findings.index(diagnosis.root) + 1 if diagnosis.root is not None else len(diagnosis.findings)
    diagnosis.findings.insert(at, located)
