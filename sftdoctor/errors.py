"""Bad input: one line naming the file, the key and what was expected; the CLI exits 2."""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable


class InputError(Exception):
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
    return f"{message} at line {lineno}, column {colno}" if lineno and "line" not in message else message.splitlines()[0]


class InputErrors(Exception):
    """Several problems in one input, reported together (one line each)."""

    def __init__(self, errors: list[InputError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


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


def read_text(path, what: str) -> str:
    """A UTF-8 text file the user named, or one InputError saying why it cannot be read."""
    from pathlib import Path

    with reading(path, what):
        try:
            return Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InputError(path, f"expected a UTF-8 {what}, got binary data") from None


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
