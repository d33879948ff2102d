"""Run directories as `sftdoctor train` leaves them (resolved.json, facts.json, metrics.jsonl, findings.jsonl), and
hostile mutations of them in tests/hostile.py's vocabulary, for the `diff` and `report` fuzzers: a NaN or an
infinity in a logged series, a file or a key taken away, a file that is not a file, a value of another JSON
type, a record logged twice or out of order."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hostile import EXTREME, NON_FINITE, SPECIAL, remove, special_file, wrong_type
from hypothesis import strategies as st

STEPS = 24
SERIES = ("loss", "grad_norm", "learning_rate", "eval_loss")
PLAN = {
    "version": 8,
    "lr_scheduler": "linear",
    "learning_rate": 1e-3,
    "warmup_steps": 2,
    "total_steps": STEPS,
    "max_grad_norm": 1.0,
    "precision": "bf16",
    "save_steps": 12,
    "eval_steps": 6,
    "output_dir": "out",
    "train_files": ["data/train.jsonl"],
    "reasons": {"precision": "auto"},
}
FACTS = {
    "schema": 2,
    "sftdoctor": "0.x",
    "host": "node1",
    "facts": {
        "packages": {"torch": "2.13.0", "transformers": "5.25.0", "trl": "1.16.0"},
        "torch_build": {"version": "2.13.0+cu128", "cuda": "12.8"},
        "gpus": {
            "driver_version": "570.86",
            "cuda_version": "12.8",
            "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}],
        },
        "env": {"NCCL_IB_DISABLE": "0", "MASTER_PORT": "29500"},
    },
    "unavailable": {},
    "data_files": {"data/train.jsonl": {"sha256": "ab" * 32, "bytes": 1000}},
}
FINDINGS = [
    {"phase": "preflight", "severity": "warning", "id": "gpu-topology", "title": "GPUs talk over PCIe"},
    {"phase": "runtime", "step": 7, "severity": "warning", "id": "loss-spike", "title": "loss spike at step 7"},
]
STOPPED = {"exit_code": 3, "id": "nan-loss", "title": "non-finite loss at step 24: stopped"}
FILES = ("resolved.json", "facts.json", "metrics.jsonl", "findings.jsonl")


def metrics() -> list[dict[str, Any]]:
    records = []
    for step in range(1, STEPS + 1):
        records.append(
            {
                "step": step,
                "loss": 2 * math.exp(-step / 8) + 0.5,
                "grad_norm": 0.5 + 0.01 * (step % 3),
                "learning_rate": 1e-3 * min(step / 2, (STEPS - step) / (STEPS - 2)),
                "max_grad_norm": 1.0,
                "tokens_seen": 1000 * step,
                "tokens_per_second": 12000.0,
                "host_rss_gib": 1.0,
            }
        )
        if step % 6 == 0:
            records.append({"step": step, "eval_loss": 2 * math.exp(-step / 8) + 0.6})
    return records


def run_dir(folder: Path, stopped: bool = False) -> Path:
    """A run directory; `stopped`: as a watcher that stopped the run leaves it (stopped.json)."""
    folder.mkdir(parents=True)
    if stopped:
        (folder / "stopped.json").write_text(json.dumps(STOPPED))
    (folder / "resolved.json").write_text(json.dumps(PLAN))
    (folder / "facts.json").write_text(json.dumps(FACTS, indent=1))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics()))
    (folder / "findings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in FINDINGS))
    return folder


def _paths(doc: Any, at: tuple = ()) -> list[tuple]:
    """Every key path inside a JSON document (the document itself included)."""
    found = [at]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, at + (key,))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, at + (index,))
    return found


def _at(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


JSON_DOCS = {"resolved.json": PLAN, "facts.json": FACTS, "stopped.json": STOPPED}


@st.composite
def mutation(draw, files=FILES) -> tuple:
    """One hostile change to a run directory, as data (applied by `mutate`)."""
    kind = draw(
        st.sampled_from(
            [
                "non_finite",
                "non_finite",
                "absent",
                "absent_key",
                "special",
                "wrong_type",
                "wrong_type",
                "duplicate",
                "unsorted",
            ]
        )
    )
    records = metrics()
    if kind == "non_finite":
        name = draw(st.sampled_from(SERIES))
        rows = [i for i, r in enumerate(records) if name in r]
        return kind, "metrics.jsonl", draw(st.sampled_from(rows)), name, draw(st.sampled_from(NON_FINITE + EXTREME))
    if kind == "absent":
        return kind, draw(st.sampled_from(files))
    if kind == "special":
        return kind, draw(st.sampled_from(files)), draw(st.sampled_from(SPECIAL))
    if kind == "absent_key":
        name = draw(st.sampled_from(sorted(set(files) & set(JSON_DOCS))))
        path = draw(st.sampled_from([p for p in _paths(JSON_DOCS[name]) if p]))
        return kind, name, path
    if kind == "wrong_type":
        name = draw(st.sampled_from(sorted(set(files) & {*JSON_DOCS, "metrics.jsonl", "findings.jsonl"})))
        doc = JSON_DOCS.get(name) or (records if name == "metrics.jsonl" else FINDINGS)
        path = draw(st.sampled_from(_paths(doc)))
        return kind, name, path, draw(wrong_type(_at(doc, path)))
    index = draw(st.integers(0, len(records) - 1))
    return kind, "metrics.jsonl", index, draw(st.integers(0, len(records) - 1))


def not_a_number(value: Any) -> bool:
    """NaN, an infinity, or a whole number json reads as one too large for a float (read as infinite)."""
    return isinstance(value, float) and not math.isfinite(value) or isinstance(value, int) and abs(value) > 2**1024


def not_numbers(changes: list[tuple]) -> set[str]:
    """The series that hold a value that is not a number once `changes` are applied (a later value written
    at the same place wins)."""
    last = {(c[2], c[3]): c[4] for c in changes if c[0] == "non_finite"}
    return {series for (_, series), value in last.items() if not_a_number(value)}


def strict(text: str) -> Any:
    """JSON as any parser reads it: a bare NaN or Infinity literal (Python's own extension) fails."""

    def refuse(literal):
        raise ValueError(f"non-standard JSON literal {literal}")

    return json.loads(text, parse_constant=refuse)


def _read_doc(path: Path) -> Any:
    if path.name.endswith(".jsonl"):
        return [json.loads(line) for line in path.read_text().splitlines()]
    return json.loads(path.read_text())


def _write_doc(path: Path, doc: Any) -> None:
    if path.name.endswith(".jsonl") and isinstance(doc, list):
        path.write_text("".join(json.dumps(r) + "\n" for r in doc))
    else:
        path.write_text(json.dumps(doc) + ("\n" if path.name.endswith(".jsonl") else ""))


def mutate(folder: Path, change: tuple) -> bool:
    """Apply one mutation; False when its file is already gone or not a file (an earlier mutation's doing)."""
    kind, name = change[0], change[1]
    path = folder / name
    if kind in ("absent", "special"):
        if path.is_symlink() or path.exists():
            remove(path)
        if kind == "special":
            special_file(path, change[2])
        return True
    if path.is_symlink() or not path.is_file():
        return False
    try:
        doc = _read_doc(path)
    except ValueError:  # an earlier wrong_type made it one JSON value, or not JSON at all
        return False
    if kind == "non_finite":
        _, _, index, series, value = change
        if not isinstance(doc, list) or index >= len(doc) or not isinstance(doc[index], dict):
            return False
        doc[index][series] = value
    elif kind in ("duplicate", "unsorted"):
        i, j = change[2], change[3]
        if not isinstance(doc, list) or max(i, j) >= len(doc):
            return False
        if kind == "duplicate":
            doc.insert(j, doc[i])
        else:
            doc[i], doc[j] = doc[j], doc[i]
    else:
        keypath = change[2]
        try:
            parent = _at(doc, keypath[:-1]) if keypath else None
            if kind == "absent_key":
                del parent[keypath[-1]]
            elif keypath:
                parent[keypath[-1]] = change[3]
            else:
                doc = change[3]
        except (KeyError, IndexError, TypeError):
            return False
    _write_doc(path, doc)
    return True
