"""What differs between two run directories, most suspicious first: the data (each file's digest), the plan
(every decided setting), the stack and the GPUs, the environment; and where the curves part.

Each run is read from what `sftdoctor train` keeps in it: resolved.json (the plan), facts.json (the facts the
gate judged and the data files' digests) and metrics.jsonl. A run without facts.json (trained elsewhere, or
before sftdoctor kept it) is compared on what it has, and the comparison says what it could not compare:
whatever one run lacks or cannot give (facts.json absent or damaged, a fact its probe could not take, a data
digest) is a Gap, named with why, never counted as agreement; a loss that is NaN or infinite is where two
runs part (or both stopped being numbers), never "the same".
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, parse_problem, read_text
from sftdoctor.facts.run_records import non_finite, read_run
from sftdoctor.run import layout
from sftdoctor.run.data_source import identity

# The order a difference is shown in: what changes the numbers a run computes comes before where it runs.
AREAS = ("data", "plan", "stack", "gpus", "env")
# Settings that differ between any two runs without changing what they compute.
UNCOMPARED = {
    "output_dir",
    "master_addr",
    "master_port",
    "node_rank",
    "reasons",
    "version",
    "train_files",
    "eval_files",
    "data_source",  # compared in the data area, without the folder's place (run.data_source.identity)
    "join_timeout_s",
    "plugins",
    "rehearsal",
    "drill",
}
STACK = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "deepspeed",
    "peft",
    "datasets",
    "tokenizers",
    "flash-attn",
    "flash_attn",
    "liger-kernel",
    "bitsandbytes",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "lm_eval",
)
LAUNCHER_ENV = {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}
PART = 0.01  # the train losses part where they differ by more than this share of the larger


@dataclass(frozen=True)
class Difference:
    area: str
    what: str
    a: Any
    b: Any


@dataclass(frozen=True)
class Gap:
    """Something one run cannot be compared on, and why: said as "not compared", never counted as agreement."""

    areas: tuple[str, ...]
    why: str  # completes "B ...": "has no facts.json (...)"


@dataclass(frozen=True)
class Recorded:
    path: Path
    plan: dict[str, Any]
    facts: dict[str, Any] | None  # facts.json's "facts" (the usable ones), None when the run has none
    data_files: dict[str, Any]
    gaps: tuple[Gap, ...] = ()


# The facts each area compares, by their name in facts.json's "facts".
FACT_AREAS = {"stack": ("packages", "torch_build"), "gpus": ("gpus",), "env": ("env",)}
NO_FACTS = "has no facts.json (trained elsewhere, or before sftdoctor kept it)"
NO_DRIVER = "no NVIDIA kernel driver"  # the gpus probe's answer on a machine without one (facts/gpus.py)


def recorded(path: Path) -> Recorded:
    """A run directory read for `diff`: resolved.json is what makes it one (refused when absent or unusable);
    facts.json is optional (older runs have none), and what it lacks or cannot give is a Gap."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(path, "not a folder; expected a run directory of `sftdoctor train`")
    if not os.path.lexists(path / layout.RESOLVED):
        raise InputError(path, f"holds no {layout.RESOLVED}; expected a run directory of `sftdoctor train`")
    plan = _json(path / layout.RESOLVED, "run record")
    everything = ("data", *FACT_AREAS)
    if not os.path.lexists(path / layout.FACTS):
        return Recorded(path, plan, None, {}, (Gap(everything, NO_FACTS),))
    try:
        kept = _json(path / layout.FACTS, "facts record")
    except InputError as exc:  # a damaged optional record: those areas are not compared, the rest is
        return Recorded(path, plan, None, {}, (Gap(everything, f"has a facts.json that cannot be used: {exc}"),))
    facts, gaps = _facts(path / layout.FACTS, kept)
    files, gap = _data_files(path / layout.FACTS, kept.get("data_files"))
    return Recorded(path, plan, facts, files, tuple(gaps + ([gap] if gap else [])))


def _unusable(path: Path, message: str, key: str) -> str:
    """A Gap's why for a part of facts.json that cannot be used, naming the file and the key."""
    return f"has a facts.json that cannot be used: {InputError(path, message, key=key)}"


