"""`sftdoctor train RUN.toml`: the gate, the plan shown, the run directory prepared, the rehearsal, then the run."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError
from sftdoctor.run import for_launch
from sftdoctor.run.checkpoints import checkpoints, newest_complete, remove_incomplete, step_of
from sftdoctor.run.liveness import marked
from sftdoctor.run.resolve import REHEARSAL_SAVE_AT, REHEARSAL_STEPS
from sftdoctor.train.describe import describe, memory_summary
from sftdoctor.train.drills import check_drill
from sftdoctor.train.gate import (
    nodes_agree,
    preflight,
    record_facts,
    record_preflight,
    rejoining,
    require_training_stack,
    silenced_ids,
)
from sftdoctor.train.launch import batch_job, failure_cause, rehearse, start, worker_env
from sftdoctor.train.processes import SIGNAL_EXIT
from sftdoctor.train.run_dir import finished, forget_metrics_after, node_file, owner, write_json


def main(
    config: Path,
    resume: bool = False,
    dry_run: bool = False,
    smoke: bool = False,
    force: bool = False,
    drill: dict[str, Any] | None = None,
    plugins: bool = True,
    rehearse_first: bool = True,
    batch: str | None = None,
    disable: tuple[str, ...] = (),
) -> int:
    """`batch`: "write" the run as a Slurm batch script instead of training, or "submit" it too. `disable`: the
    --disable option's values, silenced in the gate with the config's [checks] disable, and recorded in the plan."""
    require_training_stack()
    facts, findings, blocked = preflight(config, plugins, disable=disable)
    plan = for_launch(
        facts.get("plan"), rehearsal=smoke, drill=drill, plugins=plugins, forced=force, rehearse=rehearse_first
    )
    plan = dataclasses.replace(plan, silenced=silenced_ids(facts, disable))
    check_drill(drill, plan)
    print("\n" + describe(plan), flush=True)
    if dry_run:
        print(memory_summary(plan, facts))
        refuse_another_run(plan, Path(plan.output_dir), resume)  # as the run itself would, below
        return 1 if blocked and not force else 0
    if batch is not None:
        return batch_job(plan, config, facts.get("run"), blocked and not force, batch == "submit")
    rejoin = rejoining(plan)
    if not may_start(plan, findings, blocked and not force, rejoin):
        return 1
    run_dir = Path(plan.output_dir)  # one that cannot be made was refused before the checks (facts.launch_inputs)
    env = worker_env(plan, config, run_dir)
    if not prepare(plan, run_dir, resume and not smoke, resume):
        return 0  # the run was complete
    with marked(run_dir, owner(plan)):  # live until this command ends: `report --follow` reads the mark
        record_preflight(run_dir, findings, forced=force and blocked)
        if owner(plan):
            record_facts(run_dir, facts, plan)
        if plan.rehearse and not rejoin:
            code = rehearsal_first(facts.get("plan"), plan, env, run_dir, plugins, force)
            if code is not None:
                return code
        if not smoke:
            return start(plan, run_dir, env, resume, config=config)
        return smoke_test(plan, env, run_dir)


def may_start(plan, findings: list, blocked: bool, rejoin: bool) -> bool:
    """The gate's verdict, every node's on a cluster (a node rejoining a run in progress skips that)."""
    if plan.nnodes > 1 and not rejoin and not nodes_agree(plan, findings, blocked):
        return False
    if blocked:
        print("\nsftdoctor: not starting: the checks above found errors (fix them, or run with --force)")
        return False
    return True


def refuse_another_run(plan, run_dir: Path, resume: bool) -> None:
    """A run directory that holds checkpoints is continued with --resume or not at all (a rehearsal or a drill,
    which starts clean, excepted). `check --config` cannot know the flag: `train --dry-run` says it."""
    if (plan.rehearsal or plan.drill) and owner(plan):
        return
    if checkpoints(run_dir) and not resume:
        raise InputError(
            run_dir,
            "already holds checkpoints; add --resume to continue, or set another [training] output_dir",
            key="[training].output_dir",
        )


def prepare(plan, run_dir: Path, complete_ends_it: bool, resume: bool) -> bool:
    """The run directory made ready: cleaned for a rehearsal or a drill, refused when it holds another run's
    checkpoints, rewound to its newest complete checkpoint on --resume. False: the run was already complete."""
    if (plan.rehearsal or plan.drill) and owner(plan):  # each rehearsal and drill starts clean
        shutil.rmtree(run_dir, ignore_errors=True)
    refuse_another_run(plan, run_dir, resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    done = finished(run_dir) if complete_ends_it else None
    if done:
        print(f"sftdoctor: the run is complete ({done}); the final model is in {os.path.normpath(run_dir / 'final')}")
        return False
    if resume:
        if owner(plan):
            remove_incomplete(run_dir)
        checkpoint = newest_complete(run_dir)
        if owner(plan):
            forget_metrics_after(run_dir, step_of(checkpoint) if checkpoint else 0)
        print(f"sftdoctor: resuming from {checkpoint or 'scratch: no complete checkpoint'}")
    if plan.deepspeed is not None and owner(plan):
        write_json(run_dir / "deepspeed.json", plan.deepspeed)  # for the reader; the workers take it from the plan
    return True


def rehearsal_first(decided, plan, env: dict[str, str], run_dir: Path, plugins: bool, force: bool) -> int | None:
    """The run rehearsed on the shrunk model before it starts; None when it passed, else the exit code."""
    began, log = time.perf_counter(), node_file(run_dir, "rehearsal.log", plan)
    log.unlink(missing_ok=True)
    print(
        "sftdoctor: rehearsing on the shrunk model (4 steps, a save and a resume; --no-rehearse skips it)", flush=True
    )
    rehearsal = for_launch(decided, rehearsal=True, plugins=plugins, forced=force)
    if owner(plan):
        shutil.rmtree(rehearsal.output_dir, ignore_errors=True)  # each rehearsal starts clean
    code = rehearse(rehearsal, env, log)
    if code in SIGNAL_EXIT.values():
        return code
    if code:
        print(f"sftdoctor: not starting: the rehearsal failed (exit {code}): {failure_cause(log)}", flush=True)
        return 1
    print(f"sftdoctor: rehearsal passed in {time.perf_counter() - began:.0f} s", flush=True)
    return None


def smoke_test(plan, env: dict[str, str], run_dir: Path) -> int:
    """`--smoke`: the whole pipeline in seconds on the shrunk model, with a save and a resume."""
    began = time.perf_counter()
    code = rehearse(plan, env)
    verdict = "passed" if code == 0 else f"FAILED (exit {code})"
    print(
        f"\nsftdoctor: smoke test {verdict}: {REHEARSAL_STEPS} steps with a save at step {REHEARSAL_SAVE_AT} and a "
        f"resume, in {time.perf_counter() - began:.0f} s ({run_dir})"
    )
    return code
