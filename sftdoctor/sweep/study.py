"""The study on disk, shared by every worker: Optuna's journal file in the sweep directory.

- One sweep directory holds one study, `SWEEP_DIR/study.journal`. The study remembers what makes its trials
  comparable (the base run config, the space, the objective and its direction): a rerun or another worker
  with another sweep file is refused, one that only raises the budget goes on.
- The space the study samples from is fixed by the worker that created it (after narrowing on its machine)
  and read back by every other one, so the distributions never differ between workers.
- The budget counts trials that finished (complete, pruned, failed) and trials running now, over every
  worker. Counting and asking for the next trial happen under one lock (Optuna's own NFS-safe symlink lock,
  beside the journal), so two workers never run more trials than the budget, and the storage gives each
  of them its own trial.
- A trial left running by a worker that is gone (killed, its node lost) is failed and its parameters
  enqueued again: the rerun goes on with it. Gone means: on this host, its process no longer exists (pid and
  start time); elsewhere, no heartbeat for STALE_S. A failed trial that another one retries does not count.

Optuna 5.0's public API throughout: ask/tell, enqueue_trial, user attributes, JournalStorage.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError
from sftdoctor.run.liveness import me, process_start
from sftdoctor.run.resolve import eval_interval
from sftdoctor.sweep.config import Dim, Sweep
from sftdoctor.sweep.journal import ADVICE, check_journal, cut_short

JOURNAL = "study.journal"
LOCK = "sweep"  # the lock file is SWEEP_DIR/sweep.lock (a symbolic link while held)
HEARTBEAT_S = 60.0
STALE_S = 600.0  # a trial of another host without a heartbeat for this long is taken as lost
LOCK_GRACE_S = 120  # a lock not released for this long belongs to a dead worker and is broken


def quiet_optuna() -> None:
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def storage(folder: Path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    journal = folder / JOURNAL
    if os.path.lexists(journal):
        if journal.is_dir():
            raise InputError(
                journal, "is not a file; expected the study's Optuna journal (move it away for a new study)"
            )
        if not journal.exists():
            raise InputError(journal, "a symbolic link to nothing; expected the study's Optuna journal")
        check_journal(journal)
    path = str(journal)
    lock = JournalFileSymlinkLock(path)
    if journal.exists():
        with _held(lock):  # every writer holds it while it writes: a last line without "\n" now is cut short
            cut_short(journal)
    try:  # the journal is replayed here (checked above, line by line, as Optuna reads it)
        return JournalStorage(JournalFileBackend(path, lock_obj=lock))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, AssertionError) as exc:
        raise InputError(
            journal,
            f"not an Optuna journal ({type(exc).__name__}: {str(exc)[:120]}); move it away "
            "for a new study, or restore it from a copy",
        ) from None


@contextlib.contextmanager
def _held(lock):
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def locked(folder: Path):
    """The sweep's own critical sections (create the study, count and ask), across processes and hosts."""
    from optuna.storages.journal import JournalFileSymlinkLock

    with _held(JournalFileSymlinkLock(str(folder / LOCK), grace_period=LOCK_GRACE_S)):
        yield


def distributions(space: tuple[Dim, ...]) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for d in space:
        if d.kind == "choices":
            out[d.name] = CategoricalDistribution(list(d.choices))
        elif d.kind in ("uniform", "log_uniform"):
            out[d.name] = FloatDistribution(
                float(d.low), float(d.high), log=d.log, step=float(d.step) if d.step is not None else None
            )
        else:
            out[d.name] = IntDistribution(int(d.low), int(d.high), log=d.log, step=int(d.step or 1))
    return out


def gone(attrs: dict[str, Any], now: float, here: dict[str, Any]) -> str | None:
    """Why the worker that runs a trial is gone, or None while it may still be at work."""
    if attrs.get("host") is None:
        return "its worker stopped before it started it"
    if attrs.get("host") == here["host"]:
        pid = attrs.get("pid")
        if (pid, attrs.get("pid_start")) == (here["pid"], here["pid_start"]):
            return None
        if not isinstance(pid, int) or process_start(pid) != attrs.get("pid_start"):
            return f"its worker (pid {pid} on {attrs['host']}) is gone"
        return None
    beat = attrs.get("heartbeat")
    if isinstance(beat, (int, float)) and now - beat > STALE_S:
        return f"its worker on {attrs['host']} sent no heartbeat for {(now - beat) / 60:.0f} minutes"
    return None


def retried(trials) -> set[int]:
    return {t.user_attrs["retry_of"] for t in trials if isinstance(t.user_attrs.get("retry_of"), int)}


def counted(trials) -> int:
    """What the budget counts: complete, pruned and running trials, and failed ones no other trial retries."""
    from optuna.trial import TrialState

    again = retried(trials)
    return sum(
        1
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        or (t.state == TrialState.FAIL and t.number not in again)
    )


def recover(study, here: dict[str, Any]) -> list[str]:
    """Fail the running trials whose worker is gone and enqueue their parameters again (under the lock)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    lines, now = [], time.time()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = gone(t.user_attrs, now, here)
        if why is None:
            continue
        try:
            study.tell(t.number, state=TrialState.FAIL)
        except (UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # another worker got there first
        study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
        lines.append(f"trial {t.number} was left running ({why}): failed, and its parameters enqueued again")
    return lines


def interrupted(study, trial, why: str) -> None:
    """This worker's trial stopped by a signal: failed, and its parameters enqueued again for the rerun."""
    from optuna.trial import TrialState

    trial.set_user_attr("interrupted", why)
    study.tell(trial, state=TrialState.FAIL)
    study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})


