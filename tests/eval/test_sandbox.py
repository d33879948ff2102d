"""The sandbox of `sftdoctor eval --code`, against hostile programs, for real under bubblewrap: each must fail
safely within its limits, be reported as what it was (never a forged pass, never a limit the evaluator did not
see), leave nothing running and write nothing outside its private /tmp, reach no other process, no keyring
and no network; correct programs still pass. Docker's command and its token path with a stand-in CLI.
docs/sandbox.md is the threat model these tests hold the sandbox to."""

from __future__ import annotations

import json
import os
import resource
import socket
import stat
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from sftdoctor.eval import cgroup, sandbox
from sftdoctor.eval.sandbox import Limits

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "code"
PYTHON = sandbox.interpreter()
WHY_NOT = sandbox.available("bubblewrap")


@pytest.fixture
def bwrap():
    """Not skipped where bubblewrap is missing: .ci/run and the README's test command install it."""
    assert WHY_NOT is None, f"the sandbox tests need bubblewrap (apt-get install bubblewrap): {WHY_NOT}"


needs_bwrap = pytest.mark.usefixtures("bwrap")
LIMITS = Limits(wall_s=5)


def marked(source: str, marker: str) -> str:
    """The program run by a child re-executed with a marker in its argv (rlimits survive exec), so that any
    process it leaves behind can be found on the host by its command line. The parent waits and exits with
    the child's code: it runs to its end (the harness's pass) only when the child exited 0."""
    body = f"# {marker}\n{source}"
    return (
        f"import os, sys\npid = os.fork()\nif pid == 0:\n"
        f"    os.execv({PYTHON!r}, [{PYTHON!r}, '-I', '-S', '-c', {body!r}])\n"
        "code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "if code:\n    sys.exit(code if code > 0 else 128 - code)\n"
    )


