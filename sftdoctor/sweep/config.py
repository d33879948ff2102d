"""SWEEP.toml: a base run config, a search space over its keys, an objective and a budget.

    [sweep]
    base = "run.toml"           # the run config every trial starts from (relative to this file)
    objective = "eval_loss"     # or "eval:TASK/METRIC": a metric `sftdoctor eval` writes for a task
                                # of the base's [eval]
    trials = 16                 # the budget, over every worker

    [space]
    training.learning_rate = {log_uniform = [1e-6, 1e-4]}
    training.warmup_ratio = {choices = [0.0, 0.03, 0.1]}
    lora.r = {choices = [8, 16, 64]}

Every key of the space is a run-config key (`SECTION.KEY`, written dotted, quoted or as [space.SECTION]
tables), checked against the run-config schema: an unknown one gets a did-you-mean, and every value the
space can give must pass the key's own validator. Every problem is reported at once, one line each.
Importing this module is cheap (no optuna, no torch).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from sftdoctor.errors import InputError, InputErrors, did_you_mean, parse_problem, read_text
from sftdoctor.facts import launch_inputs
from sftdoctor.files import folder_problem
from sftdoctor.run.config import (
    SECTIONS,
    Key,
    RunConfig,
    Section,
    _bool,
    _choice,
    _int,
    _str,
    key,
    keys,
    read_section,
    unknown_key,
    unknown_section,
    validate,
)
from sftdoctor.run.data_source import HUB, kind_of
from sftdoctor.run.resolve import eval_interval

OBJECTIVE = re.compile(r"eval:([^/\s]+)/(.+)")
KINDS = ("choices", "uniform", "log_uniform", "int", "log_int")
STEPPED = ("uniform", "int")  # the kinds that take a `step`
NOT_SWEPT = {("training", "output_dir"): "the sweep gives each trial its own run directory (SWEEP_DIR/trial-NNNN)"}
MAX_BUDGET = 100_000


def _objective(v: Any) -> bool:
    return v == "eval_loss" or (isinstance(v, str) and bool(OBJECTIVE.fullmatch(v)))


def _name(v: Any) -> bool:
    return isinstance(v, str) and bool(re.fullmatch(r"[\w.-]{1,128}", v))


@dataclass(frozen=True)
class SweepSection(Section):
    base: str = key(
        "a path to a run config (TOML)",
        _str,
        required=True,
        path="file",
        doc="the run config every trial starts from; the space's keys override it",
    )
    objective: str = key(
        '"eval_loss" or "eval:TASK/METRIC"',
        _objective,
        "eval_loss",
        doc="the loss of the run's last evaluation, or a metric of an lm-eval task of the base's [eval]",
    )
    direction: str | None = key(
        "one of minimize, maximize",
        _choice("minimize", "maximize"),
        doc="default: minimize for eval_loss, maximize for an eval: metric",
    )
    trials: int | None = key(
        f"an integer from 1 to {MAX_BUDGET}",
        _int(1, MAX_BUDGET),
        doc="the budget: trials that finished (complete, pruned or failed), over every worker; "
        "default with the grid sampler: every point of the grid",
    )
    sampler: str | None = key(
        "one of tpe, random, grid",
        _choice("tpe", "random", "grid"),
        doc="default: grid when every key of the space has choices, else tpe",
    )
    pruner: str | None = key(
        "one of median, hyperband, none",
        _choice("median", "hyperband", "none"),
        doc="stops trials whose eval loss lags; default median (none with an eval: objective)",
    )
    seed: int = key("an integer from 0 to 4294967295", _int(0, 2**32 - 1), 0)
    narrow: bool = key(
        "true or false", _bool, True, doc="drop the choices that cannot fit the GPUs (the memory plan) before sampling"
    )
    study: str | None = key("a study name (letters, digits, _ . -)", _name, doc="default: this file's name")
    output_dir: str = key(
        "a folder path",
        _str,
        "",
        path="dir",
        doc="the sweep directory: the study, one run directory per trial, the results "
        "(default sweeps/<this file's name>)",
    )


@dataclass(frozen=True)
class Dim:
    """One key of the space and what it may take."""

    section: str
    key: str
    kind: str  # one of KINDS
    choices: tuple[Any, ...] = ()
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def log(self) -> bool:
        return self.kind.startswith("log_")

    def candidates(self) -> tuple[Any, ...]:
        """The values that bound what the dimension gives: its choices, or its range's two ends."""
        return self.choices if self.kind == "choices" else (self.low, self.high)

    def with_choices(self, choices: tuple[Any, ...]) -> Dim:
        return dataclasses.replace(self, choices=tuple(choices))

    def describe(self) -> str:
        if self.kind == "choices":
            return "choices " + ", ".join(show(v) for v in self.choices)
        step = f" step {show(self.step)}" if self.step is not None else ""
        return f"{self.kind.replace('_', '-')} {show(self.low)} to {show(self.high)}{step}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == "choices":
            out["choices"] = list(self.choices)
        else:
            out.update(low=self.low, high=self.high, step=self.step)
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Dim:
        section, _, name = doc["name"].partition(".")
        return cls(
            section,
            name,
            doc["kind"],
            tuple(doc.get("choices") or ()),
            doc.get("low"),
            doc.get("high"),
            doc.get("step"),
        )