def identity(sweep: Sweep, space: tuple[Dim, ...], narrowing: dict[str, Any]) -> dict[str, Any]:
    return {
        "fingerprint": sweep.fingerprint(),
        "file": str(sweep.path),
        "objective": sweep.objective,
        "direction": sweep.direction,
        "written": [d.to_json() for d in sweep.space],
        "space": [d.to_json() for d in space],
        "narrowing": narrowing,
    }


def open_study(sweep: Sweep, space: tuple[Dim, ...], narrowing: dict[str, Any]):
    """(study, the space it samples from, this worker's index): created by the first worker, joined by the
    others. Refuses a sweep directory whose study was made by another sweep file."""
    import optuna

    folder = sweep.output_dir
    store = storage(folder)
    journal = folder / JOURNAL
    with locked(folder):
        names = optuna.study.get_all_study_names(store)
        others = [n for n in names if n != sweep.study]
        if others:
            raise InputError(
                sweep.path,
                f"{journal} holds the study {others[0]!r}: one sweep directory holds one "
                "study; set another [sweep] output_dir",
                key="[sweep].study",
            )
        if not names and any(folder.glob("trial-*")):
            raise InputError(
                sweep.path,
                f"{folder} holds trial directories but no study ({journal} is gone?): "
                "move them away or set another [sweep] output_dir",
                key="[sweep].output_dir",
            )
        study = optuna.create_study(
            storage=store, study_name=sweep.study, direction=sweep.direction, load_if_exists=True
        )
        stored = study.user_attrs.get("sweep")
        if stored is None:
            stored = identity(sweep, space, narrowing)
            study.set_user_attr("sweep", stored)
        elif stored.get("fingerprint") != sweep.fingerprint():
            raise InputError(
                sweep.path,
                f"the study in {journal} was made with another base, space or objective "
                f"({stored.get('file')}; {describe_change(stored, sweep)}): its trials would "
                "not compare; set another [sweep] output_dir for a new study",
            )
        workers = [k for k in study.user_attrs if k.startswith("worker:")]
        here = me()
        study.set_user_attr(f"worker:{here['host']}:{here['pid']}:{here['pid_start']}", time.time())
    space = tuple(Dim.from_json(d) for d in stored["space"])
    try:  # the journal's types were checked; a range Optuna refuses (low above high) is found here, not mid-sweep
        distributions(space)
    except (ValueError, TypeError) as exc:
        raise InputError(
            journal, f"the study's space cannot be sampled ({exc}); {ADVICE}", key="user_attr.sweep.space"
        ) from None
    return study, space, len(workers)


def describe_change(stored: dict[str, Any], sweep: Sweep) -> str:
    written = [d.to_json() for d in sweep.space]
    if stored.get("objective") != sweep.objective or stored.get("direction") != sweep.direction:
        return (
            f"objective {stored.get('objective')} ({stored.get('direction')}), "
            f"now {sweep.objective} ({sweep.direction})"
        )
    if stored.get("written") != written:
        return "the [space] differs"
    return "the base run config differs"


def sampler(sweep: Sweep, space: tuple[Dim, ...], worker: int):
    """TPE or random seeded per worker (two workers with one seed would draw the same points); the grid with the
    sweep's own seed on every worker: Optuna's grid gives trial k the k-th point of an order shuffled by the seed,
    so one order over all workers gives every trial its own point."""
    import optuna

    if sweep.sampler == "grid":
        return grid_sampler({d.name: list(d.choices) for d in space}, sweep.seed)
    seed = sweep.seed + worker
    if sweep.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # a third of the budget (at most Optuna's 10) drawn at random before TPE models the results
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=min(10, max(2, sweep.trials // 3)), constant_liar=True
    )


def grid_sampler(search_space: dict[str, list[Any]], seed: int):
    """Optuna's grid, without its `study.stop()` once every point was visited (which only works inside
    `study.optimize`): the budget, at most the grid's size, ends the sweep."""
    from optuna.samplers import GridSampler

    class Grid(GridSampler):
        def after_trial(self, study, trial, state, values) -> None:
            return None

    return Grid(search_space, seed=seed)


def pruner(sweep: Sweep):
    """Fed each trial's eval loss at each evaluation (step = the optimizer step). Median: from the third trial
    on, a trial whose best loss so far is worse than the median of the others at that step stops, never
    before its second evaluation. Hyperband: brackets from one evaluation to the run's length."""
    import optuna

    every = eval_interval(sweep.base)
    if sweep.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2 * every)
    if sweep.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=every, max_resource=sweep.base.training.max_steps or "auto", reduction_factor=3
        )
    return optuna.pruners.NopPruner()


def load(sweep: Sweep, space: tuple[Dim, ...], worker: int):
    import optuna

    return optuna.load_study(
        study_name=sweep.study,
        storage=storage(sweep.output_dir),
        sampler=sampler(sweep, space, worker),
        pruner=pruner(sweep),
    )


def next_trial(study, sweep: Sweep, space: tuple[Dim, ...], say=print):
    """The next trial this worker runs, or None when the budget is spent (over every worker)."""
    here = me()
    with locked(sweep.output_dir):
        for line in recover(study, here):
            say(f"sftdoctor: {line}")
        if counted(study.get_trials(deepcopy=False)) >= sweep.trials:
            return None
        trial = study.ask(distributions(space))
        for name, value in {**here, "heartbeat": time.time()}.items():
            trial.set_user_attr(name, value)
    return trial


def existing(sweep: Sweep):
    """The study of a sweep directory, read only (for --dry-run), or None."""
    import optuna

    if not os.path.lexists(sweep.output_dir / JOURNAL):  # a link to nothing is refused, as a run refuses it
        return None
    try:
        return optuna.load_study(study_name=sweep.study, storage=storage(sweep.output_dir))
    except KeyError:
        return None