def running(marker: str) -> list[int]:
    """Host processes whose command line holds the marker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def run(source: str, limits: Limits = LIMITS) -> sandbox.Outcome:
    return sandbox.Bubblewrap().run(source, limits)


@pytest.fixture
def marker():
    value = f"sftdoctor-hostile-{uuid.uuid4().hex}"
    yield value
    assert running(value) == [], "a sandboxed process outlived its run"


# --- the hostile set ---------------------------------------------------------------------------------------


def attempts(tries: dict[str, str]) -> str:
    """A program that evaluates each expression and prints {name: ["done", value] or [exception, strerror]}."""
    return (
        "import json, os, socket\nseen = {}\n"
        f"for name, expression in {tries!r}.items():\n"
        "    try:\n        seen[name] = ['done', repr(eval(expression))[:200]]\n"
        "    except OSError as e:\n        seen[name] = [type(e).__name__, e.strerror]\n"
        "print(json.dumps(seen))\n"
    )


def attempted(marker: str, tries: dict[str, str], limits: Limits = LIMITS) -> dict[str, list]:
    outcome = run(marked(attempts(tries), marker), limits)
    assert outcome.status == "passed", outcome
    return json.loads(outcome.stdout)


@needs_bwrap
def test_no_connection_to_a_socket_listening_on_the_host_loopback(marker):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        seen = attempted(marker, {"tcp": f"socket.create_connection(('127.0.0.1', {port}), timeout=2)"})
        listener.settimeout(0.2)
        with pytest.raises(socket.timeout):
            listener.accept()
    assert seen["tcp"] == ["ConnectionRefusedError", "Connection refused"]  # its own loopback, nobody listening


@needs_bwrap
def test_no_connection_to_an_outside_address_nor_name_resolution(marker):
    seen = attempted(
        marker,
        {
            "tcp": "socket.create_connection(('1.1.1.1', 53), timeout=2)",
            "udp": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('1.1.1.1', 53))",
            "dns": "socket.getaddrinfo('example.com', 80)",
        },
    )
    assert seen["tcp"] == seen["udp"] == ["OSError", "Network is unreachable"], seen
    assert seen["dns"][0] == "gaierror", seen


@needs_bwrap
def test_no_home_no_root_no_shadow_no_environment(marker, tmp_path, monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(secret)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SFTDOCTOR_TEST_TOKEN", secret)
    paths = [str(home / ".ssh" / "id_rsa"), "/etc/shadow", "/etc/passwd", "/root", str(REPO)]
    root_secret = Path(f"/root/.sftdoctor-secret-{uuid.uuid4().hex}")
    if os.access("/root", os.W_OK):
        root_secret.write_text(secret)
        paths.append(str(root_secret))
    tries = {path: f"os.listdir({path!r}) if os.path.isdir({path!r}) else open({path!r}).read()" for path in paths}
    try:
        seen = attempted(marker, {**tries, "env": "dict(os.environ)", "home": "os.path.expanduser('~')"})
    finally:
        root_secret.unlink(missing_ok=True)
    assert secret not in json.dumps(seen)
    assert all(seen[path][0] == "FileNotFoundError" for path in paths), seen
    assert seen["home"] == ["done", "'/tmp'"] and "SFTDOCTOR_TEST_TOKEN" not in seen["env"][1]


@needs_bwrap
def test_nothing_written_outside_the_private_tmp(marker, tmp_path):
    tag = uuid.uuid4().hex
    inside = f"/tmp/owned-{tag}"
    outside = [
        f"{REPO}/owned-{tag}",
        f"/root/owned-{tag}",
        f"{tmp_path}/owned-{tag}",
        f"/usr/owned-{tag}",
        f"/owned-{tag}",
        f"/dev/shm/owned-{tag}",
        f"/etc/owned-{tag}",
        f"{Path.home()}/owned-{tag}",
    ]
    seen = attempted(marker, {path: f"open({path!r}, 'w').write('owned')" for path in [inside, *outside]})
    assert seen[inside] == ["done", "5"]  # its own /tmp, a tmpfs that goes with it
    assert not any(seen[path][0] == "done" for path in outside), seen
    assert not any(os.path.exists(path) for path in [inside, *outside])
    again = run(f"import os\nprint(os.path.exists({inside!r}))")
    assert again.stdout == "False\n"  # every run gets a fresh /tmp


@needs_bwrap
def test_the_private_tmp_and_each_file_are_bounded(marker):
    seen = attempted(
        marker,
        {
            "big": "open('/tmp/big', 'wb').write(b'x' * (2 << 20))",
            "many": "[open(f'/tmp/f{i}', 'wb').write(b'x' * ((1 << 20) - 1)) for i in range(8)]",
        },
        Limits(wall_s=5, tmp_bytes=4 << 20, file_bytes=1 << 20),
    )
    assert seen == {"big": ["OSError", "File too large"], "many": ["OSError", "No space left on device"]}


@needs_bwrap
@pytest.mark.slow
def test_a_fork_bomb_is_bounded_and_leaves_nothing(marker):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    outcome = run(marked(bomb, marker), Limits(wall_s=3, processes=16))
    assert time.monotonic() - start < 3 + 5
    assert outcome.status == "timeout" and not outcome.passed
    assert running(marker) == []
    assert run("print('still fine')").stdout == "still fine\n"


@needs_bwrap
def test_a_fork_bomb_without_a_handler_dies_on_the_process_limit(marker):
    outcome = run(marked("import os\nwhile True:\n    os.fork()\n", marker), Limits(wall_s=5, processes=16))
    assert outcome.status == "failed" and "BlockingIOError" in outcome.stderr


@needs_bwrap
@pytest.mark.slow
def test_an_infinite_loop_times_out_and_is_killed(marker):
    outcome = run(marked("while True:\n    pass\n", marker), Limits(wall_s=1))
    assert outcome.status == "timeout" and outcome.exit_code is None
    assert 1 <= outcome.wall_s < 3
    assert "wall-clock limit of 1 s" in outcome.error


@needs_bwrap
@pytest.mark.slow
def test_the_cpu_limit_kills_a_busy_child_that_the_wall_clock_would_let_run(marker):
    outcome = run(marked("while True:\n    pass\n", marker), Limits(wall_s=30, cpu_s=1))
    assert outcome.status == "killed" and "CPU-time limit of 1 s reached" in outcome.error  # not the wall clock
    assert outcome.cpu_s >= 1


@needs_bwrap
def test_allocating_twice_the_memory_limit_is_refused(marker):
    """2 GiB against a 1 GiB limit, on a machine with far more: only the limit refuses it."""
    outcome = run(marked("x = bytearray(2 << 30)\nprint('ALLOCATED')", marker))
    assert outcome.status == "failed" and outcome.error.startswith("MemoryError")
    assert "ALLOCATED" not in outcome.stdout


@needs_bwrap
@pytest.mark.slow
def test_printing_1_gb_is_capped_and_the_evaluator_stays_small(marker):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    source = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\nprint('END')"
    outcome = run(marked(source, marker), Limits(wall_s=30, cpu_s=30))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert outcome.status == "passed"
    assert len(outcome.stdout) == Limits().output_bytes and outcome.stdout.endswith("xEND\n")
    assert outcome.dropped_bytes == (1 << 30) + 4 - Limits().output_bytes
    assert grown < 32 << 10, f"the evaluator grew by {grown} KiB"


@needs_bwrap
def test_killing_its_parent_only_kills_itself_and_is_no_limit(marker):
    source = (
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"  # PID 1 of its namespace: ignored
        "try:\n    os.kill(-1, signal.SIGKILL)\n"  # every process it may signal: none but itself and PID 1
        "except ProcessLookupError:\n    print('nothing else to kill')\n"
        "print('parent', os.getppid(), flush=True)\nos.killpg(0, signal.SIGKILL)\nprint('NOT REACHED')"
    )
    outcome = run(source)
    assert outcome.status == "failed" and outcome.signal is None  # its own doing: the evaluator killed nothing
    assert outcome.error.startswith("exit code 137: killed by SIGKILL, or an exit code of its own")
    assert outcome.stdout == "nothing else to kill\nparent 1\n"
    assert run("print('evaluator alive')").passed


@needs_bwrap
def test_a_daemon_left_behind_is_gone_after_the_run(marker):
    source = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sh', ['sh', '-c', 'echo daemon up; sleep 1000; : {marker}'])\n"
        "    os._exit(0)\ntime.sleep(0.3)\nprint('leaving', flush=True)"
    )
    outcome = run(marked(source, marker))
    assert outcome.status == "passed" and "daemon up" in outcome.stdout
    assert outcome.wall_s < 3
    assert running(marker) == []


# --- what the sandbox is ---------------------------------------------------------------------------------


@needs_bwrap
def test_inside_no_privileges_no_host_processes_no_proc():
    source = textwrap.dedent("""\
        import errno, json, os
        def tried(call):
            try:
                call()
                return "done"
            except OSError as e:
                return errno.errorcode[e.errno]
        alive = []
        for pid in range(1, 4096):
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        print(json.dumps({"uid": os.getuid(), "pids": alive, "host": os.uname().nodename,
                          "root": sorted(os.listdir("/")), "setuid": tried(lambda: os.setuid(0)),
                          "chown": tried(lambda: os.chown("/tmp", 0, 0))}))
        """)
    seen = json.loads(run(source).stdout)
    assert seen["uid"] == 65534 and seen["setuid"] != "done" and seen["chown"] != "done"  # root is not even mapped
    assert seen["pids"] == [1, 2] and seen["host"] == "sandbox"  # bwrap's PID 1 and itself: no host process
    assert not {"home", "root", "work", "var", "srv", "opt", "mnt", "proc"} & set(seen["root"])


def test_the_bwrap_command_binds_nothing_writable_no_home_no_proc_and_filters_calls():
    fds = {"source": 5, "test": 6, "seccomp": 7, "status": 8, "json": 9}
    argv = sandbox.Bubblewrap(python="/usr/bin/python3").command(Limits(), fds)
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--disable-userns",
        "--tmpfs",
    ):
        assert flag in argv
    assert argv[argv.index("--seccomp") + 1] == "7" and argv[argv.index("--json-status-fd") + 1] == "9"
    assert not {"--bind", "--bind-try", "--dev-bind", "--share-net", "--proc"} & set(argv)
    sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--ro-bind", "--ro-bind-try")]
    assert all(s == "/usr" or s.startswith(("/etc/ld.so.cache", "/lib", "/bin", "/sbin")) for s in sources), sources
    assert argv[-6:-1] == ["--", os.path.realpath("/usr/bin/python3"), "-I", "-S", "-c"]
    assert argv[-1].startswith(sandbox.MARK) and "main(" in argv[-1] and ", 8, " in argv[-1]  # the token's fd


@needs_bwrap
def test_correct_and_wrong_programs_and_the_kept_tail():
    assert run("print('ok')").status == "passed"
    wrong = run("def f():\n    return 1\nassert f() == 2\n")
    assert wrong.status == "failed" and wrong.error == "AssertionError" and wrong.exit_code == 1
    assert 'File "/sandbox/main.py", line 3' in wrong.stderr and "assert f() == 2" in wrong.stderr
    assert wrong.stderr.startswith("Traceback") and '"<string>"' not in wrong.stderr  # no harness frames
    assert run("exit(3)").exit_code == 3  # exit() exists although site is skipped
    tail = run("print('a' * 100000 + 'END')", Limits(output_bytes=1024))
    assert tail.stdout == "a" * 1020 + "END\n" and tail.dropped_bytes == 100004 - 1024


@needs_bwrap
def test_a_sandbox_that_cannot_start_is_an_error_not_a_failure():
    outcome = sandbox.Bubblewrap(python="/usr/bin/no-such-python").run("print(1)", LIMITS)
    assert outcome.status == "error" and "no-such-python" in outcome.error


# --- a pass cannot be forged ---------------------------------------------------------------------------------

# The test's names (METADATA, check) are its own: a sample that could see them could also swap them.
WRONG = sandbox.Program("def f():\n", "METADATA = {}\n\ndef check(candidate):\n    assert candidate() == 1\n", "f")
FORGERIES = {
    "exit()": "    exit()\n",
    "sys.exit(0)": "    import sys\n    sys.exit(0)\n",
    "os._exit(0)": "    import os\n    os._exit(0)\n",
    "raise SystemExit": "    raise SystemExit\n",
    "an exit at module level": "    return 2\nexit(0)\n",
    "sys.excepthook": "    return 2\nimport os, sys\nsys.excepthook = lambda *args: os._exit(0)\n",
    "atexit": "    return 2\nimport atexit, os\natexit.register(os._exit, 0)\n",
    "a thread calling os._exit(0)": (
        "    import os, threading, time\n"
        "    threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0))).start()\n"
        "    time.sleep(2)\n    return 2\n"
    ),
    "the harness's own audit event": (
        "    import os, sys\n    sys.audit('sftdoctor.start')\n    sys.audit('sftdoctor.checked')\n    os._exit(0)\n"
    ),
    "patching exec": (
        "    return 2\nimport builtins\n"
        "builtins.exec = lambda code, names, *a: names.__setitem__('check', lambda candidate: None)\n"
    ),
    "a thread swapping check": (
        "    return 2\nimport threading\ndef swap(g=globals()):\n    while True:\n"
        "        g['check'] = lambda candidate: None\n"
        "threading.Thread(target=swap, daemon=True).start()\n"
    ),
    "reading the test's own names": ("    return 2 if 'METADATA' not in globals() else 1\n"),
    "printing what looks like a pass": "    print('passed', flush=True)\n    import os\n    os._exit(0)\n",
    "introspecting the harness": ("    import gc\n    [o for o in gc.get_objects() if callable(o)]\n"),
}


@needs_bwrap
@pytest.mark.parametrize("how", sorted(FORGERIES))
def test_a_wrong_answer_does_not_pass_by(how):
    outcome = run(sandbox.Program(WRONG.source + FORGERIES[how], WRONG.test, WRONG.entry_point))
    assert outcome.status == "failed", (how, outcome)
    if outcome.exit_code == 0:
        assert outcome.error == "exited with code 0 before the test ran to its end (an exit is not a pass)"


@needs_bwrap
def test_a_right_answer_passes_whatever_it_leaves_behind():
    right = WRONG.source + "    return 1\n"
    lingering = right + "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    exits_3_after = right + "import atexit, os\natexit.register(os._exit, 3)\n"
    for source in (right, lingering, exits_3_after):
        outcome = run(sandbox.Program(source, WRONG.test, WRONG.entry_point), Limits(wall_s=3))
        assert outcome.status == "passed", outcome  # the check ran to its end: human-eval's rule
    assert run(sandbox.Program(right, "def check(candidate):\n    assert candidate() == 2\n", "f")).status == "failed"


@needs_bwrap
@pytest.mark.parametrize(
    "source, signal_name", [("import os\nos._exit(137)", "SIGKILL"), ("import os\nos._exit(152)", "SIGXCPU")]
)
def test_an_exit_code_of_a_signal_is_not_reported_as_the_signal(source, signal_name):
    outcome = run(source)
    assert outcome.status == "failed" and outcome.signal is None
    assert f"killed by {signal_name}" in outcome.error and "or an exit code of its own" in outcome.error


@needs_bwrap
def test_a_memory_error_it_prints_is_not_out_of_memory():
    outcome = run("import sys\nprint('MemoryError', file=sys.stderr)\nsys.exit(1)")
    assert outcome.status == "failed" and outcome.error == "MemoryError" and outcome.signal is None


# --- no other process, no keyring: the kernel's walls, tried by code without the harness's hooks ------------

PROBE = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[a if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    return errno.errorcode.get(ctypes.get_errno(), "?") if result < 0 else "done"
harness = os.getppid()
try:
    init = os.pidfd_open(1)
    getfd = {str(fd): call(438, init, fd, 0) for fd in range(3, 12)}   # pidfd_getfd: bwrap's eventfd among them
except OSError as e:
    getfd = {"pidfd_open": errno.errorcode[e.errno]}
def opened(path):
    try:
        open(path, "rb").close()
        return "done"
    except OSError as e:
        return errno.errorcode[e.errno]
print(json.dumps({
    "ptrace init": call(101, 16, 1, 0, 0), "ptrace harness": call(101, 16, harness, 0, 0),
    "process_vm_readv": call(310, harness, 0, 0, 0, 0, 0), "pidfd_getfd": getfd,
    "keyctl": call(250, 0, -3, 0), "add_key": call(248, b"user", b"sftdoctor-planted", b"x", 1, -3),
    "request_key": call(249, b"user", KEY, 0, -3), "memfd_create": call(319, b"x", 0),
    "io_uring_setup": call(425, 1, 0), "unshare": call(272, 0x10000000),
    "/proc/1/mem": opened("/proc/1/mem"), "/proc/self/mem": opened("/proc/self/mem"),
}))
"""


