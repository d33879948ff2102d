"""Stream a log and hand over only the lines that may matter.

A log can be many GB with one rank's tqdm bar redrawn a million times on one "line", so it is
read in fixed chunks: each chunk is searched for the signatures' literal needles at C speed,
and only the lines around a hit are decoded. Memory stays at about two chunks whatever the
file; a line longer than `MAX_LINE` is cut into pieces (no signature needs more).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator, NamedTuple

CHUNK = 256 << 10  # a chunk stays in the L2 cache across the ~45 needle passes: ~15% faster than 1 MiB
MAX_LINE = 64 << 10

# `\r` ends a line too: tqdm redraws with it, and the message after a bar starts a new "line".
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Prefixes that launchers put before a rank's lines, possibly nested (`0: [rank0]:[E ...] ...`):
# torch >= 2.2 `[rank3]:`, torchrun --tee / accelerate `[default3]:`, srun -l `3: `; a bare `[12345] `
# (a pid or a line number some tools add) is dropped.
_PREFIX = re.compile(r"\s*(?:\[(?:rank|default)(\d+)\]:|(\d{1,5}): |\[\d+\] )")
# torch's own messages: `[Rank 3]`, `[PG 1 Rank 3]` (2.3), `[PG ID 0 PG GUID 0(default_pg) Rank 3]` (>= 2.4).
_RANK_IN_TEXT = re.compile(r"\[(?:PG (?:ID )?\d+ (?:PG GUID [^\]]*? )?)?[Rr]ank (\d+)\]")


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, counted in `\n`
    text: str  # decoded, escape codes and launcher prefixes removed
    rank: int | None
    following: bytes = b""  # what comes after the line, for messages that wrap
    before: tuple[int, tuple[bytes, ...]] | None = None  # for an `only_if` needle: lines skipped, the last few

    def joined(self, lines: int = 2) -> str:
        """The line and the next `lines` (at most `LOOKAHEAD`) non-blank lines, cleaned, joined by spaces."""
        after = [part for part in self.following.replace(b"\r", b"\n").split(b"\n") if part.strip()][:lines]
        return " ".join([self.text, *(_clean(part)[0] for part in after)])


def read_chunks(stream: BinaryIO, size: int = CHUNK) -> Iterator[bytes]:
    while chunk := stream.read(size):
        yield chunk


def candidate_lines(chunks: Iterable[bytes], needles: Iterable[bytes], max_line: int = MAX_LINE,
                    only_if: dict[bytes, tuple[bytes, ...]] | None = None, limit: int | None = None,
                    tallies: dict[bytes, Tally] | None = None) -> Iterator[Hit]:
    """Every line that holds one of `needles`, in order.

    A needle in `only_if` is frequent and mostly dull (a Trainer dict at every logging step): its
    line is passed on only if it also holds one of the words given; the others are counted, and the
    last few kept, so the line passed on can say what came before it.

    The text after a line (up to `LOOKAHEAD` more lines) is for messages that wrap onto the next
    line, so the last lines of each chunk wait for the next one before they are searched.

    Lines that start at or after byte `limit` are only read as the text after the ones before
    (a range of a file scanned in parallel). `tallies` collects the `only_if` counts."""
    needles = sorted(set(needles))
    if tallies is None:
        tallies = {}
    tallies.update({needle: Tally(words) for needle, words in (only_if or {}).items()})
    carry, line_no, base = b"", 1, 0
    for chunk in chunks:
        buf = carry + chunk if carry else chunk
        seps = _last_separators(buf, 2 * LOOKAHEAD + 1)
        data_end = seps[0] + 1 if seps else 0
        search_end = seps[-1] + 1 if len(seps) > 2 * LOOKAHEAD else 0
        if search_end == 0 and len(buf) > 4 * max_line:
            search_end = data_end = data_end or len(buf)  # enormous lines: take them in pieces
        if limit is not None and base + search_end >= limit:
            yield from _scan(buf, limit - base, data_end, needles, tallies, line_no, max_line)
            return
        yield from _scan(buf, search_end, data_end, needles, tallies, line_no, max_line)
        line_no += buf.count(b"\n", 0, search_end)
        base += search_end
        carry = buf[search_end:]
    if carry:
        end = len(carry) if limit is None else min(len(carry), limit - base)
        yield from _scan(carry, end, len(carry), needles, tallies, line_no, max_line)


class Tally:
    """Lines of a frequent needle that were not passed on: how many, and the last few."""

    KEEP = 5

    def __init__(self, words: tuple[bytes, ...]):
        self.words, self.count, self.recent = words, 0, deque(maxlen=self.KEEP)

    def wanted(self, buf: bytes, start: int, stop: int) -> bool:
        line = buf[start:stop]
        if any(word in line for word in self.words):
            return True
        self.count += 1
        self.recent.append(line)
        return False

    def snapshot(self) -> tuple[int, tuple[bytes, ...]]:
        return self.count, tuple(self.recent)


class Hit(NamedTuple):
    number: int
    line: bytes
    needles: list[bytes]
    following: bytes
    before: dict[bytes, tuple[int, tuple[bytes, ...]]]  # per `only_if` needle: lines skipped, the last few


LOOKAHEAD = 2  # lines after a hit that a wrapped message may run on to
FOLLOWING = 4096  # bytes of them kept


def _last_separators(buf: bytes, n: int) -> list[int]:
    """Positions of the last `n` line ends, last first."""
    found, pos = [], len(buf)
    while len(found) < n and (pos := max(buf.rfind(b"\n", 0, pos), buf.rfind(b"\r", 0, pos))) >= 0:
        found.append(pos)
    return found


def _scan(buf: bytes, search_end: int, data_end: int, needles: list[bytes], tallies: dict[bytes, Tally],
          line_no: int, max_line: int) -> Iterator[Hit]:
    counted = 0
    for start, (hit, stop, found, before) in _hit_lines(buf, search_end, data_end, needles, tallies):
        line_no += buf.count(b"\n", counted, start)
        counted = start
        line = buf[max(start, hit - max_line // 2):min(stop, hit + max_line // 2)]
        yield Hit(line_no, line, found, buf[stop:min(data_end, stop + FOLLOWING)], before)


def _hit_lines(buf: bytes, end: int, data_end: int, needles: list[bytes], tallies: dict[bytes, Tally]) -> list:
    """(line start, [first hit, line end, needles in it, tallies before it]) of each line holding a
    needle, in order.

    One `bytes.find` pass per needle (C speed, GB/s) beats one alternation regex over every
    position by ~2x for a few dozen needles."""
    lines: dict[int, list] = {}
    for needle in needles:
        tally = tallies.get(needle)
        hit = buf.find(needle, 0, end)
        while hit >= 0:
            start = max(buf.rfind(b"\n", 0, hit), buf.rfind(b"\r", 0, hit)) + 1
            stop = _line_end(buf, hit, data_end)
            if tally is not None and not tally.wanted(buf, start, stop):
                hit = buf.find(needle, stop, end)
                continue
            if (entry := lines.get(start)) is None:
                lines[start] = entry = [hit, stop, [], {}]
            entry[0] = min(entry[0], hit)
            if not entry[2] or entry[2][-1] is not needle:
                entry[2].append(needle)
                if tally is not None:
                    entry[3][needle] = tally.snapshot()
            hit = buf.find(needle, hit + len(needle), end)
    return sorted(lines.items())


def _line_end(buf: bytes, pos: int, end: int) -> int:
    ends = [i for i in (buf.find(b"\n", pos, end), buf.find(b"\r", pos, end)) if i >= 0]
    return min(ends) if ends else end


def decode(hit: Hit) -> Line:
    text, rank = _clean(hit.line)
    if match := _RANK_IN_TEXT.search(text):
        rank = int(match.group(1))
    return Line(hit.number, text, rank, hit.following, next(iter(hit.before.values()), None))


def _clean(raw: bytes) -> tuple[str, int | None]:
    """Decoded text without escape codes and launcher prefixes, and the rank those named."""
    text = _ANSI.sub("", raw.decode("utf-8", "replace")).replace("\x00", "")
    rank = None
    while match := _PREFIX.match(text):
        found = match.group(1) or match.group(2)
        rank = int(found) if found else rank
        text = text[match.end():]
    return text.strip(), rank
