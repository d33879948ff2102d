"""What differs between two run directories, most suspicious first: the data (each file's digest), the plan
(every decided setting), the stack and the GPUs, the environment; and where the curves part.

Each run is read from what `sftdoctor train` keeps in it: resolved.json (the plan), facts.json (the facts the
gate judged and the data files' digests) and metrics.jsonl. A run without facts.json (trained elsewhere, or
before sftdoctor kept it) is compared on what it has, and the comparison says what it could not compare.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError
from sftdoctor.facts.run_records import read_run
from sftdoctor.run import rundir

# The order a difference is shown in: what changes the numbers a run computes comes before where it runs.
AREAS = ("data", "plan", "stack", "gpus", "env")
# Settings that differ between any two runs without changing what they compute.
UNCOMPARED = {"output_dir", "master_addr", "master_port", "node_rank", "reasons", "version", "train_files",
              "eval_files", "join_timeout_s", "plugins", "rehearsal", "drill"}
STACK = ("torch", "transformers", "trl", "accelerate", "deepspeed", "peft", "datasets", "tokenizers", "flash-attn",
         "flash_attn", "liger-kernel", "bitsandbytes", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "lm_eval")
LAUNCHER_ENV = {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}
PART = 0.01  # the train losses part where they differ by more than this share of the larger


@dataclass(frozen=True)
class Difference:
    area: str
    what: str
    a: Any
    b: Any


@dataclass(frozen=True)
class Recorded:
    path: Path
    plan: dict[str, Any]
    facts: dict[str, Any] | None  # facts.json's "facts", None when the run has none
    data_files: dict[str, Any]


def recorded(path: Path) -> Recorded:
    path = Path(path)
    if not path.is_dir():
        raise InputError(path, "not a folder; expected a run directory of `sftdoctor train`")
    plan = _json(path / rundir.RESOLVED, "the run's resolved settings")
    if plan is None:
        raise InputError(path, f"holds no {rundir.RESOLVED}; expected a run directory of `sftdoctor train`")
    kept = _json(path / rundir.FACTS, "the facts of the run's launch")
    if kept is None:
        return Recorded(path, plan, None, {})
    return Recorded(path, plan, _facts(path / rundir.FACTS, kept.get("facts")), _data_files(path / rundir.FACTS,
                                                                                             kept.get("data_files")))


def _facts(path: Path, facts: Any) -> dict[str, Any]:
    """The recorded facts diff reads, held to the shapes a replayed snapshot is held to."""
    from sftdoctor.facts.shapes import fact_problem

    if not isinstance(facts, dict):
        raise InputError(path, "expected an object of facts (as `sftdoctor facts` writes them)", key="facts")
    for name in ("packages", "torch_build", "gpus", "env"):
        value = facts.get(name)
        if value is None:
            continue
        problem = fact_problem(name, value) if isinstance(value, dict) else ("", f"expected an object, got {type(value).__name__}")
        if problem:
            raise InputError(path, problem[1], key=f"facts.{name}{problem[0]}")
    return facts


def _data_files(path: Path, files: Any) -> dict[str, Any]:
    if files is None:
        return {}
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise InputError(path, "expected an object of file name -> {sha256, bytes}", key="data_files")
    return files


def _json(path: Path, what: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}") from None
    except ValueError as exc:
        raise InputError(path, f"not valid JSON ({exc}); expected {what}") from None
    if not isinstance(doc, dict):
        raise InputError(path, f"expected a JSON object ({what}), got {type(doc).__name__}")
    return doc


def differences(a: Recorded, b: Recorded) -> list[Difference]:
    found = _data(a, b) + _plan(a.plan, b.plan)
    if a.facts is not None and b.facts is not None:
        found += _stack(a.facts, b.facts) + _gpus(a.facts, b.facts) + _env(a.facts, b.facts)
    return sorted(found, key=lambda d: AREAS.index(d.area))


def _changed(area: str, a: dict[str, Any], b: dict[str, Any], keys) -> list[Difference]:
    return [Difference(area, k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]


def _data(a: Recorded, b: Recorded) -> list[Difference]:
    def contents(run: Recorded) -> list[str]:
        return sorted(f"{Path(name).name} {info.get('sha256', '?')[:12]} ({info.get('bytes', '?')} bytes)"
                      for name, info in run.data_files.items())

    if not a.data_files or not b.data_files:
        return []
    if sorted(i.get("sha256") for i in a.data_files.values()) == sorted(i.get("sha256") for i in b.data_files.values()):
        return []
    return [Difference("data", "data files (sha256)", contents(a), contents(b))]


def _plan(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    return _changed("plan", a, b, sorted((set(a) | set(b)) - UNCOMPARED))


def _stack(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    pa, pb = a.get("packages") or {}, b.get("packages") or {}
    found = _changed("stack", pa, pb, [k for k in STACK if k in pa or k in pb])
    ta, tb = a.get("torch_build") or {}, b.get("torch_build") or {}
    return found + [Difference("stack", f"torch {k}", ta.get(k), tb.get(k)) for k in ("version", "cuda", "hip")
                    if ta.get(k) != tb.get(k)]


def _gpus(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    ga, gb = a.get("gpus") or {}, b.get("gpus") or {}

    def devices(g: dict[str, Any]) -> list[str]:
        return [f"{d.get('name')} ({d.get('memory_total_mib')} MiB)" for d in g.get("devices") or []]

    found = _changed("gpus", ga, gb, ["driver_version", "cuda_version"])
    if devices(ga) != devices(gb):
        found.append(Difference("gpus", "devices", devices(ga), devices(gb)))
    return found


def _env(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    ea, eb = a.get("env") or {}, b.get("env") or {}
    return _changed("env", ea, eb, sorted((set(ea) | set(eb)) - LAUNCHER_ENV))


def where_they_part(a: Path, b: Path) -> dict[str, Any]:
    """The first logged step where the train losses differ by more than PART of the larger, and the last
    values; {"error": why} when they cannot be compared."""
    try:
        la, lb = _losses(a), _losses(b)
    except InputError as exc:  # an unreadable metrics.jsonl: said, never read as "no loss logged"
        return {"error": str(exc)}
    if not la or not lb:
        return {"error": f"{a if not la else b} logged no train loss"}
    common = sorted(set(la) & set(lb))
    if not common:  # logged at other steps: "they agree" would be a verdict on nothing
        return {"error": "the two runs logged their losses at no common step"}
    parted = next((s for s in common if abs(la[s] - lb[s]) > PART * max(abs(la[s]), abs(lb[s]))), None)
    last_a, last_b = max(la), max(lb)
    return {"step": parted, "a": la.get(parted), "b": lb.get(parted), "common_steps": len(common),
            "last": {"a": [last_a, la[last_a]], "b": [last_b, lb[last_b]]}}


def _losses(path: Path) -> dict[int, float]:
    if not (path / rundir.METRICS).exists():
        return {}
    series = read_run(path)["series"].get("loss") or {}
    return dict(zip(series.get("steps", []), series.get("values", [])))
