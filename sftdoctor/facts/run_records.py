"""A finished (or stopped) run read back: its metric series, its schedule, its checkpoints and findings.

The `curves` fact the post-run checks (the curve readers) and `sftdoctor report` work from. It reads:
- a sftdoctor run directory: metrics.jsonl, resolved.json (the schedule, the clipping threshold), findings.jsonl;
- a Hugging Face Trainer output directory or checkpoint: trainer_state.json's `log_history` (the newest
  checkpoint's when the directory holds only checkpoints);
- one of those files named directly, or a LLaMA-Factory `trainer_log.jsonl` (`current_steps`, `lr`).
A record logged again for a step already read (a resumed run appending to the same log) replaces the
earlier ones from that step on: a resume's records win. NaN and infinite values are kept as logged (the
readers say where a series stopped being a number, `non_finite`); a value of another type is refused. Every
file is read through sftdoctor.errors (a FIFO or /dev/zero is refused by name, never opened); a stop record
that cannot be read is said in the fact's "problems", never read as "not stopped".
"""

from __future__ import annotations

import bisect
import json
import math
import os
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, parse_problem, read_text
from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.json_lines import json_line
from sftdoctor.run import layout
from sftdoctor.run.checkpoints import checkpoints, is_complete
from sftdoctor.run.schedule import schedule_of

CURVES = fact("curves", "a run's logged series, its schedule and checkpoints (facts.run_records)", phase="postrun")

# What the curves need, by the names metrics.jsonl uses, and the other names logs use for them.
SERIES = (
    "loss",
    "eval_loss",
    "learning_rate",
    "grad_norm",
    "loss_scale",
    "tokens_per_second",
    "step_time_s",
    "padding_fraction",
    "memory_allocated_gib",
    "memory_reserved_gib",
    "host_rss_gib",
    "tokens_seen",
)
ALIASES = {
    "lr": "learning_rate",
    "num_input_tokens_seen": "tokens_seen",
    "num_tokens": "tokens_seen",
    "train_loss_step": "loss",
}
NAMES = {**{name: name for name in SERIES}, **ALIASES}
STEP_KEYS = ("step", "current_steps", "global_step")
TRAINER_STATE = "trainer_state.json"
LOG_FILES = (layout.METRICS, TRAINER_STATE, "trainer_log.jsonl")


def _number(value: Any) -> float | None:
    """JSON numbers, NaN and Infinity included (Python's json reads them); booleans and strings are not. A
    whole number too large for a float (10**400) is infinite, as 1e400 is."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def shown(value: float) -> str:
    """A logged value as JSON writes it: NaN, Infinity and -Infinity by those names."""
    if math.isfinite(value):
        return f"{value:g}"
    return "NaN" if math.isnan(value) else "inf" if value > 0 else "-inf"


def json_safe(value: Any) -> Any:
    """`value` as JSON any parser reads: a NaN or an infinity as its name in a string (never a bare NaN
    literal), anything else JSON has no type for as its str()."""
    if isinstance(value, float) and not math.isfinite(value):
        return shown(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def non_finite(series: dict[str, list] | None) -> dict[str, Any] | None:
    """Where a logged series stopped being a number: its first NaN or infinity (step, value), how many of its
    points are not numbers, and whether it stayed so to its last point; None when every point is finite."""
    if not series:
        return None
    values = series["values"]
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if not bad:
        return None
    return {
        "step": series["steps"][bad[0]],
        "value": shown(values[bad[0]]),
        "count": len(bad),
        "of": len(values),
        "to_end": len(bad) == len(values) - bad[0],
    }


def said(gone: dict[str, Any]) -> str:
    """`non_finite`'s answer in words: "non-finite from step 6 (NaN): 5 of 10 logged points"."""
    if gone["to_end"]:
        return f"non-finite from step {gone['step']} ({gone['value']}): {gone['count']} of {gone['of']} logged points"
    return (
        f"non-finite at {gone['count']} of {gone['of']} logged points, first at step {gone['step']} ({gone['value']})"
    )


class Series:
    """(step, value) pairs in step order; a value logged again for an earlier step truncates back to it."""

    def __init__(self):
        self.steps: list[int] = []
        self.values: list[float] = []

    def add(self, step: int, value: float) -> None:
        if self.steps and step <= self.steps[-1]:
            cut = bisect.bisect_left(self.steps, step)
            del self.steps[cut:], self.values[cut:]
        self.steps.append(step)
        self.values.append(value)

    def to_json(self) -> dict[str, list]:
        return {"steps": self.steps, "values": self.values}


