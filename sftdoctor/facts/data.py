"""The run's data files: rows and shape, read without the datasets library.

Shapes (as TRL's SFTTrainer takes them): `messages` (chat, rendered with the chat template),
`prompt` + `completion`, or plain `text`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError

SHAPES = {"messages": ("messages",), "prompt_completion": ("prompt", "completion"), "text": ("text",)}


def shape_of(row: Any) -> str | None:
    if not isinstance(row, dict):
        return None
    for shape, keys in SHAPES.items():
        if all(k in row for k in keys):
            return shape
    return None


def first_rows_and_count(path: Path, first: int = 5) -> tuple[list[Any], int]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # only for Parquet input

        try:
            table = pq.ParquetFile(path)
        except Exception as exc:
            raise InputError(path, f"not a readable Parquet file: {exc}") from None
        first = table.read_row_group(0).slice(0, first).to_pylist() if table.num_row_groups else []
        return first, table.metadata.num_rows
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        raise InputError(path, "expected UTF-8 JSON Lines, JSON or Parquet data") from None
    if suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return rows[:first], len(rows)
    lines = [line for line in text.splitlines() if line.strip()]
    head = []
    for number, line in enumerate(lines[:first], start=1):
        try:
            head.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise InputError(path, f"line {number}: not a JSON object ({exc.msg}); expected one JSON object a line") from None
    return head, len(lines)


def describe(files: list[str], wanted: str = "auto") -> dict[str, Any]:
    rows, shapes = 0, set()
    for name in files:
        path = Path(name)
        first, count = first_rows_and_count(path)
        found = {shape_of(row) for row in first}
        if None in found or not found:
            keys = sorted(first[0]) if first and isinstance(first[0], dict) else []
            raise InputError(path, f"rows need `messages`, `prompt` and `completion`, or `text`; found keys {keys}")
        if len(found) > 1:
            raise InputError(path, f"mixed row shapes {sorted(found)}; use one shape per dataset")
        shapes |= found
        rows += count
    if len(shapes) > 1:
        raise InputError(files[0], f"the files mix row shapes {sorted(shapes)}; use one shape per dataset")
    shape = shapes.pop() if shapes else None
    if wanted != "auto" and shape != wanted:
        raise InputError(files[0], f"[data].format is {wanted!r} but the rows are {shape!r}")
    return {"files": files, "rows": rows, "shape": shape}


def probe_data(facts) -> dict[str, Any] | None:
    run = facts.get("run")
    if run is None:
        return None
    out = {"train": describe(list(run.data.train), run.data.format)}
    if run.data.eval:
        out["eval"] = describe(list(run.data.eval), out["train"]["shape"])
    return out