def display(path: Path | str) -> str:
    """A path as the lines show it: relative to the working directory when it is below it."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else os.path.normpath(path)


def show(value: Any) -> str:
    """A value as the table and the lines show it: 4 significant digits for a float."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@dataclass(frozen=True)
class Sweep:
    path: Path
    base_path: Path
    base: RunConfig
    base_raw: dict[str, dict[str, Any]]  # the base's tables, its paths made absolute, without output_dir
    space: tuple[Dim, ...]
    objective: str
    direction: str
    trials: int  # the budget (the grid's size at most, with the grid sampler)
    sampler: str
    pruner: str
    seed: int
    narrow: bool
    study: str
    output_dir: Path
    notes: tuple[str, ...] = field(default=())  # said once when the sweep starts

    @property
    def task_metric(self) -> tuple[str, str] | None:
        match = OBJECTIVE.fullmatch(self.objective)
        return (match[1], match[2]) if match else None

    def trial_raw(self, params: dict[str, Any], run_dir: Path) -> dict[str, dict[str, Any]]:
        """The run config of one trial: the base, the point's values, the trial's run directory."""
        return point_raw(self.base_raw, self.space, params, run_dir, self.path.parent)

    def fingerprint(self) -> str:
        """What makes two trials comparable: the base, the space, the objective and its direction (not the
        budget, the sampler or the pruner, which a rerun may change)."""
        doc = {
            "base": self.base_raw,
            "space": [d.to_json() for d in self.space],
            "objective": self.objective,
            "direction": self.direction,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def grid_size(space: tuple[Dim, ...]) -> int:
    return math.prod(len(d.choices) for d in space)


def point_raw(
    base_raw: dict[str, dict[str, Any]], space: tuple[Dim, ...], params: dict[str, Any], run_dir: Path, folder: Path
) -> dict[str, dict[str, Any]]:
    raw = copy.deepcopy(base_raw)
    for dim in space:
        if dim.name in params:
            raw.setdefault(dim.section, {})[dim.key] = _resolved(dim, params[dim.name], folder)
    raw.setdefault("training", {})["output_dir"] = str(run_dir)
    return raw


def _resolved(dim: Dim, value: Any, folder: Path) -> Any:
    """A path the space gives, relative to the sweep file, made absolute (a hub id is kept)."""
    spec = keys(SECTIONS[dim.section])[dim.key]
    if isinstance(value, str) and (spec.path or spec.local_or_hub):
        local = folder / Path(value).expanduser()
        if spec.path == "dir" or _exists(local):
            return os.path.abspath(local)
    return value


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def load_sweep(path: Path) -> Sweep:
    path = Path(path)
    text = read_text(path, "TOML sweep file")
    try:
        raw = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(path, f"not valid TOML: {parse_problem(exc)}") from None
    return validate_sweep(raw, path)


def validate_sweep(raw: dict[str, Any], path: Path) -> Sweep:
    """Check every table and key; return the sweep (defaults filled, the base read, paths resolved)."""
    path = Path(path)
    errors: list[InputError] = []
    for name, value in raw.items():
        if name not in ("sweep", "space"):
            errors.append(
                InputError(
                    path,
                    f"unknown table; expected [sweep] and [space]{did_you_mean(name, ('sweep', 'space'))}",
                    key=f"[{name}]",
                )
            )
        elif not isinstance(value, dict):
            errors.append(InputError(path, "expected a table", key=name))
    given = raw.get("sweep") if isinstance(raw.get("sweep"), dict) else {}
    section = read_section(SweepSection, "sweep", given, path, errors)
    space_raw = raw.get("space") if isinstance(raw.get("space"), dict) else None
    if space_raw is None and "space" not in raw:
        errors.append(
            InputError(
                path,
                "missing; expected the keys to search, e.g. training.learning_rate = {log_uniform = [1e-6, 1e-4]}",
                key="[space]",
            )
        )
    space = read_space(space_raw or {}, path, errors) if space_raw is not None else ()
    if space_raw is not None and not space_raw:
        errors.append(InputError(path, "empty; expected at least one key to search", key="[space]"))
    base, base_raw = None, None
    if section.is_given("base") and not any(e.key == "[sweep].base" for e in errors):
        base, base_raw = _read_base(Path(section.base), path, errors)
    if errors:
        raise InputErrors(errors)
    return _assemble(section, space, base, base_raw, path)


def _read_base(base_path: Path, path: Path, errors: list[InputError]) -> tuple[RunConfig | None, dict | None]:
    """The base run config, checked as `sftdoctor train` checks it (its own errors name its own file)."""
    text = read_text(base_path, "TOML run config")
    try:
        raw = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:
        errors.append(InputError(base_path, f"not valid TOML: {parse_problem(exc)}"))
        return None, None
    try:
        run = validate(raw, base_path)
    except InputErrors as exc:
        errors.extend(exc.errors)
        return None, None
    problem = launch_inputs.reporter_problem(run.report.to)  # as every trial's gate refuses it (the hub: at the gate)
    if problem:
        errors.append(InputError(base_path, problem, key="[report].to"))
    return run, absolute(raw, run)


def absolute(raw: dict[str, Any], run: RunConfig) -> dict[str, dict[str, Any]]:
    """The run config's tables with every path made absolute (a trial's run.toml lives elsewhere), and without
    [training] output_dir (each trial has its own)."""
    out: dict[str, dict[str, Any]] = {}
    for name, values in raw.items():
        specs, resolved = keys(SECTIONS[name]), getattr(run, name)
        out[name] = {}
        for k, value in values.items():
            if (name, k) == ("training", "output_dir"):
                continue
            spec = specs[k]
            if spec.path or spec.local_or_hub:
                value = getattr(resolved, k)
                if isinstance(value, tuple) and spec.path == "data" and kind_of(value) == HUB:
                    value = value[0]  # a hub dataset id, kept as written
                elif isinstance(value, tuple):
                    value = [os.path.abspath(v) for v in value]
                elif spec.path or _exists(Path(value)):
                    value = os.path.abspath(value)
            out[name][k] = value
    return out


def read_space(raw: dict[str, Any], path: Path, errors: list[InputError]) -> tuple[Dim, ...]:
    dims = []
    for name, section, spec in _entries(raw, path, errors):
        dim = _dim(name, section, spec, path, errors)
        if dim is not None:
            dims.append(dim)
    return tuple(dims)


def _entries(raw: dict[str, Any], path: Path, errors: list[InputError]):
    """(SECTION.KEY, SECTION, its table) of each entry, however TOML nested it: `training.lr = {...}` and
    [space.training] both make a table of tables, `"training.lr" = {...}` a dotted name."""
    for outer, value in raw.items():
        if "." in outer:
            yield outer, outer.partition(".")[0], value
        elif isinstance(value, dict) and value and not any(k in KINDS or k == "step" for k in value):
            for inner, spec in value.items():
                yield f"{outer}.{inner}", outer, spec
        else:
            errors.append(
                InputError(
                    path,
                    "expected a run-config key SECTION.KEY = {choices = [...]}, "
                    "e.g. training.learning_rate = {log_uniform = [1e-6, 1e-4]}",
                    key=f"[space].{outer}",
                )
            )


def _dim(name: str, section: str, spec: Any, path: Path, errors: list[InputError]) -> Dim | None:
    where = f"[space].{name}"
    _, _, k = name.partition(".")
    if section not in SECTIONS:
        errors.append(
            InputError(
                path, f"{unknown_section(section)} (the space's keys are run-config keys, SECTION.KEY)", key=where
            )
        )
        return None
    specs = keys(SECTIONS[section])
    if k not in specs:
        errors.append(InputError(path, f"{unknown_key(k, specs)} (of [{section}])", key=where))
        return None
    if (section, k) in NOT_SWEPT:
        errors.append(InputError(path, f"not searched: {NOT_SWEPT[(section, k)]}", key=where))
        return None
    if not isinstance(spec, dict):
        errors.append(
            InputError(
                path,
                f"expected a table: {{choices = [...]}}, or a range "
                f"{{uniform|log_uniform|int|log_int = [LOW, HIGH]}}, got {spec!r}",
                key=where,
            )
        )
        return None
    kinds = [x for x in spec if x in KINDS]
    for other in (x for x in spec if x not in KINDS and x != "step"):
        errors.append(
            InputError(
                path,
                f"unknown entry {other!r}{did_you_mean(other, KINDS + ('step',))}; expected "
                f"one of {', '.join(KINDS)} (and step)",
                key=where,
            )
        )
    if len(kinds) != 1:
        if not any(x not in KINDS and x != "step" for x in spec):
            errors.append(
                InputError(
                    path, f"expected exactly one of {', '.join(KINDS)}, got {', '.join(kinds) or 'none'}", key=where
                )
            )
        return None
    kind, value, step = kinds[0], spec[kinds[0]], spec.get("step")
    key_spec = specs[k]
    count = len(errors)
    if kind == "choices":
        dim = _choices(section, k, value, key_spec, path, where, errors)
    else:
        dim = _range(section, k, kind, value, step, key_spec, path, where, errors)
    if "step" in spec and kind not in STEPPED:
        errors.append(InputError(path, f"step goes with uniform or int, not {kind}", key=where))
    return dim if len(errors) == count else None


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))