class Reader:
    def __init__(self, source: Path):
        self.source = source
        self.series = {name: Series() for name in SERIES}
        self.extra: dict[str, Any] = {}

    def record(self, where: str, record: Any) -> None:
        if not isinstance(record, dict):
            raise InputError(self.source, f"expected a JSON object per record, got {type(record).__name__}", key=where)
        step = next((record[k] for k in STEP_KEYS if k in record), None)
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise InputError(self.source, f'expected a "step" that is a whole number >= 0, got {step!r}', key=where)
        for key, name in NAMES.items():
            value = record.get(key)
            if value is None:  # not logged this step (a Trainer logs a grad_norm of null under DeepSpeed)
                continue
            number = _number(value)
            if number is None:  # a loss of "nan" or true: dropped, a curve would be judged without its point
                raise InputError(
                    self.source,
                    f"expected a number (NaN and Infinity included), got {value!r}"[:200],
                    key=f"{where}: {key}",
                )
            self.series[name].add(step, number)
        clip = _number(record.get("max_grad_norm"))
        if clip is not None and math.isfinite(clip):  # an infinite threshold would pass every norm as unclipped
            self.extra["max_grad_norm"] = clip
        for key in ("max_steps", "total_steps"):  # sftdoctor's record (the Trainer's count); LLaMA-Factory's
            if type(record.get(key)) is int and record[key] > 0:
                self.extra["planned_steps"] = record[key]

    def jsonl(self, text: str) -> None:
        lines = text.split("\n")
        complete = (
            lines[:-1] if lines and lines[-1] else lines
        )  # a last line without its newline: a writer killed mid-line
        for number, line in enumerate(complete, 1):
            if not line.strip():
                continue
            record = json_line(
                line, self.source, lambda why: f"expected one JSON object per line: {why}", key=f"line {number}"
            )
            self.record(f"line {number}", record)

    def trainer_state(self, text: str) -> None:
        try:
            state = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InputError(self.source, f"expected JSON: {parse_problem(exc)}") from None
        history = state.get("log_history") if isinstance(state, dict) else None
        if not isinstance(history, list):
            raise InputError(self.source, 'expected a Trainer state with a "log_history" list', key="log_history")
        for index, record in enumerate(history):
            self.record(f"log_history[{index}]", record)
        for key, name in (("max_steps", "planned_steps"), ("eval_steps", "eval_steps"), ("save_steps", "save_steps")):
            if type(state.get(key)) is int and state[key] > 0:
                self.extra[name] = state[key]
        best = state.get("best_model_checkpoint")
        if isinstance(best, str) and best:
            self.extra["best_checkpoint"] = best


def _there(path: Path) -> bool:
    """Something is at `path`, a FIFO, a device or a dangling link included (each is refused by name when read,
    never skipped as if absent)."""
    return os.path.lexists(path)


def log_file(path: Path) -> Path:
    """The metric log of RUN (a directory or the file itself)."""
    if not _there(path):
        raise InputError(path, "not found (expected a run directory, or a metrics.jsonl or trainer_state.json)")
    if not path.is_dir():  # a file, or a FIFO or device that read_text refuses
        return path
    for name in LOG_FILES:
        if _there(path / name):  # a FIFO or /dev/zero here is refused by name, not passed over
            return path / name
    saved = [p for _, p in checkpoints(path) if _there(p / TRAINER_STATE)]
    if saved:
        return saved[-1] / TRAINER_STATE
    raise InputError(
        path,
        f"holds no {layout.METRICS} or {TRAINER_STATE} (expected a sftdoctor run directory or a "
        "Trainer output directory)",
    )


# The settings of resolved.json the curves are judged against, and the JSON types each may have.
NUMBER, WHOLE, TEXT, TABLE = (int, float), (int,), (str,), (dict,)
PLAN_SHAPE = {
    "total_steps": WHOLE,
    "learning_rate": NUMBER,
    "lr_scheduler": TEXT,
    "lr_scheduler_kwargs": TABLE,
    "warmup": TABLE,
    "warmup_steps": WHOLE,
    "max_grad_norm": NUMBER,
    "save_steps": WHOLE,
    "eval_steps": WHOLE,
    "precision": TEXT,
    "deepspeed": TABLE,
}


