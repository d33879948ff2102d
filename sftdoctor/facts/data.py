"""The run's data files, every row read and checked before launch, without the datasets library.

Formats, as TRL's SFTTrainer takes them (`messages`, `prompt_completion`, `text`) and as most public SFT
data comes (`sharegpt`: `conversations` of `from`/`value` turns; `alpaca`: `instruction`, `input`,
`output`, optional `system`), which the recipe maps to `messages` as LLaMA-Factory and axolotl do. A row
that does not fit its file's format is bad input naming the file, the line (JSON Lines) or row, and what
is wrong; nothing is launched. JSON Lines are streamed line by line, Parquet batch by batch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, parse_problem
from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.json_lines import json_line
from sftdoctor.facts.packages import module_file

# format -> the keys that identify it (in this order of detection) and the shape the trainer gets
FORMATS = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "prompt_completion": ("prompt", "completion"),
    "alpaca": ("instruction", "output"),
    "text": ("text",),
}
SHAPE = {
    "messages": "messages",
    "sharegpt": "messages",
    "alpaca": "messages",
    "prompt_completion": "prompt_completion",
    "text": "text",
}
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function_call": "assistant",
    "observation": "tool",
}


def format_of(row: Any) -> str | None:
    if not isinstance(row, dict):
        return None
    return next((name for name, keys in FORMATS.items() if all(k in row for k in keys)), None)


def _messages_problem(turns: Any, role_key: str, content_key: str, roles) -> str | None:
    if not isinstance(turns, list) or not turns:
        return f"expected a non-empty list of turns, got {type(turns).__name__}"
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return f"turn {i} is {type(turn).__name__}, expected an object with {role_key!r} and {content_key!r}"
        if turn.get(role_key) not in roles:
            return f"turn {i}: {role_key} is {turn.get(role_key)!r}, expected one of {', '.join(roles)}"
        if not isinstance(turn.get(content_key), str):
            return f"turn {i}: {content_key} is {type(turn.get(content_key)).__name__}, expected a string"
    return None


def row_problem(row: Any, fmt: str) -> str | None:
    """What is wrong with one row of format `fmt`, or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    if fmt == "messages":
        return _messages_problem(row.get("messages"), "role", "content", ROLES)
    if fmt == "sharegpt":
        return _messages_problem(row.get("conversations"), "from", "value", tuple(SHAREGPT_ROLES))
    if fmt == "prompt_completion":
        for key in ("prompt", "completion"):
            value = row.get(key)
            if not isinstance(value, str) and _messages_problem(value, "role", "content", ROLES):
                return f"{key} is {type(value).__name__}, expected a string or a list of messages"
        return None
    keys = ("instruction", "output") if fmt == "alpaca" else ("text",)
    for key in keys + tuple(k for k in ("input", "system") if fmt == "alpaca" and row.get(k) is not None):
        if not isinstance(row.get(key), str):
            return f"{key} is {type(row.get(key)).__name__}, expected a string"
    if fmt == "text" and not row["text"].strip():
        return "text is empty"
    return None