def _choices(
    section: str, k: str, value: Any, spec: Key, path: Path, where: str, errors: list[InputError]
) -> Dim | None:
    if not isinstance(value, list) or not value:
        errors.append(InputError(path, f"choices: expected a non-empty list of values, got {value!r}", key=where))
        return None
    for v in value:
        if not _scalar(v):
            errors.append(
                InputError(path, f"choices: {v!r} is not a single value (a string, number or boolean)", key=where)
            )
        elif not spec.accepts(v):
            errors.append(
                InputError(path, f"choices: {v!r} is not a value of {section}.{k}: expected {spec.expected}", key=where)
            )
    typed = [(type(v).__name__, v) for v in value if _scalar(v)]
    if len(set(typed)) != len(typed):
        errors.append(InputError(path, "choices: a value is given twice", key=where))
    return Dim(section, k, "choices", tuple(value))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _range(
    section: str, k: str, kind: str, value: Any, step: Any, spec: Key, path: Path, where: str, errors: list[InputError]
) -> Dim | None:
    ints = kind in ("int", "log_int")
    problem = (
        _bounds_problem(kind, value, ints)
        or _step_problem(value, step, ints)
        or _values_problem(section, k, kind, value, step, spec, ints)
    )
    if problem:
        errors.append(InputError(path, problem, key=where))
        return None
    low, high = value
    return Dim(section, k, kind, (), low, high, step)


