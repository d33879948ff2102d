"""Ctrl-C (and SIGTERM) at each moment of `sftdoctor train` a user can press it: during the checks before any
worker starts, and while the curves are read at the end. Each time: one line saying what happened, the exit
code of the signal, no traceback, nothing left running. (During training: test_watch.py.)

The moment is made certain with a third-party check that announces itself in a file and then waits: the signal
arrives while it runs, as it would during a slow probe."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import install_plugin
from trainrun import config

STALLING = """
import os, time
from pathlib import Path
from sftdoctor.checks import check
from sftdoctor.findings import ok

PHASE = os.environ["STALL_PHASE"]

def stall():
    Path(os.environ["STALL_MARK"]).write_text(str(os.getpid()))
    time.sleep(120)
    return ok("waited")

if PHASE == "preflight":
    @check("site-stall", "a check that waits, for a signal to arrive during the checks", phase="preflight")
    def site_stall(env):
        return stall()
else:
    @check("site-stall", "a curve reader that waits, for a signal to arrive at the end of the run", phase="postrun")
    def site_stall(curves):
        return stall()
"""


def started(tmp_path, phase, tiny_data):
    site = tmp_path / "site"
    site.mkdir()
    mark = tmp_path / "stalled"
    env = {**install_plugin(site, STALLING), "STALL_PHASE": phase, "STALL_MARK": str(mark)}
    cfg = config(tmp_path, tiny_data["text"], training={"packing": False, "max_steps": 2, "save_steps": 2})
    proc = subprocess.Popen(
        [sys.executable, "-m", "sftdoctor", "train", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not mark.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    return proc, cfg


def left_running(proc) -> list[str]:
    """Processes of the command's session still alive (it ran in a session of its own)."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) == proc.pid:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    alive.append(f.read().replace(b"\0", b" ").decode()[:120])
        except OSError:
            pass
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_during_the_checks_stops_before_training_with_one_line(tmp_path, tiny_data, sig, code):
    proc, cfg = started(tmp_path, "preflight", tiny_data)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == f"sftdoctor: interrupted ({sig.name}) before training started"
    assert not (tmp_path / "out" / "train.log").exists() and not (tmp_path / "out" / "metrics.jsonl").exists()
    assert not left_running(proc)


@pytest.mark.slow
def test_ctrl_c_while_the_curves_are_read_keeps_the_finished_run_and_says_how_to_draw_them(tmp_path, tiny_data):
    proc, cfg = started(tmp_path, "postrun", tiny_data)
    assert (tmp_path / "out" / "final").is_dir()  # trained and saved before the curves are read
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in out + err
    assert f"report       not written (interrupted): sftdoctor report {tmp_path / 'out'}" in out, out[-2000:]
    assert proc.returncode == 0, err[-2000:]  # the run itself completed
    assert not left_running(proc)
