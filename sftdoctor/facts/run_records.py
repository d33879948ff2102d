"""A finished (or stopped) run read back: its metric series, its schedule, its checkpoints and findings.

The `curves` fact the post-run checks (the curve readers) and `sftdoctor report` work from. It reads:
- a sftdoctor run directory: metrics.jsonl, resolved.json (the schedule, the clipping threshold), findings.jsonl;
- a Hugging Face Trainer output directory or checkpoint: trainer_state.json's `log_history` (the newest
  checkpoint's when the directory holds only checkpoints);
- one of those files named directly, or a LLaMA-Factory `trainer_log.jsonl` (`current_steps`, `lr`).
A record logged again for a step already read (a resumed run appending to the same log) replaces the
earlier ones from that step on: a resume's records win.
"""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, parse_problem
from sftdoctor.run import rundir
from sftdoctor.run.checkpoints import checkpoints, is_complete
from sftdoctor.run.schedule import schedule_of

# What the curves need, by the names metrics.jsonl uses, and the other names logs use for them.
SERIES = ("loss", "eval_loss", "learning_rate", "grad_norm", "loss_scale", "tokens_per_second", "step_time_s",
          "padding_fraction", "memory_allocated_gib", "memory_reserved_gib", "host_rss_gib", "tokens_seen")
ALIASES = {"lr": "learning_rate", "num_input_tokens_seen": "tokens_seen", "num_tokens": "tokens_seen",
           "train_loss_step": "loss"}
NAMES = {**{name: name for name in SERIES}, **ALIASES}
STEP_KEYS = ("step", "current_steps", "global_step")
TRAINER_STATE = "trainer_state.json"
LOG_FILES = (rundir.METRICS, TRAINER_STATE, "trainer_log.jsonl")


def _number(value: Any) -> float | None:
    """JSON numbers, NaN and Infinity included (Python's json reads them); booleans and strings are not."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


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
            raise InputError(self.source, f"expected a \"step\" that is a whole number >= 0, got {step!r}", key=where)
        for key, name in NAMES.items():
            value = record.get(key)
            if type(value) is float or type(value) is int:  # not bool, not str; NaN and Infinity are floats
                self.series[name].add(step, float(value))
        if _number(record.get("max_grad_norm")) is not None:
            self.extra["max_grad_norm"] = float(record["max_grad_norm"])
        for key in ("max_steps", "total_steps"):  # sftdoctor's record (the Trainer's count); LLaMA-Factory's
            if type(record.get(key)) is int and record[key] > 0:
                self.extra["planned_steps"] = record[key]

    def jsonl(self, text: str) -> None:
        lines = text.split("\n")
        complete = lines[:-1] if lines and lines[-1] else lines  # a last line without its newline: a writer killed mid-line
        for number, line in enumerate(complete, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise InputError(self.source, f"expected one JSON object per line: {parse_problem(exc)}",
                                 key=f"line {number}") from None
            self.record(f"line {number}", record)

    def trainer_state(self, text: str) -> None:
        try:
            state = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InputError(self.source, f"expected JSON: {parse_problem(exc)}") from None
        history = state.get("log_history") if isinstance(state, dict) else None
        if not isinstance(history, list):
            raise InputError(self.source, "expected a Trainer state with a \"log_history\" list", key="log_history")
        for index, record in enumerate(history):
            self.record(f"log_history[{index}]", record)
        for key, name in (("max_steps", "planned_steps"), ("eval_steps", "eval_steps"), ("save_steps", "save_steps")):
            if isinstance(state.get(key), int) and state[key] > 0:
                self.extra[name] = state[key]
        best = state.get("best_model_checkpoint")
        if isinstance(best, str) and best:
            self.extra["best_checkpoint"] = best


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(path, f"cannot be read: {exc.strerror or exc}") from None


def log_file(path: Path) -> Path:
    """The metric log of RUN (a directory or the file itself)."""
    if not path.exists():
        raise InputError(path, "not found (expected a run directory, or a metrics.jsonl or trainer_state.json)")
    if path.is_file():
        return path
    for name in LOG_FILES:
        if (path / name).is_file():
            return path / name
    saved = [p for _, p in checkpoints(path) if (p / TRAINER_STATE).is_file()]
    if saved:
        return saved[-1] / TRAINER_STATE
    raise InputError(path, f"holds no {rundir.METRICS} or {TRAINER_STATE} (expected a sftdoctor run directory or a "
                           "Trainer output directory)")


# The settings of resolved.json the curves are judged against, and the JSON types each may have.
NUMBER, WHOLE, TEXT, TABLE = (int, float), (int,), (str,), (dict,)
PLAN_SHAPE = {"total_steps": WHOLE, "learning_rate": NUMBER, "lr_scheduler": TEXT, "lr_scheduler_kwargs": TABLE,
              "warmup": TABLE, "warmup_steps": WHOLE, "max_grad_norm": NUMBER, "save_steps": WHOLE,
              "eval_steps": WHOLE, "precision": TEXT, "deepspeed": TABLE}


def _plan(folder: Path) -> dict[str, Any]:
    """The run's resolved settings; {} for a Trainer's directory, which has none. One that is there but
    unreadable is bad input: read as "no settings", the schedule would pass unchecked."""
    path = folder / rundir.RESOLVED
    if not path.exists():
        return {}
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read the run's resolved settings: {getattr(exc, 'strerror', None) or exc}") from None
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


def _stopped(folder: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((folder / rundir.STOPPED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_run(path: Path) -> dict[str, Any]:
    """The `curves` fact of one run (JSON-serialisable)."""
    path = Path(path)
    source = log_file(path)
    folder = path if path.is_dir() else source.parent
    reader = Reader(source)
    text = _read(source)
    (reader.trainer_state if source.name.endswith(".json") else reader.jsonl)(text)
    series = {name: s.to_json() for name, s in reader.series.items() if s.steps}
    if not series:
        raise InputError(source, "holds no metric records (expected a \"step\" with \"loss\", \"eval_loss\" or "
                                 "\"learning_rate\")")
    plan = _plan(folder)
    saved = [(step, p) for step, p in checkpoints(folder)]
    marked = [step for step, p in saved if is_complete(p)]
    last = max(s["steps"][-1] for s in series.values())
    planned = reader.extra.get("planned_steps") or plan.get("total_steps")
    clip = _number(plan.get("max_grad_norm"))
    try:
        schedule = schedule_of(plan, planned) if plan else None
    except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:  # e.g. a min_lr_rate of "a"
        raise InputError(folder / rundir.RESOLVED, "lr_scheduler, learning_rate, warmup and lr_scheduler_kwargs do "
                                                   f"not make a schedule ({type(exc).__name__}: {exc})") from None
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
        "stopped": _stopped(folder),
        "finished": (folder / "final").is_dir() and (not planned or last >= planned),
    }
