"""The workers' processes: found below the launcher's child, stopped together, whatever session they are in."""

import subprocess
import sys
import time

from sftdoctor.train.processes import descendants, run_workers, stop_workers

# A parent that starts a child in a session of its own (as torchrun starts each rank), then waits.
PARENT = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
    "start_new_session=True); time.sleep(300)"
)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_child_in_a_session_of_its_own_is_found_and_stopped_with_its_parent():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True)
    deadline = time.monotonic() + 30
    while not descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    [child] = descendants(proc.pid)
    began = time.monotonic()
    stop_workers(proc, grace_s=5)
    assert proc.poll() is not None and not alive(child) and time.monotonic() - began < 10


def test_run_workers_gives_the_exit_code_and_no_signal(tmp_path):
    code, sig = run_workers(
        [sys.executable, "-c", "raise SystemExit(3)"], env={"PATH": "/usr/bin:/bin"}, log=tmp_path / "train.log"
    )
    assert (code, sig) == (3, None)


def test_a_log_receives_everything_the_workers_print(tmp_path):
    log = tmp_path / "rehearsal.log"
    code, _ = run_workers(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
        env={"PATH": "/usr/bin:/bin"},
        log=log,
    )
    assert code == 0 and sorted(log.read_text().split()) == ["err", "out"]  # both streams, in one file


def test_echoed_output_reaches_the_terminal_folded_and_the_log_whole(tmp_path, capfd):
    script = (
        "print('[rank1]: [rank1]: ValueError: x', flush=True); "
        "print('DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully')"
    )
    code, _ = run_workers(
        [sys.executable, "-c", script], env={"PATH": "/usr/bin:/bin"}, log=tmp_path / "train.log", echo=True
    )
    shown = capfd.readouterr().out
    assert code == 0 and shown == "[rank1]: ValueError: x\n"
    assert (tmp_path / "train.log").read_text().count("[rank1]:") == 2 and "built successfully" in (
        tmp_path / "train.log"
    ).read_text()