def _plan(folder: Path) -> dict[str, Any]:
    """The run's resolved settings; {} for a Trainer's directory, which has none. One that is there but
    unreadable is bad input: read as "no settings", the schedule would pass unchecked."""
    path = folder / layout.RESOLVED
    if not _there(path):
        return {}
    try:
        plan = json.loads(read_text(path, "run record"))
    except (ValueError, RecursionError) as exc:
        raise InputError(path, f"not valid JSON ({parse_problem(exc)}); expected the run's resolved settings") from None
    if not isinstance(plan, dict):
        raise InputError(path, f"expected a JSON object (the run's resolved settings), got {type(plan).__name__}")
    for key, types in PLAN_SHAPE.items():
        value = plan.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise InputError(path, f"expected {' or '.join(t.__name__ for t in types)}, got {value!r}", key=key)
        if types is NUMBER and value is not None and not math.isfinite(value):  # a tolerance of inf passes anything
            raise InputError(path, f"expected a finite number, got {value!r}", key=key)
    return plan


def _stopped(folder: Path, problems: list[str]) -> dict[str, Any] | None:
    """The watcher's record of why it stopped the run; one that cannot be read is said (in `problems`), never
    read as "not stopped"."""
    path = folder / layout.STOPPED
    if not _there(path):
        return None
    try:
        record = json.loads(read_text(path, "stop record", limit=1 << 20))
    except InputError as exc:
        problems.append(f"{exc}; how the run ended is not known")
        return None
    except (ValueError, RecursionError) as exc:
        problems.append(f"{path}: not valid JSON ({parse_problem(exc)}); how the run ended is not known")
        return None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("id", "title")):
        problems.append(f'{path}: expected an object with "id" and "title" strings; how the run ended is not known')
        return None
    return record


def read_run(path: Path) -> dict[str, Any]:
    """The `curves` fact of one run (JSON-serialisable)."""
    path = Path(path)
    source = log_file(path)
    folder = path if path.is_dir() else source.parent
    reader = Reader(source)
    text = read_text(source, "metric log")
    (reader.trainer_state if source.name.endswith(".json") else reader.jsonl)(text)
    series = {name: s.to_json() for name, s in reader.series.items() if s.steps}
    if not series:
        raise InputError(
            source, 'holds no metric records (expected a "step" with "loss", "eval_loss" or "learning_rate")'
        )
    plan = _plan(folder)
    problems: list[str] = []
    saved = [(step, p) for step, p in checkpoints(folder)]
    marked = [step for step, p in saved if is_complete(p)]
    last = max(s["steps"][-1] for s in series.values())
    planned = reader.extra.get("planned_steps") or plan.get("total_steps")
    clip = _number(plan.get("max_grad_norm"))
    try:
        schedule = schedule_of(plan, planned) if plan else None
    except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:  # e.g. a min_lr_rate of "a"
        raise InputError(
            folder / layout.RESOLVED,
            "lr_scheduler, learning_rate, warmup and lr_scheduler_kwargs do "
            f"not make a schedule ({type(exc).__name__}: {exc})",
        ) from None
    return {
        # a log named on its own (runs/a-trainer_state.json) is called by its own name
        "name": source.stem if path.is_file() and source.name not in LOG_FILES else folder.name or str(folder),
        "path": str(folder),
        "source": source.name,
        "series": series,
        "schedule": schedule,
        "max_grad_norm": clip if clip is not None else reader.extra.get("max_grad_norm"),
        "precision": plan.get("precision"),
        "planned_steps": planned,
        "last_step": last,
        "save_steps": plan.get("save_steps") or reader.extra.get("save_steps"),
        "eval_steps": plan.get("eval_steps") or reader.extra.get("eval_steps"),
        # sftdoctor marks the checkpoints every rank finished; a Trainer's folders are all taken as they are
        "checkpoints": marked if plan else [step for step, _ in saved],
        "best_checkpoint": reader.extra.get("best_checkpoint"),
        "stopped": _stopped(folder, problems),
        "finished": (folder / "final").is_dir() and (not planned or last >= planned),
        "non_finite": {name: gone for name, values in series.items() if (gone := non_finite(values))},
        "problems": problems,  # what could not be read and was left out, each said in one line
    }