def _fits(v: Any, ints: bool) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) if ints else _number(v)


def _bounds_problem(kind: str, value: Any, ints: bool) -> str | None:
    """What is wrong with [LOW, HIGH] itself, if anything."""
    if not isinstance(value, list) or len(value) != 2 or not all(_fits(v, ints) for v in value):
        what = "integers" if ints else "numbers"
        return f"{kind}: expected [LOW, HIGH], two {what}, got {value!r}"
    low, high = value
    if low >= high:
        return f"{kind}: empty range [{show(low)}, {show(high)}]: LOW must be below HIGH (one value: choices = [...])"
    if kind.startswith("log_") and low <= 0:
        return f"{kind}: a log range needs bounds above 0, got [{show(low)}, {show(high)}]"
    return None


def _step_problem(value: list, step: Any, ints: bool) -> str | None:
    """What is wrong with the step, if one is given: not positive, or not dividing the range."""
    if step is None:
        return None
    if not _fits(step, ints) or step <= 0:
        return f"step: expected a positive {'integer' if ints else 'number'}, got {step!r}"
    low, high = value
    count = (high - low) / step
    if not math.isfinite(count) or abs(count - round(count)) > 1e-9 * max(1.0, abs(count)):
        return f"step {show(step)} does not divide the range [{show(low)}, {show(high)}]"
    return None


