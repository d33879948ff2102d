"""The vocabulary of hostile inputs the fuzzers draw from (issue 40's classes of misbehaviour), shared so that
every command is tried with the same words:

- non-finite numbers where numbers go (NaN, ±inf, as floats and as the literals Python's json accepts);
- what is absent: a section, a key, a file, a rank;
- wrong types: a string, a list, an object, null or a bool where another JSON type goes;
- unparseable versions;
- files that are not files: a FIFO (blocks a reader forever), /dev/zero (never ends), a file that cannot be
  read even by root (/proc/self/mem gives EIO), a dangling symlink, a folder, empty, binary;
- two inputs with one name (same basename in different folders), and an output that names an input.

`no_hang(seconds)` turns a blocked read into a test failure instead of a stuck suite."""

from __future__ import annotations

import contextlib
import math
import os
import signal
from pathlib import Path

from hypothesis import strategies as st

NON_FINITE = [math.nan, math.inf, -math.inf]
OPTION_TEXT = ["", " ", "0", "-1", "1", "2"]  # empty, blank, zero, negative, small: an option's first suspects
NON_FINITE_JSON = ["NaN", "Infinity", "-Infinity"]  # json.loads reads these; strict JSON has no such literal
NON_FINITE_TEXT = ["nan", "inf", "-inf", "NaN", "Infinity", "-Infinity", "1e400", "-1e400"]
EXTREME = [1e308, -1e308, 5e-324, 10**400]  # finite, but near the float's limits (10**400: json reads an int)
# version strings a hand-written parser trips on: most are no PEP 440 version; "v0.14.0" and "0.14.0 " are (as 0.14.0)
UNPARSEABLE_VERSIONS = ["banana", "v0.14.0", "", " ", "0.14.0 ", "1..2", "1.2.3-", "latest", "☃", "0.14.0;rm"]

SPECIAL = ["fifo", "dev-zero", "dev-null", "unreadable", "dangling", "folder", "empty", "binary", "loop"]


def special_file(path: Path, kind: str) -> Path:
    """Put a file that is not a (good) file at `path` and return it; the caller's reader must refuse it in one
    line (exit 2) or judge without it, never block, eat memory or traceback. Clean up with `remove`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind in ("dev-zero", "dev-null", "unreadable", "dangling"):
        target = {
            "dev-zero": "/dev/zero",
            "dev-null": "/dev/null",
            "unreadable": "/proc/self/mem",
            "dangling": str(path.parent / "no-such-target"),
        }[kind]
        path.symlink_to(target)
    elif kind == "loop":
        path.symlink_to(path.name)  # a symlink to itself: ELOOP
    elif kind == "folder":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 8)
    else:
        raise ValueError(kind)
    return path


def remove(path: Path) -> None:
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def wrong_type(value) -> st.SearchStrategy:
    """Values of another JSON type than `value`'s (a bool is not a number here, as a user means neither)."""
    kinds = {
        "str": st.sampled_from(["", "x", "1", "nan", "true"]),
        "number": st.sampled_from([0, -1, 1.5, 10**30]),
        "bool": st.booleans(),
        "null": st.none(),
        "list": st.sampled_from([[], [1], ["a", None]]),
        "object": st.sampled_from([{}, {"a": 1}]),
    }
    mine = (
        "bool"
        if isinstance(value, bool)
        else "number"
        if isinstance(value, (int, float))
        else "str"
        if isinstance(value, str)
        else "null"
        if value is None
        else "list"
        if isinstance(value, list)
        else "object"
    )
    return st.one_of(*(s for k, s in kinds.items() if k != mine))


class Hung(BaseException):  # BaseException: an `except Exception` in the code under test cannot swallow it
    pass


@contextlib.contextmanager
def no_hang(seconds: float = 20.0):
    """Fail (raise Hung) if the block runs longer than `seconds`: a read of a FIFO blocks forever otherwise.
    Main thread only (SIGALRM)."""

    def fire(signum, frame):
        raise Hung(f"still running after {seconds} s: blocked on a read?")

    before = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


@contextlib.contextmanager
def fed_fifo(path: Path, data: bytes):
    """A writer that feeds `data` once into the FIFO at `path` when a reader opens it (as `cmd <(producer)` or a
    `mkfifo` pipeline do), then closes: a reader that reads it once gets `data`; one that opens it again blocks
    (caught by `no_hang`). On the way out a writer still waiting is released."""
    import threading

    def write():
        try:
            with open(path, "wb") as handle:  # blocks until a reader opens the FIFO
                handle.write(data)
        except OSError:  # the reader closed early (EPIPE): what it read is its business
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield path
    finally:
        if writer.is_alive():  # nobody read it: open the reading end ourselves so the writer finishes
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            writer.join(5)
            os.close(fd)