def keyring(call: str, *args):
    """keyctl(2) and friends on this (the evaluator's) process, through ctypes."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    numbers = {"add_key": 248, "keyctl": 250}
    return libc.syscall(ctypes.c_long(numbers[call]), *[a if isinstance(a, bytes) else ctypes.c_long(a) for a in args])


@needs_bwrap
def test_no_other_process_no_keyring_no_memfd_even_for_code_without_the_harness(tmp_path):
    name = f"sftdoctor-secret-{uuid.uuid4().hex[:8]}".encode()
    secret = keyring("add_key", b"user", name, b"the caller's secret", 19, -3)  # the session keyring
    assert secret > 0, "the evaluator's session keyring is not usable here"
    try:
        probe = PROBE.replace("KEY", repr(name))
        python = os.path.realpath(sandbox.Bubblewrap().python)
        source = (
            f"import subprocess\nrun = subprocess.run([{python!r}, '-I', '-S', '-c', {probe!r}], "
            "capture_output=True, text=True)\nprint(run.stdout, end='')\nprint(run.stderr[-2000:], end='')"
        )
        outcome = run(source)
        assert outcome.status == "passed", outcome
        seen = json.loads(outcome.stdout)
        for call in (
            "ptrace init",
            "ptrace harness",
            "process_vm_readv",
            "keyctl",
            "add_key",
            "request_key",
            "memfd_create",
            "io_uring_setup",
            "unshare",
        ):
            assert seen[call] == "EPERM", (call, seen)
        assert set(seen["pidfd_getfd"].values()) == {"EPERM"}, seen  # bwrap's eventfd stays out of reach
        assert seen["/proc/1/mem"] == seen["/proc/self/mem"] == "ENOENT"  # no /proc at all
        planted = keyring("keyctl", 10, -3, b"user", b"sftdoctor-planted", 0)  # KEYCTL_SEARCH
        assert planted < 0, "a key planted in the sandbox outlived it in the caller's keyring"
        assert keyring("keyctl", 10, -3, b"user", name, 0) == secret  # the caller's own key untouched
    finally:
        keyring("keyctl", 21, secret)  # KEYCTL_INVALIDATE


# --- bounded per sample, and nothing outlives it -------------------------------------------------------------


@needs_bwrap
@pytest.mark.slow
def test_four_processes_share_one_memory_limit():
    source = (
        "import os, time\nchildren = []\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
        "        x = bytearray(700 << 20)\n        time.sleep(2)\n        os._exit(0)\n"
        "    children.append(pid)\nx = bytearray(700 << 20)\n"
        "assert all(os.waitpid(pid, 0)[1] == 0 for pid in children)\nprint('held', flush=True)\n"
    )
    outcome = run(source, Limits(wall_s=20, cpu_s=20))
    assert sandbox.layout().usable, sandbox.layout().why_not
    assert outcome.status == "killed" and outcome.error.startswith("out of memory"), outcome
    assert outcome.memory_peak_bytes <= (1 << 30) + (8 << 20) and "held" not in outcome.stdout


@needs_bwrap
@pytest.mark.slow
def test_busy_processes_share_one_cpu_time_limit():
    """Four busy loops against a 2 s limit: stopped when their time together reaches it, not when each of them
    alone would have (RLIMIT_CPU: 2 s each, 8 s together)."""
    source = "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"
    outcome = run(source, Limits(wall_s=60, cpu_s=2))
    assert outcome.status == "killed" and "all its processes together" in outcome.error, outcome
    assert 2.0 <= outcome.cpu_s < 4, outcome


@needs_bwrap
def test_a_process_holding_the_output_open_does_not_hold_the_evaluator(marker):
    source = (
        "import os, signal, time\nif os.fork() == 0:\n    os.setsid()\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        f"    os.execv('/bin/sh', ['sh', '-c', 'trap \"\" TERM HUP; sleep 1000; : {marker}'])\n"
        "time.sleep(0.3)\nprint('leaving', flush=True)"
    )
    start = time.monotonic()
    outcome = run(source, Limits(wall_s=60))
    assert outcome.status == "passed" and time.monotonic() - start < 20  # not the wall clock: killed at the end
    assert running(marker) == []


@needs_bwrap
def test_the_evaluator_kills_what_bubblewraps_own_cleanup_would_leave(marker, monkeypatch):
    """Without --die-with-parent, bwrap's PID 1 outlives bwrap while a daemon lives, and the daemon with it:
    the evaluator's kill at the end of the sample is what ends them (as it would a PID 1 kept alive)."""
    command = sandbox.Bubblewrap.command
    monkeypatch.setattr(
        sandbox.Bubblewrap, "command", lambda self, *a: [arg for arg in command(self, *a) if arg != "--die-with-parent"]
    )
    source = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n"
        f"    os.execv('/bin/sh', ['sh', '-c', 'sleep 1000; : {marker}'])\nprint('leaving')"
    )
    assert run(source).status == "passed"
    assert running(marker) == []


