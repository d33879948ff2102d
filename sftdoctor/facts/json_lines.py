"""One line of a JSON Lines file (a data file, a run's records, a code task's problems), read as bad input when
it is not JSON: each reader says, in its own words, what it expected there."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, parse_problem


def json_line(line: str, source: Path | str, expected: Callable[[str], str], key: str | None = None) -> Any:
    """The JSON value of `line`; bad JSON raises InputError(source, expected(the parser's complaint), key)."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise InputError(str(source), expected(parse_problem(exc)), key=key) from None