def _values_problem(section: str, k: str, kind: str, value: list, step: Any, spec: Key, ints: bool) -> str | None:
    """A bound the key does not take, or (a float range) a value between that it does not take."""
    low, high = value
    for bound in (low, high):
        if not spec.accepts(bound):
            return f"{kind}: {show(bound)} is not a value of {section}.{k}: expected {spec.expected}"
    if ints:
        return None
    # a value between, as optuna gives it (a float): a float key takes it, an integer key does not
    if kind == "log_uniform":
        inside = math.exp(math.log(low) + (math.log(high) - math.log(low)) * 0.37)
    else:
        inside = low + (high - low) * 0.37 if step is None else low + step
    if not spec.accepts(float(inside)):
        return (
            f"{kind} gives values like {float(inside)!r}, which {section}.{k} does not "
            f"take (expected {spec.expected}): use int = [...] or choices"
        )
    return None


def _assemble(section: SweepSection, space: tuple[Dim, ...], base: RunConfig, base_raw: dict, path: Path) -> Sweep:
    errors: list[InputError] = []
    notes: list[str] = []
    match = OBJECTIVE.fullmatch(section.objective)
    every_choice = all(d.kind == "choices" for d in space)
    sampler = section.sampler or ("grid" if every_choice else "tpe")
    if sampler == "grid" and not every_choice:
        ranged = next(d for d in space if d.kind != "choices")
        errors.append(
            InputError(
                path,
                f"the grid sampler needs choices for every key: {ranged.name} is a {ranged.kind} range",
                key="[sweep].sampler",
            )
        )
    pruner = section.pruner or ("none" if match else "median")
    if match and pruner != "none":
        errors.append(
            InputError(
                path,
                f"an {section.objective} objective is measured once, after the run: a pruner "
                'has nothing to compare during it (pruner = "none", or objective = '
                '"eval_loss")',
                key="[sweep].pruner",
            )
        )
    if match:
        errors += _task_objective(section, match[1], base, path)
    else:
        _loss_objective(section, space, base, path, errors, notes)
    errors += _points(space, base_raw, path)
    trials = _budget(section, space, sampler, path, errors, notes)
    output = _output_dir(section, path, errors)
    if errors:
        raise InputErrors(errors)
    return Sweep(
        path=path,
        base_path=Path(section.base),
        base=base,
        base_raw=base_raw,
        space=space,
        objective=section.objective,
        direction=section.direction or ("maximize" if match else "minimize"),
        trials=trials,
        sampler=sampler,
        pruner=pruner,
        seed=section.seed,
        narrow=section.narrow,
        study=section.study or _study_name(path),
        output_dir=output,
        notes=tuple(notes),
    )


def _task_objective(section: SweepSection, task: str, base: RunConfig, path: Path) -> list[InputError]:
    """An lm-eval objective: its task must be one the base evaluates."""
    tasks = base.eval.tasks if base.eval is not None else ()
    if task in tasks:
        return []
    return [
        InputError(
            path,
            f"objective {section.objective}: the base's [eval] tasks are "
            f"{', '.join(tasks) or 'none (no [eval] table)'}; add {task} to them "
            f"({section.base}){did_you_mean(task, tasks)}",
            key="[sweep].objective",
        )
    ]