def _facts(path: Path, kept: dict[str, Any]) -> tuple[dict[str, Any], list[Gap]]:
    """The recorded facts diff reads, each held to the shape a replayed snapshot is held to; one that is absent
    (its probe failed at the launch, or an older sftdoctor did not record it) or malformed is a Gap."""
    facts = kept.get("facts")
    if not isinstance(facts, dict):
        got = "nothing" if facts is None else type(facts).__name__
        return {}, [Gap(tuple(FACT_AREAS), _unusable(path, f"expected an object of facts, got {got}", "facts"))]
    unavailable = kept.get("unavailable") if isinstance(kept.get("unavailable"), dict) else {}
    usable, gaps = {}, []
    for area, names in FACT_AREAS.items():
        for name in names:
            why = _fact_gap(path, name, facts.get(name), unavailable.get(name))
            if why:
                gaps.append(Gap((area,), why))
            else:
                usable[name] = facts[name]
    return usable, gaps


def _fact_gap(path: Path, name: str, value: Any, probe_said: Any) -> str | None:
    from sftdoctor.facts.shapes import fact_problem

    if value is None:
        said = f" (its probe said: {probe_said})" if isinstance(probe_said, str) else ""
        return f"has no facts.{name} in {path}{said}"
    problem = (
        fact_problem(name, value)
        if isinstance(value, dict)
        else ("", f"expected an object, got {type(value).__name__}")
    )
    if problem:
        return _unusable(path, problem[1], f"facts.{name}{problem[0]}")
    error = value.get("error")  # no devices seen and why: a probe that failed is no "no GPU" (a machine
    # without the NVIDIA driver is: it trains on none)
    if name == "gpus" and not value.get("devices") and isinstance(error, str) and not error.startswith(NO_DRIVER):
        return f"has facts.gpus from a GPU probe that failed in {path}: {error}"
    return None


def _data_files(path: Path, files: Any) -> tuple[dict[str, Any], Gap | None]:
    """The digests of the run's data files; none recorded, or one that could not be taken at the launch, is a
    Gap (two runs whose digests are both missing did not read the same data: nobody knows)."""
    if files is None or files == {}:
        return {}, Gap(("data",), f"recorded no digest of its data files in {path}")
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return {}, Gap(("data",), _unusable(path, "expected an object of file name -> {sha256, bytes}", "data_files"))
    undigested = sorted(name for name, info in files.items() if not isinstance(info.get("sha256"), str))
    if undigested:
        why = files[undigested[0]].get("error")
        return {}, Gap(
            ("data",),
            f"has no digest of {undigested[0]}"
            + (f" ({why})" if isinstance(why, str) else "")
            + (f" and {len(undigested) - 1} more" if len(undigested) > 1 else ""),
        )
    return files, None


