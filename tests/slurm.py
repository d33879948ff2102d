"""A real Slurm on this machine for the tests: munged, slurmctld and slurmd (Debian's slurm-wlm) started with a
generated slurm.conf in a temporary folder, one node (this host) in one partition, torn down after. The tests
skip with the reason when Slurm is not installed or does not start; under CI, which installs it (.ci/run), that
skip fails the run (conftest)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sftdoctor.facts.system import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")


def conf(folder: Path, host: str) -> str:
    return "\n".join(
        [
            "ClusterName=sftdoctor-tests",
            f"SlurmctldHost={host}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={folder}/state",
            f"SlurmdSpoolDir={folder}/spool",
            f"SlurmctldPidFile={folder}/slurmctld.pid",
            f"SlurmdPidFile={folder}/slurmd.pid",
            f"SlurmctldLogFile={folder}/slurmctld.log",
            f"SlurmdLogFile={folder}/slurmd.log",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "KillWait=30",
            # A requeued job waits cred_expire (default 120 s) before it may start again; the test need not.
            "AuthInfo=cred_expire=10",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            f"NodeName={host} CPUs={os.cpu_count() or 1} RealMemory=2000 State=UNKNOWN",
            f"PartitionName=tests Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


MUNGE_PID = Path("/run/munge/munged.pid")


def _munge() -> tuple[str | None, bool]:
    """(why munged is not running, whether it was started here: then it is stopped after)."""
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return None, False
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], capture_output=True)
    started = subprocess.run(["munged", "--force"], capture_output=True, text=True)
    time.sleep(0.5)
    if subprocess.run(["munge", "-n"], capture_output=True).returncode:
        return f"munged did not start: {started.stderr.strip()[-200:]}", False
    return None, True


def require_slurm(*commands: str) -> None:
    """Skip (a failure under CI, conftest) unless these Slurm commands are installed and this is root."""
    missing = [c for c in commands if shutil.which(c) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"no Slurm here ({', '.join(missing) or 'needs root'}; apt-get install slurm-wlm munge)")


@contextlib.contextmanager
def cluster(folder: Path):
    """The environment to run Slurm commands with (SLURM_CONF set)."""
    require_slurm(*DAEMONS)
    why, started = _munge()
    if why:
        pytest.skip(why)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "slurm.conf").write_text(conf(folder, socket.gethostname()))
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    daemons = [
        subprocess.Popen(
            [name, "-D", "-f", env["SLURM_CONF"]],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name in ("slurmctld", "slurmd")
    ]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout.strip()
            if state in ("idle", "mix", "alloc"):
                break
            time.sleep(0.5)
        else:
            log = folder / "slurmctld.log"
            pytest.skip(f"Slurm did not come up: {log.read_text()[-300:] if log.exists() else 'no log'}")
        yield env
    finally:
        subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True)
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
        if started and MUNGE_PID.exists():
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(MUNGE_PID.read_text().strip()), 15)


def job_state(env: dict, job: str) -> str | None:
    """The job's state (PENDING, RUNNING, COMPLETED, ...), None once slurmctld forgot it."""
    out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True)
    for word in out.stdout.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return None


def wait_for(env: dict, job: str, states: tuple[str, ...], timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    state = job_state(env, job)
    while time.monotonic() < deadline and state not in states:
        time.sleep(1)
        state = job_state(env, job)
    return state