def _loss_objective(
    section: SweepSection,
    space: tuple[Dim, ...],
    base: RunConfig,
    path: Path,
    errors: list[InputError],
    notes: list[str],
) -> None:
    """The eval_loss objective: the base must have eval data and evaluate before it stops."""
    swept = {d.name for d in space}
    evaluated = base.data.eval or base.data.eval_fraction or base.data.eval_split
    if not evaluated and not swept & {"data.eval", "data.eval_fraction", "data.eval_split"}:
        errors.append(
            InputError(
                path,
                f"objective eval_loss needs eval data: [data] eval, eval_fraction or eval_split in {section.base}",
                key="[sweep].objective",
            )
        )
    t = base.training
    every = eval_interval(base)
    if t.max_steps and every > t.max_steps and not swept & {"training.eval_steps", "training.max_steps"}:
        errors.append(
            InputError(
                path,
                f"objective eval_loss: the base evaluates every {every} steps "
                f"(eval_steps{'' if t.eval_steps else ', from save_steps'}) and stops at "
                f"step {t.max_steps}: no evaluation would run",
                key="[sweep].objective",
            )
        )
    elif t.max_steps and t.max_steps % every:
        notes.append(
            f"the objective is the loss of each run's last evaluation, at step "
            f"{t.max_steps // every * every} of {t.max_steps} (eval_steps {every} does not divide "
            "max_steps)"
        )


def _budget(
    section: SweepSection, space: tuple[Dim, ...], sampler: str, path: Path, errors: list[InputError], notes: list[str]
) -> int:
    """How many trials: the grid's size at most; required for the other samplers."""
    if sampler == "grid" and not errors:
        size = grid_size(space)
        if section.trials is not None and section.trials > size:
            notes.append(f"the grid has {size} points: the budget is {size}, not {section.trials}")
        return min(section.trials or size, size)
    if section.trials is None:
        errors.append(
            InputError(
                path,
                f"missing; expected {keys(SweepSection)['trials'].expected} (the budget: how many trials to run)",
                key="[sweep].trials",
            )
        )
        return 0
    return section.trials


def _output_dir(section: SweepSection, path: Path, errors: list[InputError]) -> Path:
    """The sweep's folder (its study, a run directory per trial), refused when it cannot be made, as `train`
    refuses a run's output_dir: before the first trial, and by --dry-run too."""
    output = Path(section.output_dir) if section.is_given("output_dir") else path.parent / "sweeps" / path.stem
    output = Path(os.path.abspath(output))  # the trials' run configs name it, from their own folders
    problem = folder_problem(output)
    if problem:
        errors.append(InputError(path, problem, key="[sweep].output_dir"))
    return output


def _study_name(path: Path) -> str:
    name = re.sub(r"[^\w.-]", "_", path.stem)[:128]
    return name or "sweep"


def _points(space: tuple[Dim, ...], base_raw: dict, path: Path) -> list[InputError]:
    """The base with each value of the space in turn (the other keys at their first), checked as a run config:
    a value that makes the run config invalid (a learning-rate floor with a schedule that has none, warmup_ratio
    beside warmup_steps) is bad input now, not a failed trial later."""
    if not space:
        return []
    first = {d.name: d.candidates()[0] for d in space}
    problems: dict[tuple[str, str], InputError] = {}
    for dim in space:
        for value in dim.candidates():
            raw = point_raw(base_raw, space, {**first, dim.name: value}, path.parent / "trial", path.parent)
            try:
                validate(raw, path)
            except InputErrors as exc:
                for e in exc.errors:
                    problems.setdefault(
                        (e.key or "", e.message),
                        InputError(
                            path,
                            f"with {dim.name} = {show(value)}, the trial's run config is invalid: "
                            f"{e.key + ': ' if e.key else ''}{e.message}",
                            key=f"[space].{dim.name}",
                        ),
                    )
    return list(problems.values())


# ---------------------------------------------------------------- writing a run config back as TOML

BARE = re.compile(r"[A-Za-z0-9_-]+")
ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in ESCAPES:
            out.append(ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no TOML form here")
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_key(name: str) -> str:
    return name if BARE.fullmatch(name) else toml_string(name)


def dumps(raw: dict[str, dict[str, Any]], header: str = "") -> str:
    """Tables of scalars and lists (a run config) as TOML text that tomllib reads back equal."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for name, values in raw.items():
        if lines:
            lines.append("")
        lines.append(f"[{toml_key(name)}]")
        lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"
