"""The one way a probe runs in a child process: answers, failures of one shape, nothing left running."""

import os
import signal
import threading
import time

import pytest

from sftdoctor.facts.child import in_child

CHILD = """
import json, os, subprocess, sys, time
from sftdoctor.facts.child import serve

def answer(request):
    if request == "hang":  # a grandchild too, as a probe's tokenizer or compiler would start
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(os.environ["MARK"], "w").write(str(grandchild.pid))
        time.sleep(600)
    if request == "crash":
        sys.stderr.write("Segmentation fault (core dumped)\\n")
        os._exit(139)
    if request == "raise":
        raise ValueError("bad request\\nsecond line")
    return {"echo": request}

serve(answer)
"""


@pytest.fixture
def child(tmp_path, monkeypatch):
    (tmp_path / "probe_child.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("MARK", str(tmp_path / "grandchild"))
    return tmp_path / "grandchild"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone(pid: int, within_s: float = 10.0) -> bool:
    """SIGKILL is delivered asynchronously: the grandchild is gone moments after its group was killed."""
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_the_answer_comes_back(child):
    assert in_child("probe_child", [1, "a"], "the echo", 60) == {"echo": [1, "a"]}


def test_a_crash_and_an_exception_are_errors_of_one_shape(child):
    assert in_child("probe_child", "crash", "the probe", 60) == {
        "error": "the probe failed: Segmentation fault (core dumped)"
    }
    assert in_child("probe_child", "raise", "the probe", 60) == {"error": "ValueError: bad request"}


@pytest.mark.slow  # waits out its timeout, long enough for the child to start its grandchild on a loaded machine
def test_a_hang_is_killed_with_everything_it_started(child):
    assert in_child("probe_child", "hang", "the probe", 15) == {"error": "the probe took over 15 s"}
    assert gone(int(child.read_text()))


def test_ctrl_c_while_waiting_kills_the_child_and_its_children(child):
    def interrupt():
        while not child.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        in_child("probe_child", "hang", "the probe", 120)
    assert gone(int(child.read_text()))
