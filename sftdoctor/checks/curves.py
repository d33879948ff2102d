"""Curve readers: post-run checks over a run's logged series (the `curves` fact, facts/run_records.py).

Each reads one curve the way a practitioner reads it on a dashboard, with robust statistics (medians, rank
correlation) so one noisy log does not decide. A reader with too few points to judge is skipped with the
count it needed. A warning names the step it starts at (`evidence["step"]`), where the report marks it.
Pure Python: `check` loads this module without numpy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.facts.run_records import non_finite, said
from sftdoctor.findings import Finding, error, ok, warning
from sftdoctor.run import schedule as schedules

LR_TOLERANCE = 0.02  # of the peak rate: a logged rate this close to the schedule's follows it
REVERSAL = 0.05  # of the peak rate: a rise after the peak this large is a swing, not float noise
CLIPPED_SHARE, CLIPPED_BY = 0.5, 1.1  # "clipped on most steps": above the threshold by more than a tenth
TRAINER_MAX_GRAD_NORM = 1.0  # TrainingArguments' default, for a Trainer's log that does not record its own
RISING_RHO, RISING_RATIO = 0.6, 1.5  # grad norm over the last third: rank correlation with the step, and growth
PATIENCE = 3  # evaluations after the best eval loss before a rise is overfitting
PLATEAU_DROP, PLATEAU_RHO = 0.05, -0.5  # fell less than this share, with no steady downward trend: never learned
THROUGHPUT_DROP = 2 / 3  # "dropping by more than a third"
LEAK_SHARE, LEAK_RHO, LEAK_GROWTH = 0.5, 0.8, 0.05  # share of intervals that rose, rank correlation, growth
LEAK_MIN_GIB = {"memory_allocated_gib": 0.1, "host_rss_gib": 0.25}


WHAT = {
    "loss": "the train loss",
    "eval_loss": "the eval loss",
    "learning_rate": "the learning rate",
    "grad_norm": "the gradient norm",
    "tokens_per_second": "the throughput",
    "memory_allocated_gib": "the GPU memory",
    "host_rss_gib": "the host memory",
}
TRAINING = ("loss", "eval_loss", "learning_rate", "grad_norm")  # a non-finite one of these: the run is broken


def overflows(curves: dict[str, Any], name: str) -> bool:
    """Infinite gradient norms of an fp16 run whose loss stayed finite: steps the loss scaler skipped (the
    norm of an overflowed step is inf by design), not a broken run."""
    series = curves["series"].get(name)
    if name != "grad_norm" or curves.get("precision") != "fp16" or not series:
        return False
    return non_finite(curves["series"].get("loss")) is None and all(
        v == math.inf for v in series["values"] if not math.isfinite(v)
    )


def points(curves: dict[str, Any], name: str) -> tuple[list[int], list[float]]:
    """The (step, value) pairs of one series. A reader never judges over a NaN or an infinity: a series with
    one is not judged here, and its own reader says where it went (`went_non_finite`)."""
    series = curves["series"].get(name) or {"steps": [], "values": []}
    gone = non_finite(series)
    if gone and not overflows(curves, name):
        raise NotApplicable(f"{WHAT.get(name, name)} is {said(gone)}: not judged over those")
    pairs = [(s, v) for s, v in zip(series["steps"], series["values"]) if math.isfinite(v)]
    return [s for s, _ in pairs], [v for _, v in pairs]


NON_FINITE = {"non-finite": "the series holds a NaN or an infinity: not judged over it"}


def went_non_finite(curves: dict[str, Any], name: str, check: str) -> Finding | None:
    """The finding of a series that holds a NaN or an infinity (the reader of that series returns it instead of
    a verdict over the rest): an error for the loss, the rate and the norm, a warning for the others. `check`:
    the id of the check that reads it, whose message `non-finite` this is."""
    gone = non_finite(curves["series"].get(name))
    if gone is None or overflows(curves, name):
        return None
    if name not in TRAINING:
        return warning(
            f"{WHAT[name]} is {said(gone)}",
            detail="A NaN or infinite reading is no number to judge: "
            "the logger divided by a zero duration or read a failed counter.",
            fix="look at the run's log around that step; the training's own numbers are judged apart",
            evidence={**gone, "series": name},
            id=f"{check}/non-finite",
        )
    return error(
        f"{WHAT[name]} is {said(gone)}",
        detail="A NaN or infinite value is no number to judge: the curve readers do not read the series over it, "
        "and the panels leave a gap there.",
        fix=f"resume from the last checkpoint before step {gone['step']} with a lower learning_rate or a longer "
        "warmup (bf16 rather than fp16); if the learning rate itself is non-finite, the schedule or a callback "
        "computed it: see the run's settings",
        explain="nan-loss",
        evidence={**gone, "series": name},
        id=f"{check}/non-finite",
    )


def curve_check(
    id: str,
    summary: str,
    series: str | Callable[[dict[str, Any]], str],
    messages: dict[str, str],
    needs: tuple[int, str] | None = None,
):
    """Declare a post-run reader of one logged series (`series`: its name, or a function of the curves that
    names it), called as reader(curves, steps, values) with the series' finite points. A series that holds a NaN
    or an infinity gets its own finding (`went_non_finite`, the message `non-finite`) instead of the reader's
    verdict over the rest; one with fewer points than `needs` (how many, and what they are) is not judged."""

    def mark(reader: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
        def read(curves: dict[str, Any]):
            name = series(curves) if callable(series) else series
            gone = went_non_finite(curves, name, id)
            if gone is not None:
                return gone
            steps, values = points(curves, name)
            if needs is not None:
                enough(values, *needs)
            return reader(curves, steps, values)

        # not functools.wraps: the registry would read the facts from the reader's signature behind __wrapped__
        read.__name__, read.__qualname__, read.__doc__ = reader.__name__, reader.__qualname__, reader.__doc__
        return check(id, summary, phase="postrun", messages={**NON_FINITE, **messages})(read)

    return mark


def enough(values: list, needed: int, what: str) -> None:
    if len(values) < needed:
        raise NotApplicable(f"{len(values)} logged {what}: too few to judge ({needed} needed)")


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2
        i = j + 1
    return result


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation: how consistently ys rise with xs, whatever the shape."""
    if len(xs) < 3:
        return 0.0
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else 0.0


