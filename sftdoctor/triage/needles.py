"""Where the signatures' needles occur in a buffer: one pass for all of them, whatever their number.

Hyperscan compiles the needles into one SIMD literal matcher (GB/s for hundreds of literals). Where its
import fails (no wheel for the platform), each needle gets a `bytes.find` pass instead: the same
occurrences, at a cost that grows with the number of needles. The `only_if` words are looked for the
same way in the lines of their needle.
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
from collections.abc import Callable
from functools import lru_cache

try:
    import hyperscan
except ImportError:  # the `find` engine below: same occurrences, slower (tests hide the module to check it)
    hyperscan = None

ENGINE = "hyperscan" if hyperscan is not None else "find"  # what `finder` and `holders` use (tests try both)

Occurrences = Callable[[bytes, int], list[tuple[int, int]]]


def finder(needles: tuple[bytes, ...]) -> Occurrences:
    """`find(buf, end)`: every occurrence of every needle that ends at or before `end`, overlapping ones
    too, as (end offset, needle index), sorted."""
    return _compiled(needles, ENGINE)


@lru_cache(maxsize=8)
def _compiled(needles: tuple[bytes, ...], engine: str) -> Occurrences:
    if not all(needles):
        raise ValueError("an empty needle would be found everywhere")
    if engine == "hyperscan" and needles:
        return _Hyperscan(needles)
    return _Find(needles)


def holders(words: tuple[bytes, ...]) -> Callable[[bytes, list[tuple[int, int, int]]], list[int]]:
    """`holding(buf, spans)`: the indexes, in order, of the (hit, start, end) spans whose line
    `buf[start:end]` holds one of `words` (`only_if`)."""
    return _holders(tuple(words), ENGINE)


@lru_cache(maxsize=8)
def _holders(words: tuple[bytes, ...], engine: str) -> Callable[[bytes, list[tuple[int, int, int]]], list[int]]:
    if b"" in words:  # in every line
        return lambda buf, spans: list(range(len(spans)))
    words = tuple(word for word in words if b"\n" not in word and b"\r" not in word)  # in no line
    if not words:
        return lambda buf, spans: []
    if engine == "hyperscan":
        return _HyperscanHolders(words)
    search = re.compile(b"|".join(map(re.escape, words))).search
    return lambda buf, spans: [i for i, (_, start, end) in enumerate(spans) if search(buf, start, end)]


class _Hyperscan:
    def __init__(self, needles: tuple[bytes, ...]):
        self.db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        # every byte escaped: the binding passes patterns as C strings, so a NUL would end a literal one
        expressions = [b"".join(b"\\x%02x" % byte for byte in needle) for needle in needles]
        self.db.compile(expressions=expressions, ids=list(range(len(needles))), elements=len(needles), flags=0)
        self.lock = threading.Lock()  # the database's one scratch space serves one scan at a time

    def __call__(self, buf: bytes, end: int) -> list[tuple[int, int]]:
        found: list[tuple[int, int]] = []
        add = found.append

        def on_match(index, _start, stop, _flags, _context):
            add((stop, index))  # returns None: a true value would stop the scan

        with self.lock:
            self.db.scan(memoryview(buf)[:end], match_event_handler=on_match)
        found.sort()  # per pattern, hyperscan does not promise end-offset order
        return found


class _HyperscanHolders:
    """One scan for all the lines, joined by newlines (no word holds one, so none is found across two)."""

    def __init__(self, words: tuple[bytes, ...]):
        self.find = _Hyperscan(words)

    def __call__(self, buf: bytes, spans: list[tuple[int, int, int]]) -> list[int]:
        joined = b"\n".join([buf[start:end] for _, start, end in spans])
        if not (found := self.find(joined, len(joined))):
            return []
        ends = list(itertools.accumulate(end - start + 1 for _, start, end in spans))  # just past each line's newline
        return sorted({bisect.bisect_left(ends, stop) for stop, _ in found})


class _Find:
    def __init__(self, needles: tuple[bytes, ...]):
        self.needles = needles

    def __call__(self, buf: bytes, end: int) -> list[tuple[int, int]]:
        found = []
        for index, needle in enumerate(self.needles):
            hit = buf.find(needle, 0, end)
            while hit >= 0:
                found.append((hit + len(needle), index))
                hit = buf.find(needle, hit + 1, end)
        found.sort()
        return found
