"""`sftdoctor train RUN.toml --sbatch [--submit]`: the run as a Slurm batch job.

The script asks for the run's nodes with one task each (one sftdoctor launcher per node, which starts torchrun
and the node's ranks; inside the allocation the launch comes from Slurm, facts/slurm.py), and for SIGTERM
`[slurm] signal_s` before the time limit. Every launcher then stops its ranks, keeping the newest complete
checkpoint, and exits 143. The script requeues the job, and the next start resumes it (`--resume` on a run
that has no checkpoint yet starts from scratch). The run directory must be on storage every node sees.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from sftdoctor import __version__
from sftdoctor.errors import InputError
from sftdoctor.files import write_atomic
from sftdoctor.run import Plan
from sftdoctor.run.config import RunConfig
from sftdoctor.run.layout import BATCH

REQUEUE_EXIT = 143  # the launcher's exit on SIGTERM: the time limit's signal, a pre-emption, `scancel --signal=TERM`


def gpus_per_node(plan: Plan, run: RunConfig) -> int | None:
    """[slurm] gpus_per_node, else [launch] nproc_per_node where the user gave a number, else the GPUs the plan
    found here (a login node often has none: then the script asks for none)."""
    if run.slurm.gpus_per_node is not None:
        return run.slurm.gpus_per_node or None
    if run.launch.nproc_per_node != "auto" or plan.cuda:
        return plan.nproc_per_node if plan.cuda or run.launch.is_given("nproc_per_node") else None
    return None


def script(plan: Plan, config: Path, run: RunConfig) -> str:
    slurm, run_dir = run.slurm, Path(plan.output_dir).resolve()
    options = [
        f"--job-name=sftdoctor-{Path(plan.output_dir).name}",
        f"--nodes={plan.nnodes}",
        "--ntasks-per-node=1",
        f"--output={run_dir}/slurm-%j.out",
        "--open-mode=append",
        "--requeue",
        f"--signal=TERM@{slurm.signal_s}",
    ]
    gpus = gpus_per_node(plan, run)
    if gpus:
        options.append(f"--gpus-per-node={gpus}")
    for flag, value in (
        ("--cpus-per-task", slurm.cpus_per_task),
        ("--time", slurm.time),
        ("--partition", slurm.partition),
        ("--account", slurm.account),
    ):
        if value is not None:
            options.append(f"{flag}={value}")
    command = [sys.executable, "-m", "sftdoctor", "train", str(config.resolve()), "--resume"]
    if plan.silenced:  # the job's gate silences what this one did (--disable is not in the config)
        command.append(f"--disable={','.join(plan.silenced)}")
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Written by `sftdoctor train {config.name} --sbatch` (sftdoctor {__version__}): submit it with sbatch.",
            "# One sftdoctor launcher per node; each takes the launch from Slurm (nodes, SLURM_NODEID, the first node,",
            "# the GPUs per node). SIGTERM before the time limit stops the ranks with the newest complete checkpoint",
            "# kept; the job then requeues itself and resumes from it.",
            *(f"#SBATCH {option}" for option in options),
            "set -u",
            f"cd {shlex.quote(str(config.resolve().parent))}",
            f"srun --kill-on-bad-exit=1 {shlex.join(command)}",
            "code=$?",
            f'if [ "$code" -eq {REQUEUE_EXIT} ]; then',
            '    echo "sftdoctor: stopped by SIGTERM (time limit or pre-emption): requeueing job $SLURM_JOB_ID"',
            '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
            "fi",
            'exit "$code"',
            "",
        ]
    )


def write(plan: Plan, config: Path, run: RunConfig) -> Path:
    """RUN_DIR/sbatch.sh, whole or not at all."""
    run_dir = Path(plan.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / BATCH
    write_atomic(path, script(plan, config, run), mode=0o755)
    return path


def submit(path: Path) -> str:
    """The job id sbatch gives the script."""
    try:
        out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise InputError("--submit", "sbatch is not on the PATH (is this a Slurm login node?)") from None
    except subprocess.TimeoutExpired:
        raise InputError("--submit", "sbatch did not answer within 60 s (is slurmctld up?)") from None
    if out.returncode:
        said = (out.stderr or out.stdout).strip().splitlines()
        raise InputError(path, f"sbatch refused it: {said[-1] if said else f'exit {out.returncode}'}")
    job = re.match(r"\d+", out.stdout.strip())
    if job is None:
        raise InputError(path, f"sbatch answered {out.stdout.strip()!r}, not a job id")
    return job.group()
