"""The study's journal read before Optuna replays it, when a sweep starts, resumes or is shown (--dry-run).

Optuna replays `study.journal` with no check of what each line holds: a score that is a string, a state that
is not one, a date that does not parse fail later, in the middle of the sweep or when its table is drawn,
with a traceback. Here every line is read once, as Optuna 5's `JournalStorageReplayResult.apply_logs` will
use it (its `_apply_*` methods: the keys each operation reads and what they must be), and the first one that
is not what Optuna wrote is one line naming the file, the line, the key and what was expected.

A last line without its newline is cut short: Optuna ignores it, then its next write lands on the same line and
garbles both. It is checked under the journal's own lock, which every writer holds while it writes, so a line
another worker is writing is not taken for a cut one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, one_line, reading, regular_file

MAX_LINE = 16 << 20  # Optuna writes a line per operation: kilobytes, never megabytes
STATES = range(5)  # optuna.trial.TrialState: RUNNING, COMPLETE, PRUNED, FAIL, WAITING
FINISHED = (1, 2, 3)
ADVICE = "move it away for a new study, or restore it from a copy"


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _time(v) -> bool:
    if not isinstance(v, str):
        return False
    try:
        datetime.fromisoformat(v)
    except ValueError:
        return False
    return True


def _distribution(v) -> bool:
    from optuna.distributions import json_to_distribution

    try:
        json_to_distribution(v)
    except Exception:  # noqa: BLE001 - whatever Optuna's parser raises on it, it is not a distribution
        return False
    return True


# what each key must be: (a test, the words for the message)
INT = (_int, "an integer")
STR = (lambda v: isinstance(v, str), "a string")
NUMBER = (_number, "a number")
NUMBER_OR_NULL = (lambda v: v is None or _number(v), "a number or null")
# sftdoctor's studies have one objective: Optuna's FrozenTrial.value raises on a trial of two values
NUMBERS_OR_NULL = (
    lambda v: v is None or (isinstance(v, list) and len(v) == 1 and _number(v[0])),
    "a list of one number (the objective) or null",
)
OBJECT = (lambda v: isinstance(v, dict), "an object")
ONE = (lambda v: isinstance(v, dict) and len(v) == 1, "an object of one key")
STATE = (lambda v: _int(v) and v in STATES, "a trial state (0 to 4)")
DIRECTIONS = (
    lambda v: isinstance(v, list) and len(v) == 1 and _int(v[0]) and v[0] in (1, 2),
    "a list of one study direction (1 minimize, 2 maximize)",
)
TIME = (_time, "an ISO date and time")
TIME_OR_NULL = (lambda v: v is None or _time(v), "an ISO date and time or null")
DISTRIBUTION = (_distribution, "an Optuna distribution (JSON text)")
DISTRIBUTIONS = (
    lambda v: isinstance(v, dict) and all(_distribution(d) for d in v.values()),
    "an object of Optuna distributions",
)
FINITE = (lambda v: _number(v) and math.isfinite(v), "a finite number")
PARAMS = (lambda v: isinstance(v, dict) and all(FINITE[0](x) for x in v.values()), "an object of finite numbers")
STEPS = (
    lambda v: isinstance(v, dict) and all(_number(x) for x in v.values()) and all(_is_int_text(k) for k in v),
    "an object of step numbers to numbers",
)


def _is_int_text(key) -> bool:
    try:
        int(key)
    except (TypeError, ValueError):
        return False
    return True


# op_code -> (key, what it must be, required); Optuna 5's JournalOperation numbers
OPERATIONS: dict[int, list[tuple[str, tuple[Callable[[Any], bool], str], bool]]] = {
    0: [("study_name", STR, True), ("directions", DIRECTIONS, True)],
    1: [("study_id", INT, True)],
    2: [("study_id", INT, True), ("user_attr", ONE, True)],
    3: [("study_id", INT, True), ("system_attr", ONE, True)],
    4: [
        ("study_id", INT, True),
        ("datetime_start", TIME_OR_NULL, True),
        ("datetime_complete", TIME, False),
        ("state", STATE, False),
        ("value", NUMBER_OR_NULL, False),
        ("values", NUMBERS_OR_NULL, False),
        ("user_attrs", OBJECT, False),
        ("system_attrs", OBJECT, False),
        ("intermediate_values", STEPS, False),
        ("distributions", DISTRIBUTIONS, False),
        ("params", PARAMS, False),
    ],
    5: [
        ("trial_id", INT, True),
        ("param_name", STR, True),
        ("param_value_internal", FINITE, True),
        ("distribution", DISTRIBUTION, True),
    ],
    6: [("trial_id", INT, True), ("state", STATE, True), ("values", NUMBERS_OR_NULL, True)],
    7: [("trial_id", INT, True), ("step", INT, True), ("intermediate_value", NUMBER, True)],
    8: [("trial_id", INT, True), ("user_attr", ONE, True)],
    9: [("trial_id", INT, True), ("system_attr", ONE, True)],
    10: [],
}


def check_journal(journal: Path) -> None:
    """One InputError for the first line of `journal` Optuna could not replay, or that sftdoctor could not read
    back (the study's own record of the sweep). A last line still being written is left alone."""
    regular_file(journal, "study journal")
    with reading(journal, "study journal"), open(journal, "rb") as f:
        number = 0
        while True:
            line = f.readline(MAX_LINE + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE:
                _refuse(journal, number, f"longer than {MAX_LINE >> 20} MiB; expected one Optuna operation a line")
            if not line.endswith(b"\n"):
                return  # being written (or cut short: checked under the lock, see cut_short)
            check_line(journal, number, line)


def check_line(journal: Path, number: int, line: bytes) -> None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError included
        _refuse(journal, number, f"not an Optuna journal ({type(exc).__name__}: {str(exc)[:120]}); {ADVICE}")
    if not isinstance(record, dict) or not _int(record.get("op_code")):
        _refuse(journal, number, f"not an Optuna journal (a record with no op_code); {ADVICE}")
    op = record["op_code"]
    if op not in OPERATIONS:
        _refuse(journal, number, f"not an Optuna journal (op_code {op}; expected 0 to 10); {ADVICE}", "op_code")
    for key, (test, expected), required in [("worker_id", STR, True), *OPERATIONS[op], *_conditional(op, record)]:
        if key not in record:
            if required:
                _refuse(journal, number, f"missing; expected {expected} (op_code {op}); {ADVICE}", key)
        elif not test(record[key]):
            _refuse(journal, number, f"{_shown(record[key])}; expected {expected}; {ADVICE}", key)
    if op == 4:
        _params_known(journal, number, record)
    if op == 2 and "sweep" in record["user_attr"]:
        _sweep_record(journal, number, record["user_attr"]["sweep"])


def _conditional(op: int, record: dict) -> list:
    """The dates Optuna parses only for some states."""
    if op != 6 or not _int(record.get("state")):
        return []
    if record["state"] == 0:
        return [("datetime_start", TIME, True)]
    return [("datetime_complete", TIME, True)] if record["state"] in FINISHED else []


def _params_known(journal: Path, number: int, record: dict) -> None:
    """A trial's parameters each have their distribution, and each value lies in it (Optuna maps it back)."""
    from optuna.distributions import json_to_distribution

    distributions = record.get("distributions") or {}
    for name, value in (record.get("params") or {}).items():
        if name not in distributions:
            _refuse(journal, number, f"no distribution for the parameter {name!r}; {ADVICE}", "params")
        try:
            json_to_distribution(distributions[name]).to_external_repr(value)
        except (IndexError, ValueError, TypeError, OverflowError):
            _refuse(journal, number, f"{value!r} for {name!r} is not a value of its distribution; {ADVICE}", "params")


def _sweep_record(journal: Path, number: int, doc) -> None:
    """The study's identity as sftdoctor wrote it (study.identity): the space it samples is read back from it."""
    from sftdoctor.sweep.config import KINDS

    if not isinstance(doc, dict) or not isinstance(doc.get("space"), list) or not doc["space"]:
        _refuse(
            journal, number, f"{_shown(doc)}; expected the sweep's record (an object with a space)", "user_attr.sweep"
        )
    for i, dim in enumerate(doc["space"]):
        where = f"user_attr.sweep.space[{i}]"
        if not isinstance(dim, dict) or not isinstance(dim.get("name"), str) or "." not in dim["name"]:
            _refuse(
                journal,
                number,
                f"{_shown(dim)}; expected a key of the space (an object with a name section.key)",
                where,
            )
        if dim.get("kind") not in KINDS:
            _refuse(journal, number, f"kind {_shown(dim.get('kind'))}; expected one of {', '.join(KINDS)}", where)
        if dim["kind"] == "choices":
            if not isinstance(dim.get("choices"), list) or not dim["choices"]:
                _refuse(
                    journal, number, f"{_shown(dim.get('choices'))}; expected a list of choices", where + ".choices"
                )
            continue
        for key in ("low", "high", "step"):
            value = dim.get(key)
            if (value is not None or key != "step") and not (_number(value) and math.isfinite(value)):
                _refuse(journal, number, f"{_shown(value)}; expected a finite number", f"{where}.{key}")


def _shown(value) -> str:
    kind = {bool: "bool", str: "string", list: "list", dict: "object", type(None): "null"}.get(type(value))
    if kind is None:
        return repr(value)
    if isinstance(value, (list, dict)):
        text = json.dumps(value)
        return f"a JSON {kind} {one_line(text if len(text) <= 40 else text[:37] + '...')}"
    return f"a JSON {kind}" + (f" {one_line(value[:40])!r}" if isinstance(value, str) else "")


def _refuse(journal: Path, number: int, message: str, key: str | None = None) -> None:
    raise InputError(journal, message, key=f"line {number}" + (f": {key}" if key else ""))


def cut_short(journal: Path) -> None:
    """Under the journal's lock (no writer mid-line): a last line without its newline is a write that never
    ended. Refused: Optuna's next write would land on it and garble both."""
    import os

    size = os.path.getsize(journal)
    if size == 0:
        return
    with reading(journal, "study journal"), open(journal, "rb") as f:
        f.seek(max(0, size - MAX_LINE))
        tail = f.read()
    if tail.endswith(b"\n"):
        return
    number = sum(1 for _ in _lines(journal))
    keep = size - len(tail.rsplit(b"\n", 1)[-1])
    _refuse(
        journal,
        number,
        f"cut short (no newline at its end: a write that never finished); remove it to go on "
        f"(truncate -s {keep} {journal}), or restore the journal from a copy",
    )


def _lines(journal: Path):
    with open(journal, "rb") as f:
        while f.readline(MAX_LINE + 1):
            yield
