"""The sandbox of `sftdoctor eval --code`, against hostile programs: each must fail safely within its limits,
be reported as such, leave nothing running and write nothing outside its private /tmp; correct programs still
pass. Then pass@k, the readers' one-line errors, the refusal without a sandbox, and evaluate_code end to end."""

from __future__ import annotations

import json
import math
import os
import resource
import socket
import stat
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from sftdoctor.errors import InputError
from sftdoctor.eval import code, sandbox
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
    """The program re-executed with a marker in its argv (rlimits survive exec), so that any process it
    leaves behind can be found on the host by its command line."""
    body = f"# {marker}\n{source}"
    return f"import os\nos.execv({PYTHON!r}, [{PYTHON!r}, '-I', '-S', '-c', {body!r}])\n"


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
    return ("import json, os, socket\nseen = {}\n"
            f"for name, expression in {tries!r}.items():\n"
            "    try:\n        seen[name] = ['done', repr(eval(expression))[:200]]\n"
            "    except OSError as e:\n        seen[name] = [type(e).__name__, e.strerror]\n"
            "print(json.dumps(seen))\n")


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
    seen = attempted(marker, {
        "tcp": "socket.create_connection(('1.1.1.1', 53), timeout=2)",
        "udp": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('1.1.1.1', 53))",
        "dns": "socket.getaddrinfo('example.com', 80)"})
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
    outside = [f"{REPO}/owned-{tag}", f"/root/owned-{tag}", f"{tmp_path}/owned-{tag}", f"/usr/owned-{tag}",
               f"/owned-{tag}", f"/dev/shm/owned-{tag}", f"/etc/owned-{tag}", f"{Path.home()}/owned-{tag}"]
    seen = attempted(marker, {path: f"open({path!r}, 'w').write('owned')" for path in [inside, *outside]})
    assert seen[inside] == ["done", "5"]  # its own /tmp, a tmpfs that goes with it
    assert not any(seen[path][0] == "done" for path in outside), seen
    assert not any(os.path.exists(path) for path in [inside, *outside])
    again = run(f"import os\nprint(os.path.exists({inside!r}))")
    assert again.stdout == "False\n"  # every run gets a fresh /tmp


@needs_bwrap
def test_the_private_tmp_and_each_file_are_bounded(marker):
    seen = attempted(marker, {
        "big": "open('/tmp/big', 'wb').write(b'x' * (2 << 20))",
        "many": "[open(f'/tmp/f{i}', 'wb').write(b'x' * ((1 << 20) - 1)) for i in range(8)]"},
        Limits(wall_s=5, tmp_bytes=4 << 20, file_bytes=1 << 20))
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
    outcome = run(marked("while True:\n    pass\n", marker), Limits(wall_s=10, cpu_s=1))
    assert outcome.status == "killed" and outcome.signal == 24  # SIGXCPU
    assert "CPU-time limit" in outcome.error and outcome.wall_s < 5


@needs_bwrap
def test_allocating_64_gb_is_refused_by_the_address_space_limit(marker):
    outcome = run(marked("x = bytearray(64 << 30)\nprint('ALLOCATED')", marker))
    assert outcome.status == "failed" and outcome.error == "MemoryError"
    assert "ALLOCATED" not in outcome.stdout


@needs_bwrap
@pytest.mark.slow
def test_printing_1_gb_is_capped_and_the_evaluator_stays_small(marker):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    source = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\nprint('END')"
    outcome = run(marked(source, marker), Limits(wall_s=30))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert outcome.status == "passed"
    assert len(outcome.stdout) == Limits().output_bytes and outcome.stdout.endswith("xEND\n")
    assert outcome.dropped_bytes == (1 << 30) + 4 - Limits().output_bytes
    assert grown < 32 << 10, f"the evaluator grew by {grown} KiB"


