"""Bad input: one line naming the file, the key and what was expected; the CLI exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(Exception):
    """A file or option the user gave cannot be used. `str()` is the one-line message."""

    def __init__(self, source: str, message: str, key: str | None = None):
        self.source = str(source)
        self.key = key
        self.message = message
        where = f"{self.source}: {key}" if key else self.source
        super().__init__(f"{where}: {message}")


class InputErrors(Exception):
    """Several problems in one input, reported together (one line each)."""

    def __init__(self, errors: list[InputError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_text(path, what: str) -> str:
    """A UTF-8 text file the user named, or one InputError saying why it cannot be read."""
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, f"{what} not found") from None
    except IsADirectoryError:
        raise InputError(path, f"expected a {what} file, got a directory") from None
    except OSError as exc:
        raise InputError(path, f"cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(path, f"expected a UTF-8 {what}, got binary data") from None
