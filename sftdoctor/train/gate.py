"""The gate of `sftdoctor train` (and of each trial of `sftdoctor sweep`): the preflight checks on this machine
and config, their record in the run directory, and every node's verdict shared before a multi-node run."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from sftdoctor import render
from sftdoctor.checks import load_checks, run_checks, silence, split_ids, to_silence
from sftdoctor.distributed import gate as shared_gate
from sftdoctor.facts import Facts, Inputs, launch_inputs
from sftdoctor.files import write_atomic
from sftdoctor.findings import Severity
from sftdoctor.run import Plan
from sftdoctor.run.layout import FACTS, FINDINGS
from sftdoctor.train import compat
from sftdoctor.train.launch import rendezvous_id
from sftdoctor.train.run_dir import owner


def gate(facts: Facts, plugins: bool, disable: tuple[str, ...] = ()) -> tuple[list, bool]:
    """The preflight suite on this machine and this config, the findings of the ids turned off (--disable, the
    config's [checks] disable) shown silenced, as `check --config` does; (findings, any error not silenced)."""
    registry = load_checks(plugins)
    ids = to_silence(registry, disable, facts)  # an unknown id refused before any check runs
    findings, skipped = run_checks(registry.phase("preflight"), facts)
    findings = registry.problems + silence(findings, ids)
    render.render_table(findings, skipped)
    return findings, render.exit_code(findings) == 1


def preflight(
    config: Path, plugins: bool, facts_file: Path | None = None, disable: tuple[str, ...] = ()
) -> tuple[Facts, list, bool]:
    """The gate of `sftdoctor train`, and of every trial of `sftdoctor sweep`: the run config and its data read
    (bad input raises, before anything runs), the preflight checks run and shown; (facts, findings, any
    error). `facts_file`: judge a recorded machine's facts (`sftdoctor facts`) instead of this one's."""
    facts = Facts(Inputs(config=config, facts=facts_file))
    launch_inputs.require(facts)  # bad input, as `check --config` refuses it: exit 2 before anything runs
    findings, blocked = gate(facts, plugins, disable)
    return facts, findings, blocked


def silenced_ids(facts: Facts, disable: tuple[str, ...]) -> tuple[str, ...]:
    """The ids the gate silenced (already checked there), for the plan: --disable's and [checks] disable."""
    return tuple(dict.fromkeys((*split_ids(disable), *facts.get("run").checks.disable)))


def record_preflight(run_dir: Path, findings: list, forced: bool = False) -> None:
    """The gate's findings appended to RUN_DIR/findings.jsonl (the report marks them before step 0)."""
    with open(run_dir / FINDINGS, "a", encoding="utf-8") as log:
        for finding in findings:
            log.write(
                json.dumps(
                    {
                        "phase": "preflight",
                        "time": time.time(),
                        "host": socket.gethostname(),
                        "forced": forced,
                        **finding.to_json(),
                    },
                    default=str,
                )
                + "\n"
            )


def record_facts(run_dir: Path, facts: Facts, plan: Plan) -> None:
    """The facts the gate judged (the stack, the GPUs, the environment, the plan) and a digest of every data file
    (a hub dataset's shards, and a folder's README that maps them to splits), kept in RUN_DIR/facts.json: what
    `sftdoctor diff` compares between two runs."""
    readme = (facts.get("data_source") or {}).get("readme")
    names = (*plan.train_files, *plan.eval_files, *([readme] if readme else []))
    files = {name: digest(Path(name)) for name in names}
    write_atomic(run_dir / FACTS, json.dumps({**facts.collected(), "data_files": files}, indent=1, default=str) + "\n")


def digest(path: Path) -> dict[str, Any]:
    """sha256 and size of a file, read in 1 MiB blocks."""
    sha = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                sha.update(block)
        return {"sha256": sha.hexdigest(), "bytes": path.stat().st_size}
    except OSError as exc:
        return {"error": exc.strerror or str(exc)}


def rejoining(plan: Plan) -> bool:
    """A node other than 0 that finds its run in progress at the rendezvous (it crashed and is back, and the
    others wait in a restart round): it joins that round, without the shared gate or a rehearsal."""
    if plan.nnodes == 1 or owner(plan) or plan.rehearsal:
        return False
    if not shared_gate.in_progress(plan.master_addr, plan.master_port, compat.rendezvous_key(rendezvous_id(plan))):
        return False
    print(
        f"\nsftdoctor: the run is in progress at {plan.master_addr}:{plan.master_port}: this node rejoins it "
        f"(torchrun's next restart round; {plan.max_restarts} restart{'s' if plan.max_restarts != 1 else ''} allowed)",
        flush=True,
    )
    return True


def nodes_agree(plan: Plan, findings: list, blocked: bool) -> bool:
    """Every node's gate verdict, shared (sftdoctor.distributed.gate): whether all of them let the run start. Says
    which node stops it, or which never came."""
    errors = [f.title for f in findings if f.severity is Severity.ERROR and not f.silenced]
    print(
        f"\nsftdoctor: waiting for all {plan.nnodes} nodes' checks at {plan.master_addr}:{plan.master_port}", flush=True
    )
    try:
        verdicts = shared_gate.share(
            plan.master_addr,
            plan.master_port,
            plan.nnodes,
            plan.node_rank == 0,
            plan.join_timeout_s,
            {"blocked": blocked, "errors": errors},
        )
    except shared_gate.GateError as e:
        print(f"sftdoctor: not starting: {e}", flush=True)
        return False
    me = socket.gethostname()
    others = [v for v in shared_gate.blocking(verdicts) if v["host"] != me]
    for v in others:
        print(
            f"sftdoctor: not starting: the checks on {v['host']} found errors: {'; '.join(v['errors'])} "
            "(fix them there, or run with --force on it)",
            flush=True,
        )
    if not others:
        print(
            f"sftdoctor: {'every node passed its checks' if not blocked else 'the other nodes passed their checks'}: "
            f"{', '.join(v['host'] for v in verdicts)}",
            flush=True,
        )
    return not others


TRAINING_STACK = ("torch", "transformers", "trl", "accelerate", "datasets")


def require_training_stack() -> None:
    """Before any check runs: a light install (`pip install -e .`) has none of the stack the workers import."""
    for module in TRAINING_STACK:
        if find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