@needs_bwrap
def test_killing_its_parent_only_kills_itself(marker):
    source = ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"  # PID 1 of its namespace: ignored
              "try:\n    os.kill(-1, signal.SIGKILL)\n"  # every process it may signal: none but itself and PID 1
              "except ProcessLookupError:\n    print('nothing else to kill')\n"
              "print('parent', os.getppid(), flush=True)\nos.killpg(0, signal.SIGKILL)\nprint('NOT REACHED')")
    outcome = run(marked(source, marker))
    assert outcome.status == "killed" and outcome.signal == 9 and outcome.error == "killed by SIGKILL"
    assert outcome.stdout == "nothing else to kill\nparent 1\n"
    assert run("print('evaluator alive')").passed


@needs_bwrap
def test_a_daemon_left_behind_is_gone_after_the_run(marker):
    source = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        os.execv('/bin/sh', ['sh', '-c', 'echo daemon up; sleep 1000; : {marker}'])\n"
              "    os._exit(0)\ntime.sleep(0.3)\nprint('leaving', flush=True)")
    outcome = run(marked(source, marker))
    assert outcome.status == "passed" and "daemon up" in outcome.stdout
    assert outcome.wall_s < 3
    assert running(marker) == []


# --- what the sandbox is ---------------------------------------------------------------------------------

@needs_bwrap
def test_inside_no_privileges_no_host_processes():
    source = textwrap.dedent("""\
        import json, os
        status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
        print(json.dumps({"uid": os.getuid(), "nnp": status["NoNewPrivs"], "cap": status["CapEff"],
                          "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                          "host": os.uname().nodename, "root": sorted(os.listdir("/"))}))
        """)
    seen = json.loads(run(source).stdout)
    assert seen["nnp"] == "1" and int(seen["cap"], 16) == 0 and seen["uid"] == 65534
    assert seen["pids"] == [1, 2] and seen["host"] == "sandbox"
    assert not {"home", "root", "work", "var", "srv", "opt", "mnt"} & set(seen["root"])


def test_the_bwrap_command_binds_nothing_writable_and_no_home():
    argv = sandbox.Bubblewrap(python="/usr/bin/python3").command(Limits(), 5, 6)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-net", "--die-with-parent", "--new-session",
                 "--clearenv", "--disable-userns", "--tmpfs"):
        assert flag in argv
    assert not {"--bind", "--bind-try", "--dev-bind", "--share-net"} & set(argv)
    sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--ro-bind", "--ro-bind-try")]
    assert all(s == "/usr" or s.startswith(("/etc/ld.so.cache", "/lib", "/bin", "/sbin")) for s in sources), sources
    assert argv[-6:-1] == ["--", os.path.realpath("/usr/bin/python3"), "-I", "-S", "-c"]


@needs_bwrap
def test_correct_and_wrong_programs_and_the_kept_tail():
    assert run("print('ok')").status == "passed"
    wrong = run("def f():\n    return 1\nassert f() == 2\n")
    assert wrong.status == "failed" and wrong.error == "AssertionError" and wrong.exit_code == 1
    assert 'File "/sandbox/main.py", line 3' in wrong.stderr
    assert run("exit(3)").exit_code == 3  # exit() exists although site is skipped
    tail = run("print('a' * 100000 + 'END')", Limits(output_bytes=1024))
    assert tail.stdout == "a" * 1020 + "END\n" and tail.dropped_bytes == 100004 - 1024


@needs_bwrap
def test_a_sandbox_that_cannot_start_is_an_error_not_a_failure():
    outcome = sandbox.Bubblewrap(python="/usr/bin/no-such-python").run("print(1)", LIMITS)
    assert outcome.status == "error" and "no-such-python" in outcome.error


# --- pass@k ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, c, k, expected", [(5, 2, 1, 0.4), (5, 2, 2, 0.7), (5, 0, 1, 0.0), (5, 0, 3, 0.0),
                                               (5, 5, 1, 1.0), (5, 5, 5, 1.0), (5, 4, 2, 1.0), (1, 1, 1, 1.0),
                                               (10, 1, 10, 1.0), (4, 1, 2, 0.5)])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert code.pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_is_the_binomial_formula_and_stable_for_large_n():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert code.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    assert code.pass_at_k(10_000, 37, 100) == pytest.approx(1 - math.comb(9963, 100) / math.comb(10_000, 100))
    assert code.pass_at_ks({"a": (5, 2), "b": (5, 0)}, (1, 2)) == {"pass@1": pytest.approx(0.2),
                                                                    "pass@2": pytest.approx(0.35)}
    with pytest.raises(ValueError):
        code.pass_at_k(3, 1, 4)