@needs_bwrap
def test_without_a_cgroup_the_limits_are_per_process_and_the_tree_still_dies(marker, monkeypatch):
    """No cgroup (a read-only /sys/fs/cgroup, say): the summary says so, and PID 1's pidfd is the kill."""
    monkeypatch.setattr(sandbox, "layout", lambda: cgroup.Layout(why_not="a read-only cgroup mount"))
    command = sandbox.Bubblewrap.command
    monkeypatch.setattr(
        sandbox.Bubblewrap, "command", lambda self, *a: [arg for arg in command(self, *a) if arg != "--die-with-parent"]
    )
    box = sandbox.Bubblewrap()
    assert box.isolation().startswith("limits per process (rlimits): a read-only cgroup mount")
    source = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n"
        f"    os.execv('/bin/sh', ['sh', '-c', 'sleep 1000; : {marker}'])\nprint('leaving')"
    )
    outcome = box.run(source, LIMITS)
    assert outcome.status == "passed" and outcome.cpu_s is None and outcome.memory_peak_bytes is None
    assert running(marker) == []
    assert box.run(marked("import os\nos._exit(152)", marker), LIMITS).error.startswith("exit code 152")


@needs_bwrap
def test_a_cancelled_run_is_killed_at_once(marker):
    import threading

    cancel = sandbox.Cancel()
    try:
        threading.Timer(0.5, cancel.set).start()
        start = time.monotonic()
        outcome = sandbox.Bubblewrap().run(
            marked("while True:\n    pass\n", marker), Limits(wall_s=60, cpu_s=60), cancel
        )
        assert time.monotonic() - start < 20  # not the limits: the cancel
        assert outcome.status == "error" and outcome.error.startswith("cancelled")
        assert running(marker) == []
    finally:
        cancel.close()


