"""What a sweep leaves: the table of trials, the best trial's run config, the pictures, the best runs' report.

- The table: each trial's number, state, objective, values and, for a pruned or failed one, the finding
  or the cause; an interrupted trial names the one that retried it.
- SWEEP_DIR/best.toml: the best trial's run config, with its own run directory (runs/best beside it): ready
  for `sftdoctor train`, e.g. with more steps.
- SWEEP_DIR/history.png (the objective of each trial and the best so far; pruned trials at their last
  evaluation) and importances.png (Optuna's fANOVA importances, from two complete trials and two keys on):
  matplotlib's object API on the Agg canvas, as the run report draws.
- SWEEP_DIR/report/: `sftdoctor report` of the best three complete runs overlaid.

Every file is written beside and renamed into place: two workers ending together leave whole files.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sftdoctor.files import write_atomic
from sftdoctor.sweep.config import Sweep, dumps, show
from sftdoctor.sweep.study import retried
from sftdoctor.sweep.trial import trial_dir

BEST, HISTORY, IMPORTANCES, REPORT = "best.toml", "history.png", "importances.png", "report"
OVERLAID = 3
COMPLETE, PRUNED, BEST_COLOUR = "#1f77b4", "#999999", "#d62728"


def objective_name(sweep: Sweep) -> str:
    return "eval_loss" if sweep.task_metric is None else sweep.objective.removeprefix("eval:")


def state_of(t, retries: dict[int, int]) -> str:
    from optuna.trial import TrialState

    if t.state == TrialState.FAIL and t.number in retries:
        return "interrupted"
    return {
        TrialState.COMPLETE: "complete",
        TrialState.PRUNED: "pruned",
        TrialState.FAIL: "failed",
        TrialState.RUNNING: "running",
        TrialState.WAITING: "waiting",
    }[t.state]


def why_of(t, retries: dict[int, int]) -> str:
    if t.number in retries:
        return f"retried as trial {retries[t.number]}" + (
            f" ({t.user_attrs['interrupted']})" if t.user_attrs.get("interrupted") else ""
        )
    why = t.user_attrs.get("why")
    if state_of(t, retries) == "complete" and not finite(t.value):
        return f"not ranked: its objective is {t.value} (not a number to compare)"
    if isinstance(why, dict) and why.get("title") and state_of(t, retries) in ("pruned", "failed"):
        if why.get("id") in ("pruner", "objective", "run"):
            return why["title"]
        return f"{why['id']}: {why['title']}"
    if t.user_attrs.get("host") and show_running(t):
        return f"on {t.user_attrs['host']} (pid {t.user_attrs.get('pid')})"
    return ""


def show_running(t) -> bool:
    from optuna.trial import TrialState

    return t.state == TrialState.RUNNING


def table(study, sweep: Sweep) -> str:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retries = {t.user_attrs["retry_of"]: t.number for t in trials if isinstance(t.user_attrs.get("retry_of"), int)}
    names = [d.name for d in sweep.space]
    header = ["trial", "state", objective_name(sweep), *names, "why pruned or failed"]
    rows = [header]
    for t in trials:
        # a pruned trial's value is its last evaluation's (Optuna's), shown in parentheses
        value = "-" if t.value is None else f"{t.value:.4f}" if t.state == TrialState.COMPLETE else f"({t.value:.4f})"
        params = t.params or t.system_attrs.get("fixed_params") or {}  # a waiting retry's values are fixed ones
        rows.append(
            [
                str(t.number),
                state_of(t, retries),
                value,
                *[show(params[n]) if n in params else "-" for n in names],
                why_of(t, retries),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join([c.ljust(w) for c, w in zip(r[:-1], widths)] + [r[-1]]).rstrip() for r in rows)


def counts(study) -> str:
    trials = study.get_trials(deepcopy=False)
    again = retried(trials)
    states = [state_of(t, {n: 0 for n in again}) for t in trials]
    order = ("complete", "pruned", "failed", "interrupted", "running", "waiting")
    return ", ".join(f"{states.count(s)} {s}" for s in order if states.count(s))


def ranked_trials(study) -> list:
    """The complete trials whose objective is a finite number, best first. A NaN compares false with every
    number, so a sort would put it anywhere (first, as often as not), and an infinite loss is no result: such a
    trial is shown in the table with its value and never ranked."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if finite(t.value)]
    return sorted(done, key=lambda t: t.value, reverse=study.direction.name == "MAXIMIZE")


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def best(study):
    ranked = ranked_trials(study)
    return (ranked[0] if ranked else None), ranked


