"""`sftdoctor sweep SWEEP.toml`: read the sweep, narrow its space, join (or create) its study, run trials until
the budget is spent over every worker, then write the results.

Exit 0: the study has a complete trial; 1: none (every trial pruned or failed, or nothing in the space fits);
2: bad input; 130 or 143: stopped by SIGINT or SIGTERM (the running trial is stopped and enqueued again:
rerun the same command to go on).
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

from sftdoctor.errors import SftdoctorError
from sftdoctor.sweep import results
from sftdoctor.sweep import study as studies
from sftdoctor.sweep.config import Sweep, display, load_sweep
from sftdoctor.sweep.narrow import narrow
from sftdoctor.sweep.trial import Outcome, Stop, params_line, run_trial
from sftdoctor.train.processes import SIGNAL_EXIT


def say(line: str) -> None:
    print(line, flush=True)


def header(sweep: Sweep) -> str:
    return (
        f"sftdoctor: sweep {display(sweep.path)}: {len(sweep.space)} key{'s' if len(sweep.space) != 1 else ''}, "
        f"{sweep.sampler} sampler, {sweep.pruner} pruner, a budget of {sweep.trials} trial"
        f"{'s' if sweep.trials != 1 else ''}; objective {sweep.objective} ({sweep.direction}); study "
        f"{sweep.study!r} in {display(sweep.output_dir / studies.JOURNAL)}"
    )


def space_lines(space) -> list[str]:
    width = max(len(d.name) for d in space)
    return [f"  {d.name.ljust(width)}  {d.describe()}" for d in space]


def main(path: Path, facts_file: Path | None = None, dry_run: bool = False, plugins: bool = True) -> int:
    spec = load_sweep(path)
    if not dry_run:
        from sftdoctor.train.gate import require_training_stack

        require_training_stack()
    studies.quiet_optuna()
    say(header(spec))
    for note in spec.notes:
        say(f"sftdoctor: {note}")
    narrowed = narrow(spec, facts_file)
    say(f"sftdoctor: space {narrowed.note}")
    if not narrowed.fits:
        say(
            "sftdoctor: not starting: no trial could run (fix the base or the space, e.g. a smaller "
            "per_device_batch_size or max_length; `sftdoctor plan` shows every term)"
        )
        return 1
    if dry_run:
        return show_dry_run(spec, narrowed.space)
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    study, space, worker = studies.open_study(spec, narrowed.space, narrowed.to_json())
    if space != narrowed.space:
        say("sftdoctor: the study samples the space it was created with:")
    for line in space_lines(space):
        say(line)
    study = studies.load(spec, space, worker)
    stop = Stop()
    previous = {sig: signal.signal(sig, stop) for sig in SIGNAL_EXIT}
    ran = 0
    try:
        while stop.signal is None:
            trial = studies.next_trial(study, spec, space, say)
            if trial is None:
                break
            ran += 1
            say(
                f"\nsftdoctor: trial {trial.number}: {params_line(trial.params)}"
                + (f" (a retry of trial {trial.user_attrs['retry_of']})" if "retry_of" in trial.user_attrs else "")
            )
            try:
                outcome = run_trial(spec, study, trial, plugins=plugins, facts_file=facts_file, stop=stop, say=say)
            except SftdoctorError:
                from optuna.trial import TrialState

                study.tell(trial, state=TrialState.FAIL)
                raise
            except BaseException:
                with contextlib.suppress(Exception):  # the error itself is what to show
                    studies.interrupted(study, trial, "its worker stopped with an error")
                raise
            record(study, trial, outcome, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return finish(spec, study, plugins, ran, stop)


def record(study, trial, outcome: Outcome, stop: Stop) -> None:
    from optuna.trial import TrialState

    if outcome.why:
        trial.set_user_attr("why", outcome.why)
    took = f"{outcome.seconds:.0f} s"
    why = outcome.why or {}
    if outcome.state == "complete":
        study.tell(trial, outcome.value)
        say(f"sftdoctor: trial {trial.number}: complete: {why.get('title')} = {outcome.value:.4f} ({took})")
    elif outcome.state == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
        where = "" if outcome.launched else "; not launched"
        cause = why.get("title") if why.get("id") in ("pruner", "objective") else f"{why.get('id')}: {why.get('title')}"
        say(f"sftdoctor: trial {trial.number}: pruned: {cause} ({took}{where})")
    elif outcome.state == "failed":
        study.tell(trial, state=TrialState.FAIL)
        say(f"sftdoctor: trial {trial.number}: failed: {why.get('title')} ({took})")
    else:
        name = signal.Signals(stop.signal).name if stop.signal else "a signal"
        studies.interrupted(study, trial, f"the sweep was stopped by {name}")
        say(f"sftdoctor: trial {trial.number}: stopped by {name}; enqueued again for the rerun")


def finish(spec: Sweep, study, plugins: bool, ran: int, stop: Stop) -> int:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    elsewhere = [t for t in trials if t.state == TrialState.RUNNING]
    if stop.signal is not None:
        state = f"stopped by {signal.Signals(stop.signal).name}; rerun the same command to go on"
    elif elsewhere:
        state = (
            f"this worker is done; {len(elsewhere)} trial{'s' if len(elsewhere) != 1 else ''} still running elsewhere"
        )
    else:
        state = "the budget is spent"
    say(
        f"\nsftdoctor: sweep {spec.study!r}: {state}: {studies.counted(trials)} of {spec.trials} trials "
        f"({results.counts(study)}); {ran} run by this worker"
    )
    if trials:
        say(results.table(study, spec))
    written = results.write(study, spec, plugins)
    if written.best is not None:
        t = written.best
        say(f"  best         trial {t.number}: {results.objective_name(spec)} {t.value:.4f} ({params_line(t.params)})")
        say(f"  run config   {display(written.best_toml)} (sftdoctor train {display(written.best_toml)})")
    else:
        say("  best         none: no trial is complete")
    if written.pictures:
        say(f"  pictures     {', '.join(display(p) for p in written.pictures)}")
    for line in written.skipped:
        say(f"  not drawn    {line}")
    if written.report is not None:
        shown = min(results.OVERLAID, len(results.best(study)[1]))
        say(
            f"  report       {display(written.report)} ("
            + (f"the best {shown} runs overlaid)" if shown > 1 else "the best run)")
        )
    if stop.signal is not None:
        return SIGNAL_EXIT[stop.signal]
    return 0 if written.best is not None else 1


def show_dry_run(spec: Sweep, space) -> int:
    from sftdoctor.sweep.config import Dim

    study = studies.existing(spec)
    stored = (study.user_attrs.get("sweep") or {}).get("space") if study is not None else None
    say("sftdoctor: the space sampled" + (" (the study's, as it was created):" if stored else ":"))
    for line in space_lines(tuple(Dim.from_json(d) for d in stored) if stored else space):
        say(line)
    if study is None:
        say(f"sftdoctor: no study yet in {display(spec.output_dir)}; nothing was run (--dry-run)")
        return 0
    say(
        f"sftdoctor: the study so far: {studies.counted(study.get_trials(deepcopy=False))} of {spec.trials} trials "
        f"({results.counts(study) or 'none'}); nothing was run (--dry-run)"
    )
    if study.get_trials(deepcopy=False):
        say(results.table(study, spec))
    return 0