def test_truncate_at_the_first_stop_sequence():
    assert code.truncate("    return 1\n\ndef other():\n    pass") == "    return 1\n"
    assert code.truncate("    return 1\n# comment\nprint(1)") == "    return 1"
    assert code.truncate("    return 1\n") == "    return 1\n"


# --- bad input ---------------------------------------------------------------------------------------------

PROBLEM = {"task_id": "t/0", "prompt": "def f():\n", "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}


def jsonl(path: Path, *lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def evaluate(tmp_path, problems, completions, **options):
    settings = {"out": tmp_path / "results.jsonl", "ks": (), "sandbox": "bubblewrap", "workers": 2,
                "timeout_s": 5.0, "json_out": False, **options}
    return code.evaluate_code(problems, completions, **settings)


@pytest.mark.parametrize("problems, completions, message", [
    ([PROBLEM, "{not json"], [], "problems.jsonl: line 2: not valid JSON"),
    ([{k: v for k, v in PROBLEM.items() if k != "entry_point"}], [], "problems.jsonl: line 1: missing 'entry_point'; expected"),
    ([{**PROBLEM, "prompt": 3}], [], "problems.jsonl: line 1: 'prompt' is a JSON int; expected a string"),
    (["[1, 2]"], [], "problems.jsonl: line 1: a JSON list; expected one JSON object per line"),
    ([PROBLEM, PROBLEM], [], "problems.jsonl: line 2: task_id 't/0' again (first on line 1); expected"),
    ([], [], "problems.jsonl: no problems; expected"),
    ([PROBLEM], [{"task_id": "t/0", "completion": "    return 1"}, "", "oops"], "completions.jsonl: line 3: not valid JSON"),
    ([PROBLEM], [{"task_id": "t/0"}], "completions.jsonl: line 1: missing 'completion'; expected task_id and completion"),
    ([PROBLEM], [{"task_id": "t/0", "completion": "x"}, {"task_id": "t/1", "completion": "x"}],
     "completions.jsonl: line 2: task_id 't/1' is not in the problems (did you mean 't/0'?); expected"),
    ([PROBLEM, {**PROBLEM, "task_id": "t/1"}], [{"task_id": "t/0", "completion": "x"}],
     "completions.jsonl: no completion for task_id 't/1'; expected at least one sample"),
])
def test_bad_input_is_one_line_naming_file_and_line(tmp_path, problems, completions, message):
    with pytest.raises(InputError) as caught:
        evaluate(tmp_path, jsonl(tmp_path / "problems.jsonl", *problems),
                 jsonl(tmp_path / "completions.jsonl", *completions))
    text = str(caught.value)
    assert "\n" not in text and "expected" in text
    assert text.startswith(str(tmp_path / message.split(":")[0])) and message.split(": ", 1)[1] in text
    assert not (tmp_path / "results.jsonl").exists()


def test_k_larger_than_the_samples_is_bad_input(tmp_path):
    problems = jsonl(tmp_path / "problems.jsonl", PROBLEM)
    completions = jsonl(tmp_path / "completions.jsonl", *[{"task_id": "t/0", "completion": "    return 1"}] * 2)
    with pytest.raises(InputError, match=r"completions.jsonl: k=5 but task_id 't/0' has 2 samples; expected at "
                                         r"least k samples per task"):
        evaluate(tmp_path, problems, completions, ks=(1, 5))
    with pytest.raises(InputError, match="--k: k=0; expected a positive"):
        evaluate(tmp_path, problems, completions, ks=(0,))


def test_missing_files_and_options(tmp_path):
    with pytest.raises(InputError, match="problems file not found"):
        evaluate(tmp_path, tmp_path / "nope.jsonl", None)
    problems = jsonl(tmp_path / "problems.jsonl", PROBLEM)
    with pytest.raises(InputError, match="give --completions FILE, or --model TARGET --samples N"):
        evaluate(tmp_path, problems, None)
    completions = jsonl(tmp_path / "completions.jsonl", {"task_id": "t/0", "completion": "    return 1"})
    with pytest.raises(InputError, match="--workers: 0; expected at least 1"):
        evaluate(tmp_path, problems, completions, workers=0)
    with pytest.raises(InputError, match="--timeout"):
        evaluate(tmp_path, problems, completions, timeout_s=float("nan"))


# --- no sandbox, no run ------------------------------------------------------------------------------------

def test_without_bwrap_on_path_it_refuses_and_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no docker
    why = sandbox.available("bubblewrap")
    assert "apt-get install bubblewrap" in why
    with pytest.raises(InputError) as caught:
        evaluate(tmp_path, FIXTURES / "problems.jsonl", FIXTURES / "completions.jsonl")
    assert str(caught.value).startswith("--sandbox: bubblewrap (bwrap) not found on PATH: install it: apt-get install "
                                        "bubblewrap") and "no unsandboxed mode" in str(caught.value)
    assert "\n" not in str(caught.value) and not (tmp_path / "results.jsonl").exists()
    assert "docker not found on PATH" in sandbox.available("docker")


def test_docker_without_a_reachable_daemon_refuses(tmp_path, monkeypatch):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                    "Is the docker daemon running?' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert sandbox.available("docker").startswith("no Docker daemon reachable (docker info: Cannot connect")
    with pytest.raises(InputError, match=r"^--sandbox: no Docker daemon reachable .*no unsandboxed mode\)$"):
        evaluate(tmp_path, FIXTURES / "problems.jsonl", FIXTURES / "completions.jsonl", sandbox="docker")
    assert sandbox.available("chroot").startswith("unknown sandbox 'chroot'")


def test_the_docker_command_has_the_limits():
    argv = sandbox.Docker().command(Limits(processes=7, tmp_bytes=1 << 20), "name")
    joined = " ".join(argv[:-1])
    for part in ("--network none", "--read-only", "--pids-limit 7", "--cap-drop ALL", "no-new-privileges",
                 "--tmpfs /tmp:rw,nosuid,nodev,size=1048576", "--user 65534:65534", "--memory "):
        assert part in joined
    assert "RLIMIT_NPROC" not in argv[-1]  # counted host-wide under Docker: the cgroup's PID limit instead


def test_nothing_half_written_on_ctrl_c(tmp_path, monkeypatch):
    class Interrupted:
        name, calls = "fake", 0

        def run(self, program, limits):
            Interrupted.calls += 1
            if Interrupted.calls == 2:
                raise KeyboardInterrupt
            return sandbox.Outcome("passed", 0, None, "", "", 0.0)

    monkeypatch.setattr(sandbox, "available", lambda kind: None)
    monkeypatch.setattr(sandbox, "sandbox", lambda kind: Interrupted())
    with pytest.raises(KeyboardInterrupt):
        evaluate(tmp_path, FIXTURES / "problems.jsonl", FIXTURES / "completions.jsonl", workers=1)
    assert list(tmp_path.iterdir()) == []


# --- end to end --------------------------------------------------------------------------------------------

@needs_bwrap
def test_evaluate_code_on_the_fixtures(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    assert evaluate(tmp_path, FIXTURES / "problems.jsonl", FIXTURES / "completions.jsonl", ks=(1, 2), out=out) == 0
    printed = capsys.readouterr().out
    assert "pass@1     0.500" in printed and "pass@2     1.000" in printed and f"results: {out}" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["sample"], r["status"]) for r in rows] == [
        ("sftdoctor/0", 0, "passed"), ("sftdoctor/0", 1, "failed"), ("sftdoctor/1", 0, "passed"),
        ("sftdoctor/1", 1, "failed"), ("sftdoctor/2", 0, "passed"), ("sftdoctor/2", 1, "failed")]
    assert rows[5]["error"] == "OSError: [Errno 101] Network is unreachable"
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]


@needs_bwrap
@pytest.mark.slow
def test_evaluate_code_with_hostile_completions(tmp_path, capsys):
    tag = uuid.uuid4().hex
    completions = [
        ("sftdoctor/0", "    return max(lo, min(x, hi))\n"),
        ("sftdoctor/0", "    while True:\n        pass\n"),
        ("sftdoctor/0", "    import os\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n"),
        ("sftdoctor/1", "    return sum(c in 'aeiouAEIOU' for c in text)\n"),
        ("sftdoctor/1", "    import os, signal\n    os.killpg(0, signal.SIGKILL)\n"),
        ("sftdoctor/1", f"    open('{REPO}/owned-{tag}', 'w').write('x')\n    return 0\n"),
        ("sftdoctor/2", "    out = []\n    for n in numbers:\n        out.append(max(out[-1:] + [n]))\n    return out\n"),
        ("sftdoctor/2", "    x = bytearray(64 << 30)\n    return numbers\n"),
        ("sftdoctor/2", "    return numbers\n"),
    ]
    path = jsonl(tmp_path / "completions.jsonl", *[{"task_id": t, "completion": c} for t, c in completions])
    out = tmp_path / "results.jsonl"
    start = time.monotonic()
    assert evaluate(tmp_path, FIXTURES / "problems.jsonl", path, ks=(1, 3), out=out, timeout_s=2.0, json_out=True) == 0
    assert time.monotonic() - start < 2 * (2.0 + 5) + 3  # two waves of two workers, each within its limit
    summary = json.loads(capsys.readouterr().out)
    assert summary["statuses"] == {"passed": 3, "failed": 3, "timeout": 2, "killed": 1, "error": 0}
    assert summary["pass@1"] == pytest.approx(1 / 3) and summary["pass@3"] == pytest.approx(1.0)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["passed", "timeout", "timeout", "passed", "killed", "failed",
                                          "passed", "failed", "failed"]
    assert rows[5]["error"].startswith("FileNotFoundError") and not (REPO / f"owned-{tag}").exists()
    assert rows[7]["error"] == "MemoryError"


# --- generation and the CLI --------------------------------------------------------------------------------

@pytest.mark.slow
def test_generate_completions_with_a_tiny_random_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model_dir = REPO / "examples" / "tiny" / "model"
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(model_dir)).eval()
    problems = dict(list(code.read_problems(FIXTURES / "problems.jsonl").items())[:2])
    records = code.generate_completions(model, tokenizer, problems, samples=3, max_new_tokens=8, temperature=0.8)
    assert [r["task_id"] for r in records] == ["sftdoctor/0"] * 3 + ["sftdoctor/1"] * 3
    assert all(isinstance(r["completion"], str) and not any(s in r["completion"] for s in code.STOP) for r in records)
    greedy = code.generate_completions(model, tokenizer, problems, samples=2, max_new_tokens=8, temperature=0)
    assert greedy[0] == greedy[1]


def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    from click.testing import CliRunner

    from sftdoctor import cli

    problems = jsonl(tmp_path / "problems.jsonl", PROBLEM, "{oops")
    result = CliRunner().invoke(cli.main, ["eval", "--code", str(problems), "--completions", str(problems)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sftdoctor: error: {problems}: line 2: not valid JSON")


@needs_bwrap
@pytest.mark.slow
def test_the_cli_scores_the_fixture_completions_in_the_sandbox(tmp_path):
    from click.testing import CliRunner

    from sftdoctor import cli

    out = tmp_path / "results.jsonl"
    result = CliRunner().invoke(cli.main, ["eval", "--code", str(FIXTURES / "problems.jsonl"), "--completions",
                                           str(FIXTURES / "completions.jsonl"), "--out", str(out), "--timeout", "5"])
    assert result.exit_code == 0, result.output
    assert "pass@1" in result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["status"] for r in rows} >= {"passed", "failed"}