def to_messages(row: dict[str, Any], fmt: str) -> list[dict[str, str]]:
    """A ShareGPT or Alpaca row as chat messages (what the recipe trains on)."""
    if fmt == "sharegpt":
        return [{"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in row["conversations"]]
    prompt = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
    system = [{"role": "system", "content": row["system"]}] if row.get("system") else []
    return system + [{"role": "user", "content": prompt}, {"role": "assistant", "content": row["output"]}]


def rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) for every row of a JSON Lines, JSON array or Parquet file; "line N" or "row N"."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet_rows(path)
        return
    if suffix == ".arrow":  # a shard of the datasets cache (a hub id's rows, data_source)
        yield from _arrow_rows(path)
        return
    try:
        with open(path, encoding="utf-8") as handle:
            first = handle.read(1)
            while first.isspace():
                first = handle.read(1)
            handle.seek(0)
            if first == "[":  # a JSON array, whatever the suffix: datasets' json builder reads it so
                try:
                    data = json.load(handle)
                except (ValueError, RecursionError) as exc:
                    raise InputError(path, f"not valid JSON ({parse_problem(exc)})") from None
                for i, row in enumerate(data, start=1):
                    _check_unicode(row, path, f"row {i}")
                    yield f"row {i}", row
                return
            whole = _one_object(handle, path) if first == "{" else None
            if whole is not None:
                _check_unicode(whole, path, ONE_OBJECT)
                yield ONE_OBJECT, whole
                return
            handle.seek(0)
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                row = json_line(
                    line,
                    path,
                    lambda why, number=number: (
                        f"line {number}: not a JSON object ({why}); expected one JSON object a line"
                    ),
                )
                if "\\ud" in line.lower():  # an escaped UTF-16 surrogate: valid JSON, but paired or not?
                    _check_unicode(row, path, f"line {number}")
                yield f"line {number}", row
    except UnicodeDecodeError:
        raise InputError(path, "expected UTF-8 JSON Lines, JSON or Parquet data") from None
    except OSError as exc:
        raise InputError(path, f"cannot read the data file: {exc.strerror or exc}") from None


ONE_OBJECT = "its one JSON object"  # where a file that is one object spread over lines is read as one row
ONE_OBJECT_BYTES = 256 << 20  # a larger file whose first line is not a whole object is not read whole to find out


def _one_object(handle, path: Path) -> dict[str, Any] | None:
    """The file's one JSON object when it spans several lines (pretty-printed), else None (JSON Lines, or not
    JSON: the line reader says where). datasets' json builder reads such a file as one row."""
    try:
        json.loads(handle.readline())
        return None  # the first line is a whole value: JSON Lines
    except (ValueError, RecursionError):
        pass
    if os.fstat(handle.fileno()).st_size > ONE_OBJECT_BYTES:
        return None
    handle.seek(0)
    try:
        whole = json.loads(handle.read())
    except (ValueError, RecursionError):
        return None
    return whole if isinstance(whole, dict) else None


def locate(files: list[str] | tuple[str, ...], wanted: set[int]) -> dict[int, str]:
    """Where the rows numbered `wanted` (0-based, across `files` in order, as `datasets.load_dataset` numbers
    them: JSON Lines' blank lines skipped) are: "train.jsonl line 675", "data.json row 3", "part.parquet row 9".
    Reads only as far as the last one wanted, and JSON Lines without parsing them."""
    found: dict[int, str] = {}
    first, last = 0, max(wanted, default=-1)
    for name in files:
        if first > last:
            break
        path, count = Path(name), 0
        for count, where in enumerate(_places(path), start=1):
            if first + count - 1 in wanted:
                found[first + count - 1] = f"{path.name} {where}"
            if first + count - 1 >= last:
                break
        first += count
    return found


def _places(path: Path) -> Iterator[str]:
    """ "line N" (JSON Lines) or "row N" (a JSON array, Parquet) of every row of a file, in order."""
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        yield from (f"row {n}" for n in range(1, pq.ParquetFile(path).metadata.num_rows + 1))
        return
    if path.suffix.lower() == ".arrow":
        yield from (where for where, _ in _arrow_rows(path))
        return
    with open(path, "rb") as handle:
        start = handle.read(64).lstrip()
        handle.seek(0)
        if start.startswith(b"["):  # as rows() reads it
            yield from (where for where, _ in rows(path))
            return
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield f"line {number}"


def _check_unicode(row: Any, path: Path, where: str) -> None:
    """JSON may escape half of a surrogate pair (\\udb3f); no tokenizer can encode the string that makes."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode("ascii")
        raise InputError(
            path, f"{where}: a string holds an unpaired UTF-16 surrogate ({bad}): not valid Unicode text"
        ) from None
    except (ValueError, RecursionError):
        pass  # nested too deeply: the format check names it


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq  # only for Parquet input

    try:
        table = pq.ParquetFile(path)
    except Exception as exc:
        raise InputError(path, f"not a readable Parquet file: {exc}") from None
    number = 0
    for batch in table.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            number += 1
            yield f"row {number}", row


def _arrow_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """The rows of an Arrow file as the datasets library writes its cache (the IPC stream format; datasets 2.x-5.x,
    arrow_writer.py), or the IPC file format, as its `arrow` builder reads either (packaged_modules/arrow)."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(path))
        try:
            batches = iter(pa.ipc.open_stream(source))
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row
    except (OSError, pa.ArrowException) as exc:
        raise InputError(path, f"not a readable Arrow file: {exc}") from None


def first_rows_and_count(path: Path, first: int = 5) -> tuple[list[Any], int]:
    """The first rows and the count (the plan's token sample)."""
    head, count = [], 0
    for _, row in rows(path):
        if count < first:
            head.append(row)
        count += 1
    return head, count


def kind(value: Any) -> str | None:
    """The JSON type of a value as an Arrow column holds it (int and float are one), None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "a boolean"
    return {int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), "other"
    )


def mixed_columns_load() -> bool:
    """Whether the installed datasets loads a key whose JSON type changes between rows: 5.x stores such a
    column as its `Json` feature; older releases stop with "JSON parse error: Column(/tags) changed from
    array to number"."""
    features = module_file("datasets", "features", "features.py")
    try:
        return features is None or "class Json" in features.read_text(encoding="utf-8")
    except OSError:
        return True


class RowProblem(Exception):
    """What is wrong with one row, worded without its place (the caller names the file and line, or the split)."""


def describe(
    files: list[str], wanted: str = "auto", one_type_per_key: bool = False, hub: dict[str, str] | None = None
) -> dict[str, Any]:
    """Every row of every file checked against one format: the files' `wanted` one, or the first row's.
    With `one_type_per_key` (a datasets release that needs it), a key's JSON type must not change. `hub` (the
    config, its key, the dataset and split the files are shards of) names a bad row by split and index."""
    count, chats, fmt = 0, 0, None if wanted == "auto" else wanted
    columns: dict[str, tuple[str, str]] | None = {} if one_type_per_key else None  # key -> (type, first seen)
    objects = []  # files that are one JSON object: one row each
    where = ""
    for name in files:
        path, before = Path(name), count
        for where, row in rows(path):
            try:
                fmt = fmt or _detected(row, where)
                _check_row(row, fmt, wanted, where, columns, path.name)
            except RowProblem as problem:
                raise _refusal(path, where, count, str(problem), hub) from None
            count += 1
            chats += fmt == "prompt_completion" and isinstance(row.get("prompt"), list)
        if count - before == 1 and not where.startswith("row "):  # one object, on one line or several (not [{...}])
            objects.append(name)
    if count == 0:
        if hub:
            raise InputError(hub["config"], f"{hub['name']} split {hub['split']} has no rows", key=hub["key"])
        raise InputError(files[0], "no rows")
    # prompt-completion rows whose prompt is a list of messages: TRL renders them with the chat template
    return {
        "files": files,
        "rows": count,
        "format": fmt,
        "shape": SHAPE[fmt],
        **({"one_object": objects} if objects else {}),
        **({"conversational_rows": chats} if fmt == "prompt_completion" else {}),
    }


def _detected(row: Any, where: str) -> str:
    """The format of the first row, or why it has none."""
    fmt = format_of(row)
    if fmt is None:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise RowProblem(
            f"no known format; found {keys}; expected one of: "
            + "; ".join(f"{n} ({' + '.join(k)})" for n, k in FORMATS.items())
            + _not_rows(where, row)
        )
    return fmt


def _check_row(
    row: Any, fmt: str, wanted: str, where: str, columns: dict[str, tuple[str, str]] | None, file: str
) -> None:
    """RowProblem when the row does not fit `fmt`, or (with `columns`) a key changes its JSON type."""
    problem = row_problem(row, fmt)
    if problem:
        found = format_of(row)
        also = f" (this row looks like {found})" if found and found != fmt else ""
        raise RowProblem(
            f"{problem}; the rows are {fmt}{also}"
            + ("" if wanted == "auto" else " ([data].format)")
            + _not_rows(where, row)
        )
    for key, value in row.items() if columns is not None and isinstance(row, dict) else ():
        if (found := kind(value)) is not None:
            first = columns.setdefault(key, (found, f"{file} {where}"))
            if first[0] != found:
                raise RowProblem(
                    f"{key} is {found}, but it is {first[0]} at {first[1]}: the datasets library stores each key "
                    "as one column of one type"
                )


def _refusal(path: Path, where: str, index: int, problem: str, hub: dict[str, str] | None) -> InputError:
    """A bad row named by its file and line, or (a hub dataset's shard) by split and row: "split train, row 12
    (dataset[11], train-00000-of-00001.parquet row 12)"."""
    if hub is None:
        return InputError(path, f"{where}: {problem}")
    return InputError(
        hub["config"],
        f"{hub['name']} split {hub['split']}, row {index + 1} (dataset[{index}], {path.name} {where}): {problem}",
        key=hub["key"],
    )


def _not_rows(where: str, row: Any) -> str:
    """What to say of a file that is one JSON object that is not a row: how rows are written, and where its own
    rows are when one of its keys holds them ({"data": [...]})."""
    if where != ONE_OBJECT:
        return ""
    held = next(
        (
            f"; its {k!r} holds a list of {len(v)} objects: write that list as the file"
            for k, v in row.items()
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
        ),
        "",
    )
    return "; a file of rows is JSON Lines (one object a line) or a JSON array of objects, not one object" + held


def eval_split(rows: int, fraction: float) -> tuple[int, int]:
    """(training rows, eval rows) of `rows` held out at `fraction`, as the recipe splits them: datasets'
    train_test_split(test_size=fraction) holds out ceil(fraction x rows) (arrow_dataset.py, datasets 2.x-4.x).
    Decided here once: the data probe refuses a split that leaves either side empty, the recipe asks for this
    many eval rows."""
    held = math.ceil(fraction * rows) if fraction else 0
    return rows - held, held


@fact(
    "data",
    "the run's data files: rows, formats, problems",
    inputs=RUN_CONFIG,
    why_missing="no run config given (--config)",
    needs=("run",),
)
def probe_data(facts, run) -> dict[str, Any] | None:
    strict = not mixed_columns_load()
    found = facts.get("data_source")
    if found is None:  # its probe failed: no rows to check, and nothing to train on
        why = facts.why_missing("data_source")
        raise InputError(run.path, f"the data source cannot be read: {why}", key="[data].train")
    hub = found["kind"] != "files"
    for key, files in (("[data].train", found["train"]), ("[data].eval", found["eval"])):
        parquet = [f for f in files if Path(f).suffix.lower() == ".parquet"]
        if parquet and len(parquet) < len(files):  # the recipe loads one kind per split (trainer_inputs._load_files)
            raise InputError(
                run.path,
                f"mixes Parquet ({Path(parquet[0]).name}) and JSON files; the datasets library "
                "loads one kind per split: convert them to one kind",
                key=key,
            )
    name = lambda split, key: (  # noqa: E731 - a hub dataset's rows are named by split
        {"config": run.path, "key": key, "name": found["name"], "split": split} if hub else None
    )
    out = {"train": describe(found["train"], run.data.format, strict, name(found.get("split"), "[data].train"))}
    if found["eval"]:
        where = name(found.get("eval_split"), "[data].eval_split") if found.get("eval_split") else None
        out["eval"] = describe(found["eval"], out["train"]["format"], strict, where)
    elif run.data.eval_fraction:
        out["split"] = split(run, out["train"]["rows"])
    return out


def split(run, rows: int) -> dict[str, Any]:
    """The eval split of [data] eval_fraction, refused when it leaves no training row or no eval row."""
    fraction = run.data.eval_fraction
    train, held = eval_split(rows, fraction)
    if train == 0 or held == 0:
        raise InputError(
            run.path,
            f"{fraction:g} of {rows} training row{'s' if rows != 1 else ''} holds out {held} "
            f"for eval and leaves {train} to train on (datasets' train_test_split holds out "
            f"ceil({fraction:g} x {rows})): give more rows, or an eval file ([data] eval)",
            key="[data].eval_fraction",
        )
    return {"fraction": fraction, "train": train, "eval": held}
