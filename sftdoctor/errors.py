"""What sftdoctor refuses or stops for, under one base the CLI catches once: bad input (one line naming the file,
the key and what was expected; exit 2), a cluster's gate that does not let a run start (exit 1), a run a watcher
stopped (the watcher's code)."""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sftdoctor.findings import Finding

EXIT_BAD_INPUT = 2
EXIT_NOT_STARTED = 1  # as a run the checks refuse


class SftdoctorError(Exception):
    """An error told to the user as it is, never as a traceback: the CLI (`cli.Doctor.invoke`) prints `lines()` and
    exits with `exit_code`."""

    exit_code = EXIT_BAD_INPUT
    label = "error"

    def lines(self) -> list[str]:
        return [f"sftdoctor: {self.label}: {line}" for line in str(self).splitlines()]


class InputError(SftdoctorError):
    """A file or option the user gave cannot be used. `str()` is the one-line message."""

    def __init__(self, source: str, message: str, key: str | None = None):
        self.source = one_line(str(source))
        self.key = one_line(key) if key else key
        self.message = one_line(message)
        where = f"{self.source}: {self.key}" if self.key else self.source
        super().__init__(f"{where}: {self.message}")


def one_line(text: str) -> str:
    """Line breaks and other unprintable characters of a name or value the user wrote, escaped: an error
    stays one line that names its file (a key "a\nb" or a path with U+2028 in it)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def parse_problem(exc: Exception) -> str:
    """What a JSON or TOML parser's exception means (every one of them is a ValueError or a RecursionError)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    lineno, colno = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    message = getattr(exc, "msg", None) or str(exc)
    if "integer string conversion" in message:
        return "a number of more than 4300 digits"
    return (
        f"{message} at line {lineno}, column {colno}" if lineno and "line" not in message else message.splitlines()[0]
    )


class _NonFinite:
    """Where json.loads met NaN, Infinity, -Infinity (or a float beyond the double range, 1e400): kept as written
    until its key is found."""

    def __init__(self, literal: str):
        self.literal = literal


def loads_finite(text: str, source, object_pairs_hook=None):
    """JSON text of a file the user gave (a DeepSpeed JSON, a model's config.json, a facts snapshot). Python's
    json reads NaN and Infinity, which strict JSON has no word for, and the libraries then train with them: each
    is refused as an InputError naming its key path (`optimizer.params.lr`). A parse error stays the ValueError
    (or RecursionError) json raises, for the caller to word."""
    import json
    import math

    met: list[_NonFinite] = []

    def constant(literal: str) -> _NonFinite:
        met.append(_NonFinite(literal))
        return met[-1]

    def number(literal: str):
        value = float(literal)
        return value if math.isfinite(value) else constant(literal)

    data = json.loads(text, parse_constant=constant, parse_float=number, object_pairs_hook=object_pairs_hook)
    if met:
        key, literal = _non_finite_at(data)
        raise InputError(source, f"expected a finite number, got {literal}", key=key or "(the whole document)")
    return data


def _non_finite_at(data) -> tuple[str, str]:
    """(key path, literal) of the first non-finite number in parsed JSON, walked without recursion."""
    stack = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _NonFinite):
            return path, value.literal
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return "", "a non-finite number"


class InputErrors(SftdoctorError):
    """Several problems in one input, reported together (one line each)."""

    def __init__(self, errors: list[InputError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class GateError(SftdoctorError):
    """Not every node reached a cluster's gate in time (the message says which did): no node starts."""

    exit_code = EXIT_NOT_STARTED
    label = "not starting"


class RunStopped(SftdoctorError):
    """A watcher stopped the run (a non-finite loss): every rank leaves training with the watcher's exit code."""

    label = "stopped"

    def __init__(self, code: int, finding: Finding):
        super().__init__(finding.title)
        self.exit_code, self.finding = code, finding

    @property
    def code(self) -> int:
        return self.exit_code


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@contextlib.contextmanager
def reading(path, what: str):
    """An OSError while opening or reading a file the user named, as one InputError saying why."""
    try:
        yield
    except FileNotFoundError:
        raise InputError(path, f"{what} not found") from None
    except IsADirectoryError:
        raise InputError(path, f"expected a {what} file, got a directory") from None
    except OSError as exc:
        raise InputError(path, f"cannot read {what}: {exc.strerror or exc}") from None


NOT_REGULAR = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}
READ_LIMIT = 1 << 30  # no file sftdoctor reads whole (a config, a JSON record, a log's index) is a GiB


def regular_file(path, what: str) -> None:
    """InputError unless `path` is a regular file (or a directory, which the caller's open refuses in its words):
    a FIFO blocks the reader forever and /dev/zero never ends, so neither is ever opened."""
    with reading(path, what):
        mode = os.stat(path).st_mode
    kind = NOT_REGULAR.get(stat.S_IFMT(mode))
    if kind:
        raise InputError(path, f"expected a {what} file, got {kind}")


def not_a_file(path) -> str | None:
    """Why `path` cannot be read as a file (a FIFO, a device, a dangling or looping symlink, a read error such
    as EIO), or None when it can: stat, then one byte read. For the files of a folder the user named, which a
    child process (transformers, lm-eval) would otherwise block on or read without end."""
    try:
        kind = NOT_REGULAR.get(stat.S_IFMT(os.stat(path).st_mode))
        if kind:
            return kind
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def read_bytes(path, what: str, limit: int = READ_LIMIT) -> bytes:
    """A file the user named, whole, or one InputError saying why not: missing, a folder, a FIFO or device,
    unreadable, or over `limit` bytes."""
    regular_file(path, what)
    with reading(path, what), open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputError(path, f"expected a {what} of at most {limit:,} bytes, got more")
    return data


def read_text(path, what: str, limit: int = READ_LIMIT) -> str:
    """A UTF-8 text file the user named, or one InputError saying why it cannot be read."""
    try:
        text = read_bytes(path, what, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(path, f"expected a UTF-8 {what}, got binary data") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as text mode reads them


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while a command wrote its output: what it staged was removed on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def interruptible():
    """SIGTERM (a scheduler, `kill`) raises like Ctrl-C inside the block, so that the block's cleanup runs
    (staged files removed, sandboxes killed) instead of a sudden death. Main thread only: elsewhere no
    handler can be set, and the block runs as it is."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Interrupted(signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except KeyboardInterrupt as exc:
        raise exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT) from None
    finally:
        signal.signal(signal.SIGTERM, before)