# --- Docker ------------------------------------------------------------------------------------------------


def test_the_docker_command_has_the_limits_and_the_filter():
    argv = sandbox.Docker().command(Limits(processes=7, tmp_bytes=1 << 20), "name", "/tmp/profile.json")
    joined = " ".join(argv[:-1])
    for part in (
        "--rm",
        "--network none",
        "--read-only",
        "--pids-limit 7",
        "--cap-drop ALL",
        "no-new-privileges",
        "--security-opt seccomp=/tmp/profile.json",
        "--cpus 1",
        "--memory 1073741824",
        "--memory-swap 1073741824",
        "--tmpfs /tmp:rw,nosuid,nodev,size=1048576",
        "--user 65534:65534",
    ):
        assert part in joined
    assert "RLIMIT_NPROC" not in argv[-1]  # counted host-wide under Docker: the cgroup's PID limit instead
    assert argv[-1].startswith(sandbox.MARK) and ", 1, " in argv[-1]  # the token comes back on stdout


def test_docker_passes_on_the_token_alone_and_removes_every_container(tmp_path, monkeypatch):
    """A stand-in docker CLI that runs the harness directly (trusted programs only) and logs the rest."""
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$1" in
  run) while [ "$1" != "-c" ]; do shift; done; exec {sys.executable} -I -S -c "$2" ;;
esac
exit 0
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    box = sandbox.Docker()
    assert box.available() is None
    right = box.run(sandbox.Program(WRONG.source + "    print('hi')\n    return 1\n", WRONG.test, "f"), LIMITS)
    assert right.status == "passed" and right.stdout == "hi\n"  # the token is not left in the output
    forged = box.run(sandbox.Program(WRONG.source + FORGERIES["os._exit(0)"], WRONG.test, "f"), LIMITS)
    assert forged.status == "failed" and forged.exit_code == 0
    runs = [
        line.split()[line.split().index("--name") + 1]
        for line in log.read_text().splitlines()
        if line.startswith("run ")
    ]
    removed = [line.split()[-1] for line in log.read_text().splitlines() if line.startswith("rm -f ")]
    assert len(runs) == 2 and removed == runs