def write_best(sweep: Sweep, trial) -> Path:
    """The best trial's run config, its run directory runs/best beside best.toml (not the trial's own: that one
    holds the trial's checkpoints)."""
    raw = sweep.trial_raw(dict(trial.params), sweep.output_dir / "runs" / "best")
    header = (
        f"The best trial of the sweep {sweep.path} (study {sweep.study!r}): trial {trial.number}, "
        f"{objective_name(sweep)} {trial.value:.6g}\n"
        + "\n".join(f"{name} = {show(value)}" for name, value in trial.params.items())
        + f"\nIts run: {trial_dir(sweep, trial.number)}. Train it: sftdoctor train {sweep.output_dir / BEST}"
    )
    path = sweep.output_dir / BEST
    write_atomic(path, dumps(raw, header).encode("utf-8"))
    return path


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def history_png(study, sweep: Sweep) -> bytes:
    from optuna.trial import TrialState

    figure = _figure(9, 4.2)
    ax = figure.add_axes((0.09, 0.13, 0.88, 0.76))
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE and finite(t.value)]
    pruned = [t for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)) if t.intermediate_values]
    maximize = study.direction.name == "MAXIMIZE"
    ax.scatter([t.number for t in done], [t.value for t in done], color=COMPLETE, s=28, zorder=3, label="complete")
    if pruned:
        last = [t.intermediate_values[max(t.intermediate_values)] for t in pruned]
        ax.scatter(
            [t.number for t in pruned],
            last,
            facecolors="none",
            edgecolors=PRUNED,
            s=28,
            zorder=2,
            label="pruned (its last evaluation)",
        )
    if done:
        ordered = sorted(done, key=lambda t: t.number)
        xs, ys, so_far = [], [], None
        for t in ordered:
            so_far = t.value if so_far is None else (max(so_far, t.value) if maximize else min(so_far, t.value))
            xs.append(t.number)
            ys.append(so_far)
        ax.step(xs, ys, where="post", color=BEST_COLOUR, linewidth=1.4, label="best so far")
    ax.set_title(f"Optimization history: {objective_name(sweep)} ({sweep.direction})", fontsize=11, loc="left")
    ax.set_xlabel("trial", fontsize=9)
    ax.set_ylabel(objective_name(sweep), fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best", framealpha=0.8)
    return _png(figure)


def importances(study, sweep: Sweep) -> tuple[dict[str, float] | None, str]:
    """Optuna's parameter importances (over the trials of a finite objective, as Optuna filters), or why there
    are none."""
    done = ranked_trials(study)
    if len(sweep.space) < 2:
        return None, "one key in the space: nothing to compare it with"
    if len(done) < 2:
        return None, f"{len(done)} complete trial{'s' if len(done) != 1 else ''}: importances need 2 or more"
    import optuna

    try:
        return optuna.importance.get_param_importances(study, params=[d.name for d in sweep.space]), ""
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return None, f"optuna could not compute them: {exc}"


def importances_png(values: dict[str, float], sweep: Sweep) -> bytes:
    names = list(reversed(list(values)))
    height = 1.1 + 0.4 * len(names)
    figure = _figure(9, height)
    ax = figure.add_axes((0.3, 0.55 / height, 0.65, 1 - 0.95 / height))
    ax.barh(names, [values[n] for n in names], color=COMPLETE)
    for i, n in enumerate(names):
        ax.annotate(
            f"{values[n]:.2f}", (values[n], i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
        )
    ax.set_title(f"Parameter importances for {objective_name(sweep)} (fANOVA)", fontsize=11, loc="left")
    ax.set_xlabel("importance", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_xlim(0, max(1.0, max(values.values()) * 1.1))
    ax.grid(True, axis="x", alpha=0.3)
    return _png(figure)


@dataclass
class Written:
    best: Any = None  # the best FrozenTrial
    best_toml: Path | None = None
    pictures: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "importances.png: why"
    report: Path | None = None


def write(study, sweep: Sweep, plugins: bool = True) -> Written:
    out = Written()
    folder = sweep.output_dir
    top, ranked = best(study)
    if top is not None:
        out.best, out.best_toml = top, write_best(sweep, top)
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        out.skipped.append("pictures and report: matplotlib is not installed (pip install 'sftdoctor[report]')")
        return out
    if study.get_trials(deepcopy=False):
        write_atomic(folder / HISTORY, history_png(study, sweep))
        out.pictures.append(folder / HISTORY)
    values, why = importances(study, sweep)
    if values:
        write_atomic(folder / IMPORTANCES, importances_png(values, sweep))
        out.pictures.append(folder / IMPORTANCES)
    else:
        (folder / IMPORTANCES).unlink(missing_ok=True)
        out.skipped.append(f"{IMPORTANCES}: {why}")
    runs = [
        trial_dir(sweep, t.number)
        for t in ranked[:OVERLAID]
        if (trial_dir(sweep, t.number) / "metrics.jsonl").is_file()
    ]
    if runs:
        from sftdoctor.report.command import build

        try:
            out.report = build(runs, folder / REPORT, "step", plugins).html
        except Exception as exc:  # a broken metrics line: the sweep's results stand without the report
            out.skipped.append(f"{REPORT}/: {type(exc).__name__}: {exc}")
    return out