def _json(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(read_text(path, what))
    except (ValueError, RecursionError) as exc:
        raise InputError(path, f"not valid JSON ({parse_problem(exc)}); expected a {what}") from None
    if not isinstance(doc, dict):
        raise InputError(path, f"expected a JSON object ({what}), got {type(doc).__name__}")
    return doc


def differences(a: Recorded, b: Recorded) -> list[Difference]:
    """What differs, in the areas both runs recorded (what one did not is a Gap, said apart)."""
    fa, fb = a.facts or {}, b.facts or {}
    found = _data(a, b) + _plan(a.plan, b.plan) + _stack(fa, fb) + _gpus(fa, fb) + _env(fa, fb)
    return sorted(found, key=lambda d: AREAS.index(d.area))


def not_compared(a: Recorded, b: Recorded) -> list[tuple[str, Gap]]:
    """("A" or "B", the Gap) of each run, in area order."""
    return [(label, gap) for label, run in (("A", a), ("B", b)) for gap in run.gaps]


def _changed(area: str, a: dict[str, Any], b: dict[str, Any], keys) -> list[Difference]:
    return [Difference(area, k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _data(a: Recorded, b: Recorded) -> list[Difference]:
    def contents(run: Recorded) -> list[str]:
        return sorted(
            f"{Path(name).name} {info['sha256'][:12]} ({info.get('bytes', '?')} bytes)"
            for name, info in run.data_files.items()
        )

    ia, ib = identity(a.plan.get("data_source")), identity(b.plan.get("data_source"))
    found = [Difference("data", "data source", ia, ib)] if ia != ib else []
    if not a.data_files or not b.data_files:  # a Gap of one run or both
        return found
    if sorted(i["sha256"] for i in a.data_files.values()) == sorted(i["sha256"] for i in b.data_files.values()):
        return found
    return found + [Difference("data", "data files (sha256)", contents(a), contents(b))]


def _plan(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    """Each decided setting that differs; one that is NaN or infinite in either run is never "the same" (NaN
    equals nothing, and two runs cannot be shown to have computed with it alike)."""
    keys = sorted((set(a) | set(b)) - UNCOMPARED)
    odd = [k for k in keys if not (_finite(a.get(k)) and _finite(b.get(k)))]
    return [Difference("plan", f"{k} (not a finite number)", a.get(k), b.get(k)) for k in odd] + _changed(
        "plan", a, b, [k for k in keys if k not in odd]
    )


def _both(name: str, a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """One fact of both runs, or None where either lacks it (a Gap, said apart)."""
    return (a[name], b[name]) if name in a and name in b else None


def _stack(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    found = []
    if packages := _both("packages", a, b):
        pa, pb = packages
        found += _changed("stack", pa, pb, [k for k in STACK if k in pa or k in pb])
    if build := _both("torch_build", a, b):
        ta, tb = build
        found += [
            Difference("stack", f"torch {k}", ta.get(k), tb.get(k))
            for k in ("version", "cuda", "hip")
            if ta.get(k) != tb.get(k)
        ]
    return found


def _gpus(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    if not (both := _both("gpus", a, b)):
        return []
    ga, gb = both

    def devices(g: dict[str, Any]) -> list[str]:
        return [f"{d.get('name')} ({d.get('memory_total_mib')} MiB)" for d in g.get("devices") or []]

    found = _changed("gpus", ga, gb, ["driver_version", "cuda_version"])
    if devices(ga) != devices(gb):
        found.append(Difference("gpus", "devices", devices(ga), devices(gb)))
    return found


def _env(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    if not (both := _both("env", a, b)):
        return []
    ea, eb = both
    return _changed("env", ea, eb, sorted((set(ea) | set(eb)) - LAUNCHER_ENV))


def where_they_part(a: Path, b: Path) -> dict[str, Any]:
    """The first logged step where the train losses differ by more than PART of the larger, or where one is a
    number and the other is not; where both stopped being numbers ("both_non_finite", never agreement); each
    run's first non-finite loss; the last values. {"error": why} when they cannot be compared."""
    absent = [str(p) for p in (a, b) if not os.path.lexists(p / layout.METRICS)]
    if absent:
        return {
            "error": f"{' and '.join(dict.fromkeys(absent))} {'has' if len(set(absent)) == 1 else 'have'} no "
            f"{layout.METRICS}"
        }
    try:
        sa, sb = _losses(a), _losses(b)
    except InputError as exc:  # an unreadable metrics.jsonl: said, never read as "no loss logged"
        return {"error": str(exc)}
    la, lb = dict(zip(sa["steps"], sa["values"])), dict(zip(sb["steps"], sb["values"]))
    if not la or not lb:
        return {"error": f"{a if not la else b} logged no train loss"}
    common = sorted(set(la) & set(lb))
    if not common:  # logged at other steps: "they agree" would be a verdict on nothing
        return {"error": "the two runs logged their losses at no common step"}
    parted = both = None
    for step in common:
        fa, fb = math.isfinite(la[step]), math.isfinite(lb[step])
        if fa and fb and abs(la[step] - lb[step]) > PART * max(abs(la[step]), abs(lb[step])) or fa != fb:
            parted = step
            break
        if not fa and not fb:  # two NaNs are not two equal numbers: nothing after them is compared
            both = step
            break
    last_a, last_b = max(la), max(lb)
    return {
        "step": parted,
        "a": la.get(parted),
        "b": lb.get(parted),
        "common_steps": len(common),
        "both_non_finite": both,
        "non_finite": {"a": non_finite(sa), "b": non_finite(sb)},
        "last": {"a": [last_a, la[last_a]], "b": [last_b, lb[last_b]]},
    }


def _losses(path: Path) -> dict[str, list]:
    return read_run(path)["series"].get("loss") or {"steps": [], "values": []}
