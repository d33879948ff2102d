"""A large log file on several cores: byte ranges cut at line starts, one process each, and the
hits merged back in file order (line numbers and `only_if` tallies carried from range to range).

One core finds every needle in one pass (needles.py) but turns each line that holds one into a hit
in Python (a Trainer dict at every logging step); ranges scale that with the cores a training node
has. Each range is read and searched in bounded memory, and at most two ranges per process are in
flight, so memory stays bounded for any file size.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

from sftdoctor.triage.scan import CHUNK, FOLLOWING, MAX_LINE, Hit, Tally, Totals, candidate_lines

RANGE = 32 << 20
PARALLEL_MIN = 128 << 20  # below this, starting processes costs more than it saves


class RangeResult(NamedTuple):
    hits: list[Hit]
    totals: Totals
    tallies: dict[bytes, tuple[int, tuple[bytes, ...]]]


def line_start(handle, offset: int, max_line: int = MAX_LINE) -> int:
    """The first line start at or after `offset` (the same answer for both ranges that meet there)."""
    if offset == 0:
        return 0
    handle.seek(offset - 1)
    data = handle.read(4 * max_line + 1)
    ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    return offset + min(ends) if ends else offset  # an enormous line: cut it here


def scan_range(
    path: str, start: int, end: int, needles: list[bytes], only_if: dict[bytes, tuple[tuple[bytes, ...], int]]
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
        totals = Totals()
        hits = list(
            candidate_lines(chunks(), needles, only_if=only_if, limit=last - first, tallies=tallies, totals=totals)
        )
    return RangeResult(hits, totals, {n: t.snapshot() for n, t in tallies.items()})


class ParallelScan:
    """Iterates like `candidate_lines` over a whole file; `totals` when done."""

    def __init__(self, path: str, needles, only_if, jobs: int, range_size: int = RANGE):
        self.path, self.needles, self.only_if = path, sorted(set(needles)), dict(only_if)
        self.jobs, self.range_size = jobs, range_size
        self.totals = Totals()

    def __iter__(self) -> Iterator[Hit]:
        size = os.path.getsize(self.path)
        ranges = enumerate(range(0, size, self.range_size))
        skipped = {n: (0, ()) for n in self.only_if}
        # spawn, not fork: the caller may hold threads or locks, and the workers import little.
        # This process scans every `jobs`-th range itself, the first one while the workers start: one
        # process (~25 MB) fewer.
        with ProcessPoolExecutor(max(self.jobs - 1, 1), mp_context=multiprocessing.get_context("spawn")) as pool:
            pending = deque()

            def submit():
                if (job := next(ranges, None)) is not None:
                    args = (self.path, job[1], min(job[1] + self.range_size, size), self.needles, self.only_if)
                    pending.append(args if job[0] % self.jobs == 0 else pool.submit(scan_range, *args))

            for _ in range(2 * self.jobs):
                submit()
            while pending:
                job = pending.popleft()
                submit()  # before a range of this process's own, so that the workers have theirs
                result = scan_range(*job) if isinstance(job, tuple) else job.result()
                for hit in result.hits:
                    yield hit._replace(
                        number=hit.number + self.totals.newlines,
                        before={n: _carry(skipped[n], b) for n, b in hit.before.items()},
                    )
                for needle, tally in result.tallies.items():
                    skipped[needle] = _carry(skipped[needle], tally)
                self.totals.extend(result.totals)


def _carry(
    before: tuple[int, tuple[bytes, ...]], local: tuple[int, tuple[bytes, ...]]
) -> tuple[int, tuple[bytes, ...]]:
    """A range's own tally, continued from the ranges before it."""
    return before[0] + local[0], (before[1] + local[1])[-Tally.KEEP :]


def eligible(stream, jobs: int) -> str | None:
    """The path of `stream` when it is a regular file big enough to split, else None."""
    name = getattr(stream, "name", None)
    if jobs < 2 or not isinstance(name, str) or not os.path.isfile(name):
        return None
    return name if os.path.getsize(name) >= PARALLEL_MIN else None
