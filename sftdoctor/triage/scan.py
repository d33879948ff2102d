"""Stream a log and hand over only the lines that may matter.

A log can be many GB with one rank's tqdm bar redrawn a million times on one "line", so it is
read in fixed chunks: each chunk is searched for all the signatures' literal needles in one pass
(needles.py), and only the lines around a hit are decoded. Memory stays at about two chunks
whatever the file; a line longer than `MAX_LINE` is cut into pieces (no signature needs more).
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple

from sftdoctor.triage.needles import finder, holders

# A chunk and the lines carried with it stay under glibc's 128 KiB mmap threshold, so their buffers are
# reused from the heap: at 256 KiB or 1 MiB each one was mapped and faulted in anew (+0.6 s of system
# time per GB).
CHUNK = 64 << 10
MAX_LINE = 64 << 10

# `\r` ends a line too: tqdm redraws with it, and the message after a bar starts a new "line".
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Prefixes that launchers put before a rank's lines, possibly nested (`0: [rank0]:[E ...] ...`):
# torch >= 2.2 `[rank3]:`, torchrun --tee / accelerate `[default3]:`, srun -l `3: `, each also with the rank
# written as a placeholder (`[rankx]:`, as users redact a paste: no rank); a bare `[12345] `
# (a pid or a line number some tools add) and a markdown quote's `> ` (a log pasted into an issue) are dropped.
_PREFIX = re.compile(r"\s*(?:\[(?:rank|default)(?:(\d+)|[xXN?*])\]:|(\d{1,5}): |\[\d+\] |>(?: |$))")
# torch's own messages: `[Rank 3]`, `[PG 1 Rank 3]` (2.3), `[PG ID 0 PG GUID 0(default_pg) Rank 3]` (>= 2.4).
_RANK_IN_TEXT = re.compile(r"\[(?:PG (?:ID )?\d+ (?:PG GUID [^\]]*? )?)?[Rr]ank (\d+)\]")


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, counted in `\n`
    text: str  # decoded, escape codes and launcher prefixes removed
    rank: int | None
    following: bytes = b""  # what comes after the line, for messages that wrap
    before: dict[bytes, tuple[int, tuple[bytes, ...]]] = field(default_factory=dict)  # per `only_if` needle:
    # the lines of that needle skipped before this one, and the last few
    preceding: bytes = b""  # what came before the line (up to PRECEDING bytes; less at a chunk's start)

    def joined(self, lines: int = 2, separator: str = " ") -> str:
        """The line and the next `lines` non-blank lines (at least `LOOKAHEAD` are there), cleaned, joined by
        `separator` (spaces for a message that goes on; "" for a line a terminal cut at its width)."""
        return separator.join([self.text, *self.after(lines)])

    def after(self, lines: int) -> list[str]:
        """Up to `lines` non-blank lines after this one, cleaned."""
        parts = (_clean(part)[0] for part in self.following.replace(b"\r", b"\n").split(b"\n") if part.strip())
        return list(itertools.islice(filter(None, parts), lines))

    def earlier(self, lines: int) -> list[str]:
        """Up to `lines` non-blank lines before this one, cleaned, nearest first."""
        parts = reversed(self.preceding.replace(b"\r", b"\n").split(b"\n"))
        return list(itertools.islice(filter(None, (_clean(part)[0] for part in parts)), lines))


def read_chunks(stream: BinaryIO, size: int = CHUNK) -> Iterator[bytes]:
    while chunk := stream.read(size):
        yield chunk


def candidate_lines(
    chunks: Iterable[bytes],
    needles: Iterable[bytes],
    max_line: int = MAX_LINE,
    only_if: dict[bytes, tuple[tuple[bytes, ...], int]] | None = None,
    limit: int | None = None,
    tallies: dict[bytes, Tally] | None = None,
    totals: Totals | None = None,
) -> Iterator[Hit]:
    """Every line that holds one of `needles`, in order.

    A needle in `only_if` is frequent and mostly dull (a Trainer dict at every logging step): its
    line is passed on only if it (or one of the next N lines, N given with the words) also holds one of
    the words given; the others are counted, and the last few kept, so the line passed on can say what
    came before it.

    The text after a line (up to `LOOKAHEAD` more lines) is for messages that wrap onto the next
    line, so the last lines of each chunk wait for the next one before they are searched.

    Lines that start at or after byte `limit` are only read as the text after the ones before
    (a range of a file scanned in parallel). `tallies` collects the `only_if` counts, `totals` the
    bytes and line ends read (up to `limit`)."""
    needles = tuple(sorted(set(needles)))
    search = _Search(needles, tallies if tallies is not None else {}, only_if or {})
    totals = totals if totals is not None else Totals()
    # `carry` holds the lines not searched yet, after up to PRECEDING bytes of searched ones (`begin` of them)
    # that the lines after them may look back on.
    carry, base, begin = b"", 0, 0
    for chunk in chunks:
        buf = carry + chunk if carry else chunk
        seps = _last_separators(buf, 2 * LOOKAHEAD + 1)
        data_end = seps[0] + 1 if seps else 0
        search_end = seps[-1] + 1 if len(seps) > 2 * LOOKAHEAD else 0
        if search_end <= begin and len(buf) - begin > 4 * max_line:
            search_end = data_end = data_end if data_end > begin else len(buf)  # enormous lines: in pieces
        search_end = max(search_end, begin)
        if limit is not None and base + search_end >= limit:
            yield from _scan(buf, begin, limit - base, data_end, search, totals, max_line)
            return
        yield from _scan(buf, begin, search_end, data_end, search, totals, max_line)
        cut = _kept_from(buf, search_end)
        base, begin, carry = base + cut, search_end - cut, buf[cut:]
    if len(carry) > begin:
        end = len(carry) if limit is None else min(len(carry), limit - base)
        yield from _scan(carry, begin, max(end, begin), len(carry), search, totals, max_line)


def _kept_from(buf: bytes, searched: int) -> int:
    """Where the searched lines kept for looking back on start: whole lines, up to PRECEDING bytes."""
    if (first := searched - PRECEDING) <= 0:
        return 0
    return buf.find(b"\n", first, searched) + 1 or searched


class Totals:
    """What a scan has read: bytes, newlines and the last byte (a last line without a newline counts too)."""

    def __init__(self):
        self.bytes, self.newlines, self.last = 0, 0, b""

    def add(self, buf: bytes, begin: int, end: int) -> None:
        if end > begin:
            self.bytes += end - begin
            self.newlines += buf.count(b"\n", begin, end)
            self.last = buf[end - 1 : end]

    def extend(self, after: Totals) -> None:
        """These totals followed by those of the bytes just after (the next range of a file)."""
        self.bytes += after.bytes
        self.newlines += after.newlines
        self.last = after.last or self.last

    @property
    def lines(self) -> int:
        return self.newlines + (1 if self.bytes and self.last != b"\n" else 0)


Span = tuple[int, int, int]  # a needle's first hit on a line, the line's start and end


class Tally:
    """Lines of a frequent needle that were not passed on: how many, and the last few."""

    KEEP = 5

    def __init__(self, words: tuple[bytes, ...], reach: int = 0):
        self.count, self.recent = 0, deque(maxlen=self.KEEP)
        plain = holders(words)
        self.holding = _Reaching(words, reach) if reach else (lambda buf, spans, _end: plain(buf, spans))

    def keep(self, buf: bytes, spans: list[Span], data_end: int) -> list[tuple[int, int, int, tuple]]:
        """The spans whose line (or the `reach` lines after it) holds one of the words, each with the snapshot
        before it; the others are counted and the last few kept. One search for all of a chunk's lines: a log
        holds a Trainer dict for every logging step, and almost none holds a nan."""
        kept, counted = [], 0
        for i in self.holding(buf, spans, data_end):
            self._skip(buf, spans[counted:i])
            kept.append((*spans[i], self.snapshot()))
            counted = i + 1
        self._skip(buf, spans[counted:])
        return kept

    def _skip(self, buf: bytes, spans: list[Span]) -> None:
        self.count += len(spans)
        self.recent.extend(buf[start:stop] for _, start, stop in spans[-self.KEEP :])

    def snapshot(self) -> tuple[int, tuple[bytes, ...]]:
        return self.count, tuple(self.recent)


class Hit(NamedTuple):
    number: int
    line: bytes
    needles: list[bytes]
    following: bytes
    before: dict[bytes, tuple[int, tuple[bytes, ...]]]  # per `only_if` needle: lines skipped, the last few
    preceding: bytes = b""  # what comes before the line in the buffer (up to PRECEDING), for a wrapped line's start


class _Reaching:
    """`holding` for words that may sit up to `reach` lines after the needle's line. The words are rare and the
    needle's lines are not (a loss at every step), so each word found marks the lines that reach it."""

    def __init__(self, words: tuple[bytes, ...], reach: int):
        self.find, self.reach = finder(tuple(w for w in words if b"\n" not in w and b"\r" not in w)), reach

    def __call__(self, buf: bytes, spans: list[Span], data_end: int) -> list[int]:
        if not spans:
            return []
        starts = [start for _, start, _ in spans]
        held: set[int] = set()
        for word_end, _ in self.find(buf, data_end):
            first = word_end  # the start of the `reach` lines before the word's line
            for _ in range(self.reach + 1):
                first = buf.rfind(b"\n", 0, first - 1) + 1 if first > 0 else 0
            held.update(range(bisect.bisect_left(starts, first), bisect.bisect_right(starts, word_end - 1)))
        return sorted(held)


