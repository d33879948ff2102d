"""A large log file on several cores: byte ranges cut at line starts, one process each, and the
hits merged back in file order (line numbers and `only_if` tallies carried from range to range).

One core finds the needles at ~100 MB/s (one `bytes.find` pass per needle); ranges scale that with
the cores a training node has. Each range is read and searched in bounded memory, and at most
two ranges per process are in flight, so memory stays bounded for any file size.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator, NamedTuple

from sftdoctor.triage.scan import CHUNK, FOLLOWING, MAX_LINE, Hit, Tally, candidate_lines

RANGE = 32 << 20
PARALLEL_MIN = 128 << 20  # below this, starting processes costs more than it saves


class RangeResult(NamedTuple):
    hits: list[Hit]
    newlines: int
    size: int
    last: bytes
    tallies: dict[bytes, tuple[int, tuple[bytes, ...]]]


def line_start(handle, offset: int, max_line: int = MAX_LINE) -> int:
    """The first line start at or after `offset` (the same answer for both ranges that meet there)."""
    if offset == 0:
        return 0
    handle.seek(offset - 1)
    data = handle.read(4 * max_line + 1)
    ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    return offset + min(ends) if ends else offset  # an enormous line: cut it here


def scan_range(path: str, start: int, end: int, needles: list[bytes], only_if: dict[bytes, tuple[bytes, ...]]
               ) -> RangeResult:
    with open(path, "rb") as handle:
        first, last = line_start(handle, start), line_start(handle, end)
        handle.seek(first)

        def chunks() -> Iterator[bytes]:
            left = last - first
            while left > 0 and (chunk := handle.read(min(CHUNK, left))):
                left -= len(chunk)
                yield chunk
            yield handle.read(FOLLOWING)  # what follows the range's last lines

        tallies: dict[bytes, Tally] = {}
        hits = list(candidate_lines(chunks(), needles, only_if=only_if, limit=last - first, tallies=tallies))
        handle.seek(first)
        newlines, left, tail = 0, last - first, b""
        while left > 0 and (chunk := handle.read(min(CHUNK, left))):
            newlines += chunk.count(b"\n")
            left -= len(chunk)
            tail = chunk[-1:]
    return RangeResult(hits, newlines, last - first, tail, {n: t.snapshot() for n, t in tallies.items()})


class ParallelScan:
    """Iterates like `candidate_lines` over a whole file; `bytes`, `lines` and `last` when done."""

    def __init__(self, path: str, needles, only_if, jobs: int, range_size: int = RANGE):
        self.path, self.needles, self.only_if = path, sorted(set(needles)), dict(only_if)
        self.jobs, self.range_size = jobs, range_size
        self.bytes = self.lines = 0
        self.last = b""

    def __iter__(self) -> Iterator[Hit]:
        size = os.path.getsize(self.path)
        starts = iter(range(0, size, self.range_size))
        skipped = {n: (0, ()) for n in self.only_if}
        # spawn, not fork: the caller may hold threads or locks, and the workers import little
        with ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending = deque()

            def submit():
                if (start := next(starts, None)) is not None:
                    end = min(start + self.range_size, size)
                    pending.append(pool.submit(scan_range, self.path, start, end, self.needles, self.only_if))

            for _ in range(2 * self.jobs):
                submit()
            while pending:
                result = pending.popleft().result()
                submit()
                for hit in result.hits:
                    yield hit._replace(number=hit.number + self.lines,
                                       before={n: _carry(skipped[n], b) for n, b in hit.before.items()})
                for needle, tally in result.tallies.items():
                    skipped[needle] = _carry(skipped[needle], tally)
                self.lines += result.newlines
                self.bytes += result.size
                self.last = result.last or self.last


def _carry(before: tuple[int, tuple[bytes, ...]], local: tuple[int, tuple[bytes, ...]]) -> tuple[int, tuple[bytes, ...]]:
    """A range's own tally, continued from the ranges before it."""
    return before[0] + local[0], (before[1] + local[1])[-Tally.KEEP:]


def eligible(stream, jobs: int) -> str | None:
    """The path of `stream` when it is a regular file big enough to split, else None."""
    name = getattr(stream, "name", None)
    if jobs < 2 or not isinstance(name, str) or not os.path.isfile(name):
        return None
    return name if os.path.getsize(name) >= PARALLEL_MIN else None