def _g(value: float) -> str:
    return f"{value:.3g}"


# ---------------------------------------------------------------- learning rate


def reversals(values: list[float], swing: float) -> list[int]:
    """Indices where the curve turns back up after falling (or down after rising) by more than `swing`."""
    turns, direction, extreme = [], 0, values[0]
    for i, v in enumerate(values):
        if direction >= 0 and v < extreme - swing:
            if direction > 0:
                turns.append(i)
            direction, extreme = -1, v
        elif direction <= 0 and v > extreme + swing:
            if direction < 0:
                turns.append(i)
            direction, extreme = 1, v
        elif (direction >= 0 and v > extreme) or (direction < 0 and v < extreme):
            extreme = v
    return turns


def best_offset(schedule: dict[str, Any], steps: list[int], lrs: list[float], lag: int) -> int:
    """Steps the logged rates lag the schedule by: 1 under transformers 5.x (the rate of the step just taken),
    0 under 4.x; more under fp16, whose skipped steps do not step the scheduler."""
    every = max(1, len(steps) // 2000)  # a sample decides it as well as every point

    def error(offset: int) -> float:
        return sum(
            abs(lr - schedules.rate(schedule, max(0, s - offset))) for s, lr in zip(steps[::every], lrs[::every])
        )

    return min(range(0, 2 + lag), key=error)


@curve_check(
    "lr-curve",
    "the logged learning rate against the configured schedule: its warmup, its floor, no oscillation",
    "learning_rate",
    messages={
        "oscillates": "the learning rate turns back after its peak",
        "below-floor": "the learning rate fell below its floor",
        "wrong-end": "the learning rate ended elsewhere than the schedule's end value",
        "no-warmup": "no warmup: the rate was high from the start",
        "off-schedule": "the learning rate left the configured schedule",
    },
    needs=(4, "learning rates"),
)
def lr_curve(curves: dict[str, Any], steps: list[int], lrs: list[float]):
    peak = max(lrs)
    after = lrs.index(peak)
    turns = [after + i for i in reversals(lrs[after:], REVERSAL * peak)] if peak > 0 else []
    schedule = curves.get("schedule")
    name = schedule["name"] if schedule else None
    # every schedule sftdoctor configures only falls after its peak; an unknown one may restart once on purpose
    if len(turns) >= (1 if schedule else 2):
        return warning(
            f"the learning rate oscillates: it turned {len(turns)} times after its peak "
            f"(first at step {steps[turns[0]]})",
            detail=f"Peak {_g(peak)} at step {steps[after]}; "
            f"turns at steps {', '.join(map(str, (steps[i] for i in turns[:6])))}"
            + (
                f". The configured schedule ({name}) only falls after its warmup."
                if name
                else ". A warmup-then-decay schedule never turns back up after its peak."
            ),
            fix="a cosine's num_cycles above 0.5 (or a restarts schedule) makes it rise again: use lr_scheduler = "
            '"cosine_with_min_lr" with no num_cycles; a resume that restored the weights but restarted the '
            "scheduler turns too",
            evidence={"step": steps[turns[0]], "turns": [steps[i] for i in turns]},
            id="lr-curve/oscillates",
        )
    if schedule is None:
        return ok(
            f"the learning rate peaked at {_g(peak)} and did not oscillate (no configured schedule to compare with)",
            evidence={"peak": peak},
        )
    lag = max(1, schedule["total_steps"] // 20) if curves.get("precision") == "fp16" else 0
    offset = best_offset(schedule, steps, lrs, lag)
    tolerance = LR_TOLERANCE * schedule["learning_rate"]
    expected = [schedules.rate(schedule, max(0, s - offset)) for s in steps]
    off = [i for i, (lr, e) in enumerate(zip(lrs, expected)) if abs(lr - e) > tolerance]
    floor = schedules.floor(schedule)
    end = schedule["total_steps"]
    if not off:
        reached = steps[-1] >= end - offset
        return ok(
            f"the learning rate followed the configured {name} schedule"
            + (f" to its floor {_g(floor)}" if reached and floor > 0 else ""),
            detail=f"{len(lrs)} logged rates within {LR_TOLERANCE:.0%} of the peak {_g(schedule['learning_rate'])} of "
            f"the schedule's (warmup {schedule['warmup_steps']} steps, {end} steps in all).",
            evidence={"offset": offset},
        )
    return _left_schedule(schedule, steps, lrs, expected, off, offset)


def _left_schedule(
    schedule: dict[str, Any], steps: list[int], lrs: list[float], expected: list[float], off: list[int], offset: int
):
    """How the logged rates left the configured schedule, most telling first: below its floor, ending elsewhere,
    no warmup, or another schedule altogether."""
    name, end, floor = schedule["name"], schedule["total_steps"], schedules.floor(schedule)
    first = off[0]
    slug, title, fix, at = (
        _below_floor(schedule, steps, lrs, off)
        or _wrong_end(schedule, steps, lrs, expected, offset, first)
        or _no_warmup(schedule, steps, lrs, expected, first)
        or _off_schedule(schedule, steps, lrs, expected, first)
    )
    evidence = {
        "step": steps[at],
        "logged": lrs[first],
        "expected": expected[first],
        "off": len(off),
        "of": len(lrs),
        "floor": floor,
    }
    return warning(
        title,
        detail=f"{len(off)} of {len(lrs)} logged rates are more than {LR_TOLERANCE:.0%} of the peak away from the "
        f"configured schedule ({name}, peak {_g(schedule['learning_rate'])}, warmup "
        f"{schedule['warmup_steps']} steps, {end} steps, ending at {_g(floor)}).",
        fix=fix,
        evidence=evidence,
        id=f"lr-curve/{slug}",
    )


# Each way of leaving the schedule: (slug, title, fix, index of the step to cite), or None when it is not this one.
def _below_floor(schedule, steps, lrs, off):
    floor, tolerance = schedules.floor(schedule), LR_TOLERANCE * schedule["learning_rate"]
    below = [i for i in off if floor > 0 and lrs[i] < floor - tolerance]
    if not below:
        return None
    i = below[0]
    return (
        "below-floor",
        f"the learning rate fell below its floor: {_g(lrs[i])} at step {steps[i]}, the floor is {_g(floor)}",
        'the floor was not applied: pass it as min_lr_rate with lr_scheduler_type="cosine_with_min_lr" '
        "(an absolute min_lr crashes or is dropped under DeepSpeed); `sftdoctor check --config` checks it",
        i,
    )


def _wrong_end(schedule, steps, lrs, expected, offset, first):
    tolerance = LR_TOLERANCE * schedule["learning_rate"]
    if not (steps[-1] >= schedule["total_steps"] - offset and abs(lrs[-1] - expected[-1]) > tolerance):
        return None
    return (
        "wrong-end",
        f"the learning rate ended at {_g(lrs[-1])} at step {steps[-1]}, not at the schedule's end "
        f"value {_g(expected[-1])}",
        "the scheduler was built for another number of steps than the run took (max_steps against epochs, a "
        "resume with another world size or batch, or a DeepSpeed scheduler block): set max_steps, and let the "
        "Trainer build the schedule",
        first,
    )


def _no_warmup(schedule, steps, lrs, expected, first):
    warmup = schedule["warmup_steps"]
    if not (warmup > 1 and steps[first] <= warmup and lrs[first] > expected[first]):
        return None
    return (
        "no-warmup",
        f"no warmup: the learning rate was already {_g(lrs[first])} at step {steps[first]}",
        "the scheduler that ran had no warmup: a resume that restored the weights but rebuilt the scheduler, a "
        "warmup given in steps that was read as a ratio (transformers 5 reads warmup_steps below 1 as a ratio), "
        "or an optimizer and scheduler built outside the Trainer",
        first,
    )


def _off_schedule(schedule, steps, lrs, expected, first):
    return (
        "off-schedule",
        f"the learning rate left the configured {schedule['name']} schedule at step {steps[first]}: logged "
        f"{_g(lrs[first])}, expected {_g(expected[first])}",
        "another scheduler or learning rate was applied than the one configured (a resumed optimizer or "
        "scheduler state from another run, a callback or plugin changing param_groups)",
        first,
    )


# ---------------------------------------------------------------- gradient norm


@curve_check(
    "grad-norm-curve",
    "the gradient norm: clipped on most steps, or rising over the last third of the run",
    "grad_norm",
    messages={
        "mostly-clipped": "the gradient norm was clipped on most steps",
        "rising": "the gradient norm rose over the last third of the run",
    },
    needs=(8, "gradient norms"),
)
def grad_norm_curve(curves: dict[str, Any], steps: list[int], norms: list[float]):
    found = []
    clip, assumed = curves.get("max_grad_norm"), False
    if clip is None:  # a Trainer's (or LLaMA-Factory's) log: neither records the threshold
        clip, assumed = TRAINER_MAX_GRAD_NORM, True
    clipped = [i for i, n in enumerate(norms) if clip and n > CLIPPED_BY * clip]
    if clip and len(clipped) >= CLIPPED_SHARE * len(norms):
        found.append(
            warning(
                f"the gradient norm was clipped on {len(clipped) / len(norms):.0%} of the logged steps: above "
                f"{CLIPPED_BY:g}x the threshold {clip:g}"
                + (" (the Trainer's default; the log does not say)" if assumed else ""),
                detail=f"Median gradient norm {_g(statistics.median(norms))}: "
                "clipping shrank most updates by more than 9%, "
                "so the run trained with a smaller step than its learning rate says, and the norm no longer "
                "tells a healthy update from a bad one.",
                fix="lower learning_rate (or lengthen warmup) until most steps are under the threshold; "
                "a threshold far "
                "below the typical norm (max_grad_norm 0.1 on a 7B model) is too tight; look for rows with huge losses",
                evidence={"step": steps[clipped[0]], "share": len(clipped) / len(norms), "max_grad_norm": clip},
                id="grad-norm-curve/mostly-clipped",
            )
        )
    tail = len(norms) - len(norms) // 3
    window_steps, window = steps[tail:], norms[tail:]
    if len(window) >= 6:
        half = len(window) // 2
        before, later = statistics.median(window[:half]), statistics.median(window[half:])
        rho = spearman(window_steps, window)
        if before > 0 and later / before >= RISING_RATIO and rho >= RISING_RHO:
            found.append(
                warning(
                    f"the gradient norm rose over the last third of the run: median {_g(before)} to {_g(later)} "
                    f"(steps {window_steps[0]}-{window_steps[-1]})",
                    detail=f"Rank correlation with the step {rho:.2f}. "
                    "A norm that keeps growing while the loss no longer "
                    "falls usually comes before a divergence (often with fp16 or a high learning rate); at the very "
                    "end of a schedule that decays to 0, a mild rise is known and harmless.",
                    fix="resume from a checkpoint before the rise with a lower learning_rate, or stop here; keep "
                    "max_grad_norm = 1.0; check the loss curve for the same turn",
                    evidence={"step": window_steps[0], "before": before, "after": later, "rho": rho},
                    id="grad-norm-curve/rising",
                )
            )
    skipped = non_finite(curves["series"].get("grad_norm"))  # fp16's overflowed steps, left out above
    return found or ok(
        f"the gradient norm stayed level: median {_g(statistics.median(norms[tail:]))} over the last third"
        + (
            f"; clipped (above {CLIPPED_BY:g}x {clip:g}) on {len(clipped) / len(norms):.0%} of the steps"
            if clip
            else ""
        )
        + (f"; {skipped['count']} overflowed fp16 steps (inf) left out" if skipped else "")
    )


# ---------------------------------------------------------------- eval loss


def best_checkpoint(curves: dict[str, Any], step: int) -> str:
    """Where the weights of `step` are, or the nearest kept checkpoint before it."""
    path = curves.get("path", "RUN_DIR")
    saved = sorted(curves.get("checkpoints") or [])
    named = curves.get("best_checkpoint") or ""  # the Trainer's own pick, by its metric_for_best_model
    if step in saved:
        return f"{path}/checkpoint-{step}"
    if named.rstrip("/").endswith(f"checkpoint-{step}"):
        return named
    earlier = [s for s in saved if s < step]
    if earlier:
        return f"checkpoint-{step} was not kept; the nearest before it is {path}/checkpoint-{earlier[-1]}"
    return (
        f"no checkpoint of step {step} was kept (save at every evaluation, save_steps = eval_steps, with a "
        "save_total_limit that keeps it)"
    )


@curve_check(
    "overfitting",
    "eval loss rising for several evaluations while the train loss falls",
    "eval_loss",
    messages={
        "eval-loss-rising": "the eval loss stayed above its best while the train loss fell",
    },
    needs=(PATIENCE + 1, "eval losses"),
)
def overfitting(curves: dict[str, Any], steps: list[int], evals: list[float]):
    best = min(range(len(evals)), key=evals.__getitem__)
    after = len(evals) - 1 - best
    rose = evals[-1] - evals[best]
    if after < PATIENCE or rose <= max(0.01 * abs(evals[best]), 1e-3):
        return ok(
            f"the eval loss was lowest at step {steps[best]} ({_g(evals[best])})"
            + (f", {after} evaluation{'s' if after != 1 else ''} before the end" if after else ", the last evaluation")
        )
    train_steps, train = points(curves, "loss")
    at_best = [v for s, v in zip(train_steps, train) if s <= steps[best]][-3:]
    at_end = [v for s, v in zip(train_steps, train) if s <= steps[-1]][-3:]
    if not at_best or not at_end or statistics.fmean(at_end) >= statistics.fmean(at_best):
        return ok(
            f"the eval loss rose after step {steps[best]}, but so did the train loss (no overfitting; see the "
            "loss curve)",
            evidence={"step": steps[best]},
        )
    where = best_checkpoint(curves, steps[best])
    return warning(
        f"overfitting: the eval loss stayed above its best for {after} evaluations after step {steps[best]} while the "
        "train loss fell",
        detail=f"Eval loss {_g(evals[best])} at step {steps[best]}, {_g(evals[-1])} at step {steps[-1]}; train loss "
        f"{_g(statistics.fmean(at_best))} to {_g(statistics.fmean(at_end))} over the same steps. The best "
        f"weights: {where}.",
        fix=(
            f"use the weights of step {steps[best]} ({where}); next time train fewer epochs (about {steps[best]} "
            "steps), lower learning_rate, or add data"
            if where.endswith(f"checkpoint-{steps[best]}")
            else f"train again for about {steps[best]} steps (fewer epochs) with a checkpoint at every evaluation, or "
            "lower learning_rate, or add data"
        ),
        evidence={"step": steps[best], "best_eval_loss": evals[best], "last_eval_loss": evals[-1], "checkpoint": where},
        id="overfitting/eval-loss-rising",
    )


# ---------------------------------------------------------------- train loss


@curve_check(
    "loss-plateau",
    "a train loss that does not fall from the start: learning rate too low, or nothing trains",
    "loss",
    messages={
        "flat": "the train loss stayed flat from the start",
    },
    needs=(8, "train losses"),
)
def loss_plateau(curves: dict[str, Any], steps: list[int], losses: list[float]):
    head = statistics.median(losses[: max(2, len(losses) // 10)])
    tail = statistics.median(losses[-max(2, len(losses) // 4) :])
    drop = (head - tail) / abs(head) if head else 0.0
    trend = spearman(steps, losses)
    # a slow steady fall (continued pre-training) is learning; a rising loss is divergence, not a plateau
    if drop >= PLATEAU_DROP or trend <= PLATEAU_RHO or tail > head * (1 + PLATEAU_DROP):
        return ok(
            f"the train loss fell {drop:.0%}: {_g(head)} to {_g(tail)}"
            if drop > 0
            else f"the train loss rose from {_g(head)} to {_g(tail)} (see the loss-spike findings)"
        )
    _, lrs = points(curves, "learning_rate")
    zero = bool(lrs) and max(lrs) == 0
    return warning(
        f"the train loss stayed flat from the start: {_g(head)} to {_g(tail)} over steps {steps[0]}-{steps[-1]}",
        detail=(f"A change of {-drop:+.1%}, rank correlation with the step {trend:.2f}. " if drop else "No change. ")
        + (
            "The learning rate was 0 on every logged step."
            if zero
            else f"Peak learning rate {_g(max(lrs))}."
            if lrs
            else "No learning rate was logged."
        ),
        fix="nothing is learning: check what trains (the trainable parameter count in the plan's lines; a model "
        "frozen by custom code) and raise learning_rate (full SFT of 7B models: 1e-5 to 2e-5; LoRA: 1e-4 to "
        "2e-4); a loss already at chance level (ln of the number of choices) says the labels carry no signal",
        evidence={"step": steps[0], "head": head, "tail": tail, "zero_lr": zero},
        id="loss-plateau/flat",
    )


# ---------------------------------------------------------------- throughput


@curve_check(
    "throughput-drop",
    "tokens/s falling by more than a third and not recovering",
    "tokens_per_second",
    messages={
        "dropped": "throughput fell and did not recover",
    },
)
def throughput_drop(curves: dict[str, Any], steps: list[int], speeds: list[float]):
    steps, speeds = steps[1:], speeds[1:]  # the first interval holds the start-up (allocation, compilation)
    enough(speeds, 8, "throughputs (after the first)")
    baseline = statistics.median(speeds[: max(3, len(speeds) // 3)])
    tail = statistics.median(speeds[-max(3, len(speeds) // 4) :])
    if baseline <= 0 or tail >= THROUGHPUT_DROP * baseline:
        return ok(f"throughput held: median {baseline:,.0f} tokens/s early, {tail:,.0f} at the end")
    low = THROUGHPUT_DROP * baseline
    start = next(i for i in range(len(speeds)) if speeds[i] < low and statistics.median(speeds[i : i + 3]) < low)
    step, before = steps[start], steps[start - 1] if start else 0
    events = [f"a checkpoint save at step {s}" for s in (curves.get("checkpoints") or []) if before <= s <= step]
    save = curves.get("save_steps")
    if not events and save and any(before <= s <= step for s in range(save, step + 1, save)):
        events.append(f"a checkpoint save at step {(step // save) * save}")
    events += [
        f"an evaluation at step {s}"
        for s in curves["series"].get("eval_loss", {}).get("steps", [])
        if before <= s <= step
    ]
    return warning(
        f"throughput fell by {1 - tail / baseline:.0%} at step {step} and did not recover: {baseline:,.0f} to "
        f"{tail:,.0f} tokens/s",
        detail="It coincides with " + " and ".join(events) + "."
        if events
        else "No checkpoint save or evaluation coincides with it.",
        fix="after a save: the checkpoint writer or an offloaded optimizer still busy, or memory fragmentation "
        "(set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); else a GPU throttling (nvidia-smi -q -d "
        "PERFORMANCE), a slower node, or longer samples later in the data (padding_fraction)",
        evidence={"step": step, "before": baseline, "after": tail},
        id="throughput-drop/dropped",
    )


# ---------------------------------------------------------------- memory


def memory_series(curves: dict[str, Any]) -> str:
    """The memory series a run logged: the GPU's allocated memory, else the host's resident memory."""
    name = next((n for n in ("memory_allocated_gib", "host_rss_gib") if curves["series"].get(n)), None)
    if name is None:
        raise NotApplicable("no memory was logged")
    return name


@curve_check(
    "memory-growth",
    "memory growing step after step (a leak)",
    memory_series,
    messages={
        "leak": "memory grew step after step",
    },
    needs=(8, "memory readings"),
)
def memory_growth(curves: dict[str, Any], steps: list[int], values: list[float]):
    name = memory_series(curves)
    skip = len(values) // 5  # the first steps allocate the optimizer states and the caches
    steps, values = steps[skip:], values[skip:]
    quarter = max(2, len(values) // 4)
    start, end = statistics.median(values[:quarter]), statistics.median(values[-quarter:])
    # of all the logging intervals, not of those that moved: one step up (a cache filled once) is no leak
    share = sum(b - a > 1e-6 * max(abs(a), 1e-9) for a, b in zip(values, values[1:])) / max(1, len(values) - 1)
    rho = spearman(steps, values)
    what = (
        "GPU memory (allocated, the peak of each logging interval)" if name != "host_rss_gib" else "host memory (RSS)"
    )
    grew = end - start
    if not (
        start > 0
        and grew / start >= LEAK_GROWTH
        and grew >= LEAK_MIN_GIB[name]
        and share >= LEAK_SHARE
        and rho >= LEAK_RHO
    ):
        return ok(f"{what} held: {start:.2f} GiB after the first steps, {end:.2f} GiB at the end")
    per_100 = (values[-1] - values[0]) / max(1, steps[-1] - steps[0]) * 100
    return warning(
        f"{what} grew from {start:.2f} to {end:.2f} GiB over steps {steps[0]}-{steps[-1]} ({per_100:+.3f} GiB per 100 "
        "steps): a leak",
        detail=f"It rose on {share:.0%} of the logging intervals (rank correlation {rho:.2f}); at "
        "this rate a long run ends out of memory.",
        fix="something keeps tensors or objects alive across steps: a loss or logits appended to a list without "
        ".item() or .detach(), a growing cache in a callback, a plugin or the collator; a peak that follows the "
        "batch length instead (data sorted by length) is not a leak: shuffle and look again",
        evidence={"step": steps[0], "start_gib": start, "end_gib": end, "series": name},
        id="memory-growth/leak",
    )