LOOKAHEAD = 3  # lines after a hit that are always there to read (a wrapped message, a pasted entry)
FOLLOWING = 4096  # bytes of them kept
PRECEDING = 1024  # bytes kept of what came before a hit's line (less at the start of a chunk)


def _last_separators(buf: bytes, n: int) -> list[int]:
    """Positions of the last `n` line ends, last first."""
    found, pos = [], len(buf)
    while len(found) < n and (pos := max(buf.rfind(b"\n", 0, pos), buf.rfind(b"\r", 0, pos))) >= 0:
        found.append(pos)
    return found


def _scan(
    buf: bytes, begin: int, search_end: int, data_end: int, search: _Search, totals: Totals, max_line: int
) -> Iterator[Hit]:
    line_no, counted = totals.newlines + 1, begin
    for start, (hit, stop, found, before) in search.lines(buf, begin, search_end, data_end):
        line_no += buf.count(b"\n", counted, start)
        counted = start
        line = buf[max(start, hit - max_line // 2) : min(stop, hit + max_line // 2)]
        yield Hit(
            line_no,
            line,
            [search.needles[i] for i in sorted(found)],
            buf[stop : min(data_end, stop + FOLLOWING)],
            {search.needles[i]: before[i] for i in sorted(before)},
            buf[_kept_from(buf, start) : start],
        )
    totals.add(buf, begin, search_end)


class _Search:
    """One scan's needles, the engine that finds them, and the tallies of its `only_if` ones."""

    def __init__(
        self,
        needles: tuple[bytes, ...],
        tallies: dict[bytes, Tally],
        only_if: dict[bytes, tuple[tuple[bytes, ...], int]],
    ):
        tallies.update({needle: Tally(words, reach) for needle, (words, reach) in only_if.items()})
        self.needles, self.find = needles, finder(needles)
        self.lengths = [len(needle) for needle in needles]
        self.tallies = [tallies.get(needle) for needle in needles]

    def lines(self, buf: bytes, begin: int, end: int, data_end: int) -> list:
        """(line start, [first hit, line end, needle indexes in it, tallies before it]) of each line holding a
        needle, in order."""
        lines: dict[int, list] = {}
        for index, spans in self._spans(buf, begin, end, data_end).items():
            tally = self.tallies[index]
            kept = spans if tally is None else tally.keep(buf, spans, data_end)
            for hit, start, stop, *before in kept:  # a span an `only_if` tally kept carries its snapshot
                if (entry := lines.get(start)) is None:
                    lines[start] = entry = [hit, stop, [], {}]
                entry[0] = min(entry[0], hit)
                entry[2].append(index)
                if before:
                    entry[3][index] = before[0]
        return sorted(lines.items())

    def _spans(self, buf: bytes, begin: int, end: int, data_end: int) -> dict[int, list[Span]]:
        """Per needle index, (first hit, line start, line end) of each line it is found on, in order: its later
        occurrences on a line change nothing. This loop runs for every Trainer dict (~700k per GB)."""
        spans: dict[int, list[Span]] = {}
        done = [0] * len(self.needles)  # per needle: where the last line it was found on ends
        lengths = self.lengths
        start = stop = -1  # the line of the last hit: several needles on one line (a Trainer dict) share it
        for hit_end, index in self.find(buf, end):
            if (hit := hit_end - lengths[index]) >= done[index] and hit >= begin:
                if not start <= hit < stop:
                    start, stop = _line_around(buf, hit, data_end)
                done[index] = stop
                spans.setdefault(index, []).append((hit, start, stop))
        return spans


def _line_around(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Where the line holding `pos` starts and ends (its `\n` or `\r`, else `end`)."""
    if pos == 0 or buf[pos - 1] in _ENDS:  # most Trainer dicts start their line
        start = pos
    else:
        start = buf.rfind(b"\n", 0, pos)
        start = max(start, buf.rfind(b"\r", start + 1, pos)) + 1  # the `\r` search stops at the line start
    stop = buf.find(b"\n", pos, end)
    stop = end if stop < 0 else stop
    carriage = buf.find(b"\r", pos, stop)
    return start, stop if carriage < 0 else carriage


_ENDS = (ord("\n"), ord("\r"))


def decode(hit: Hit) -> Line:
    text, rank = _clean(hit.line)
    if match := _RANK_IN_TEXT.search(text):
        rank = int(match.group(1))
    return Line(hit.number, text, rank, hit.following, hit.before, hit.preceding)


def _clean(raw: bytes) -> tuple[str, int | None]:
    """Decoded text without escape codes and launcher prefixes, and the rank those named."""
    text = _ANSI.sub("", raw.decode("utf-8", "replace")).replace("\x00", "")
    rank = None
    while match := _PREFIX.match(text):
        found = match.group(1) or match.group(2)
        rank = int(found) if found else rank
        text = text[match.end() :]
    return text.strip(), rank
