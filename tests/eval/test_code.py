"""`sftdoctor eval --code`'s scoring (code.py): pass@k, the readers (streams, one-line errors on bad input,
gzip bombs, raw U+2028, lone surrogates), the results file (one row a line for every reader), the evaluator's
memory, Ctrl-C, and evaluate_code end to end in the real sandbox, hostile and forging completions included."""

from __future__ import annotations

import gzip
import json
import math
import os
import stat
import subprocess
import sys
import time
import uuid
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sftdoctor.errors import InputError
from sftdoctor.eval import code, sandbox

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "code"
WHY_NOT = sandbox.available("bubblewrap")


@pytest.fixture
def bwrap():
    """Not skipped where bubblewrap is missing: .ci/run and the README's test command install it."""
    assert WHY_NOT is None, f"the sandbox tests need bubblewrap (apt-get install bubblewrap): {WHY_NOT}"


needs_bwrap = pytest.mark.usefixtures("bwrap")


# --- pass@k ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 0.7),
        (5, 0, 1, 0.0),
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        (5, 5, 5, 1.0),
        (5, 4, 2, 1.0),
        (1, 1, 1, 1.0),
        (10, 1, 10, 1.0),
        (4, 1, 2, 0.5),
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert code.pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_is_the_binomial_formula_and_stable_for_large_n():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert code.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    assert code.pass_at_k(10_000, 37, 100) == pytest.approx(1 - math.comb(9963, 100) / math.comb(10_000, 100))
    assert code.pass_at_ks({"a": (5, 2), "b": (5, 0)}, (1, 2)) == {
        "pass@1": pytest.approx(0.2),
        "pass@2": pytest.approx(0.35),
    }
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
    settings = {
        "out": tmp_path / "results.jsonl",
        "ks": (),
        "sandbox": "bubblewrap",
        "workers": 2,
        "timeout_s": 5.0,
        "json_out": False,
        **options,
    }
    return code.evaluate_code(problems, completions, **settings)


@pytest.mark.parametrize(
    "problems, completions, message",
    [
        ([PROBLEM, "{not json"], [], "problems.jsonl: line 2: not valid JSON"),
        (
            [{k: v for k, v in PROBLEM.items() if k != "entry_point"}],
            [],
            "problems.jsonl: line 1: missing 'entry_point'; expected",
        ),
        ([{**PROBLEM, "prompt": 3}], [], "problems.jsonl: line 1: 'prompt' is a JSON int; expected a string"),
        (["[1, 2]"], [], "problems.jsonl: line 1: a JSON list; expected one JSON object per line"),
        ([PROBLEM, PROBLEM], [], "problems.jsonl: line 2: task_id 't/0' again (first on line 1); expected"),
        ([], [], "problems.jsonl: no problems; expected"),
        (
            [PROBLEM],
            [{"task_id": "t/0", "completion": "    return 1"}, "", "oops"],
            "completions.jsonl: line 3: not valid JSON",
        ),
        (
            [PROBLEM],
            [{"task_id": "t/0"}],
            "completions.jsonl: line 1: missing 'completion'; expected task_id and completion",
        ),
        (
            [PROBLEM],
            [{"task_id": "t/0", "completion": "x"}, {"task_id": "t/1", "completion": "x"}],
            "completions.jsonl: line 2: task_id 't/1' is not in the problems (did you mean 't/0'?); expected",
        ),
        (
            [PROBLEM, {**PROBLEM, "task_id": "t/1"}],
            [{"task_id": "t/0", "completion": "x"}],
            "completions.jsonl: no completion for task_id 't/1'; expected at least one sample",
        ),
    ],
)
def test_bad_input_is_one_line_naming_file_and_line(tmp_path, problems, completions, message):
    with pytest.raises(InputError) as caught:
        evaluate(
            tmp_path, jsonl(tmp_path / "problems.jsonl", *problems), jsonl(tmp_path / "completions.jsonl", *completions)
        )
    text = str(caught.value)
    assert "\n" not in text and "expected" in text
    assert text.startswith(str(tmp_path / message.split(":")[0])) and message.split(": ", 1)[1] in text
    assert not (tmp_path / "results.jsonl").exists()


def test_k_larger_than_the_samples_is_bad_input(tmp_path):
    problems = jsonl(tmp_path / "problems.jsonl", PROBLEM)
    completions = jsonl(tmp_path / "completions.jsonl", *[{"task_id": "t/0", "completion": "    return 1"}] * 2)
    with pytest.raises(
        InputError,
        match=r"completions.jsonl: k=5 but task_id 't/0' has 2 samples; expected at "
        r"least k samples per task",
    ):
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
    assert str(caught.value).startswith(
        "--sandbox: bubblewrap (bwrap) not found on PATH: install it: apt-get install bubblewrap"
    ) and "no unsandboxed mode" in str(caught.value)
    assert "\n" not in str(caught.value) and not (tmp_path / "results.jsonl").exists()
    assert "docker not found on PATH" in sandbox.available("docker")


def test_docker_without_a_reachable_daemon_refuses(tmp_path, monkeypatch):
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?' >&2\nexit 1\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert sandbox.available("docker").startswith("no Docker daemon reachable (docker info: Cannot connect")
    with pytest.raises(InputError, match=r"^--sandbox: no Docker daemon reachable .*no unsandboxed mode\)$"):
        evaluate(tmp_path, FIXTURES / "problems.jsonl", FIXTURES / "completions.jsonl", sandbox="docker")
    assert sandbox.available("chroot").startswith("unknown sandbox 'chroot'")


def test_nothing_half_written_on_ctrl_c(tmp_path, monkeypatch):
    class Interrupted:
        name, calls = "fake", 0

        def run(self, program, limits, cancel=None):
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
        ("sftdoctor/0", 0, "passed"),
        ("sftdoctor/0", 1, "failed"),
        ("sftdoctor/1", 0, "passed"),
        ("sftdoctor/1", 1, "failed"),
        ("sftdoctor/2", 0, "passed"),
        ("sftdoctor/2", 1, "failed"),
    ]
    assert rows[5]["error"] == "OSError: [Errno 101] Network is unreachable"
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]


@needs_bwrap
@pytest.mark.slow
def test_evaluate_code_with_hostile_completions(tmp_path, capsys):
    tag = uuid.uuid4().hex
    completions = [
        ("sftdoctor/0", "    return max(lo, min(x, hi))\n"),
        ("sftdoctor/0", "    while True:\n        pass\n"),
        (
            "sftdoctor/0",
            "    import os\n    while True:\n        try:\n            os.fork()\n"
            "        except OSError:\n            pass\n",
        ),
        ("sftdoctor/1", "    return sum(c in 'aeiouAEIOU' for c in text)\n"),
        ("sftdoctor/1", "    import os, signal\n    os.killpg(0, signal.SIGKILL)\n"),
        ("sftdoctor/1", f"    open('{REPO}/owned-{tag}', 'w').write('x')\n    return 0\n"),
        (
            "sftdoctor/2",
            "    out = []\n    for n in numbers:\n        out.append(max(out[-1:] + [n]))\n    return out\n",
        ),
        ("sftdoctor/2", "    x = bytearray(2 << 30)\n    return numbers\n"),
        ("sftdoctor/2", "    return numbers\n"),
    ]
    path = jsonl(tmp_path / "completions.jsonl", *[{"task_id": t, "completion": c} for t, c in completions])
    out = tmp_path / "results.jsonl"
    start = time.monotonic()
    assert evaluate(tmp_path, FIXTURES / "problems.jsonl", path, ks=(1, 3), out=out, timeout_s=2.0, json_out=True) == 0
    assert time.monotonic() - start < 2 * (2.0 + 5) + 3  # two waves of two workers, each within its limit
    summary = json.loads(capsys.readouterr().out)
    # the busy loop and the fork bomb hit a limit: the wall clock's, or (wall = CPU = 2 s, and a fork bomb spends
    # every core's time) the CPU time's first, whichever the machine's load lets come first
    statuses = summary["statuses"]
    assert {k: statuses[k] for k in ("passed", "failed", "error")} == {"passed": 3, "failed": 4, "error": 0}
    assert statuses["timeout"] + statuses["killed"] == 2, statuses
    assert summary["pass@1"] == pytest.approx(1 / 3) and summary["pass@3"] == pytest.approx(1.0)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in rows[:1] + rows[3:]] == [
        "passed",
        "passed",
        "failed",
        "failed",
        "passed",
        "failed",
        "failed",
    ]
    for row in rows[1:3]:
        assert (row["status"], row["error"].split(" reached")[0]) in {
            ("timeout", "wall-clock limit of 2 s"),
            ("killed", "CPU-time limit of 2 s"),
        }, row
    assert rows[4]["error"].startswith("exit code 137: killed by SIGKILL, or an exit code of its own")
    assert rows[5]["error"].startswith("FileNotFoundError") and not (REPO / f"owned-{tag}").exists()
    assert rows[7]["error"].startswith("MemoryError")


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
    result = CliRunner().invoke(
        cli.main,
        [
            "eval",
            "--code",
            str(FIXTURES / "problems.jsonl"),
            "--completions",
            str(FIXTURES / "completions.jsonl"),
            "--out",
            str(out),
            "--timeout",
            "5",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "pass@1" in result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["status"] for r in rows} >= {"passed", "failed"}


# --- forged passes, rows, readers and memory at the scale of a benchmark -------------------------------------


@needs_bwrap
def test_exiting_everywhere_scores_zero(tmp_path, capsys):
    exits = [
        "    exit()\n",
        "    import os\n    os._exit(0)\n",
        "    raise SystemExit(0)\n",
        "    import sys\n    sys.exit(0)\n",
    ]
    tasks = list(code.read_problems(FIXTURES / "problems.jsonl"))
    path = jsonl(tmp_path / "completions.jsonl", *[{"task_id": t, "completion": e} for t in tasks for e in exits])
    assert evaluate(tmp_path, FIXTURES / "problems.jsonl", path, ks=(1, 4), json_out=True) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pass@1"] == 0.0 and summary["pass@4"] == 0.0 and summary["statuses"]["failed"] == 12


@needs_bwrap
def test_result_rows_are_one_line_each_for_every_reader(tmp_path):
    odd = "\u2028\u2029\u0085\x1c\x1d\x1e\u202e"
    problem = {**PROBLEM, "task_id": f"t/{odd}"}
    completion = f"    print({odd!r})\n    import sys\n    print({odd!r}, file=sys.stderr)\n    return 1\n"
    out = tmp_path / "results.jsonl"
    evaluate(
        tmp_path,
        jsonl(tmp_path / "problems.jsonl", problem),
        jsonl(tmp_path / "completions.jsonl", *[{"task_id": problem["task_id"], "completion": completion}] * 3),
        out=out,
    )
    text = out.read_text(encoding="utf-8")
    assert text.isascii() and len(text.splitlines()) == 3  # str.splitlines breaks at U+2028, U+0085, \x1c...
    rows = [json.loads(line) for line in text.splitlines()]
    assert all(
        r["status"] == "passed" and r["stdout"] == odd + "\n" and r["task_id"] == problem["task_id"] for r in rows
    )


@needs_bwrap
def test_a_completions_file_with_raw_line_separators_in_its_strings_is_read(tmp_path):
    completions = tmp_path / "completions.jsonl"
    lines = [
        json.dumps({"task_id": "t/0", "completion": f"    return 1  # {c}\n"}, ensure_ascii=False)
        for c in ("\u2028", "\u0085", "\x1c")
    ]
    completions.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "results.jsonl"
    assert evaluate(tmp_path, jsonl(tmp_path / "problems.jsonl", PROBLEM), completions, out=out) == 0
    assert [json.loads(line)["status"] for line in out.read_text().splitlines()] == ["passed"] * 3


def test_a_lone_surrogate_is_one_error_before_any_sample_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "sandbox", lambda kind: pytest.fail("a sample ran"))
    problems = tmp_path / "problems.jsonl"
    problems.write_text('{"task_id": "t/\\ud800", "prompt": "def f():\\n", "test": "", "entry_point": "f"}\n')
    with pytest.raises(
        InputError,
        match=r"problems.jsonl: line 1: 'task_id' holds '\\ud800', half of a "
        r"surrogate pair; expected text that is valid UTF-8$",
    ):
        evaluate(tmp_path, problems, jsonl(tmp_path / "completions.jsonl", {"task_id": "t/0", "completion": ""}))
    completions = tmp_path / "completions.jsonl"
    completions.write_text('{"task_id": "t/0", "completion": "x"}\n{"task_id": "t/0\\udfff", "completion": "x"}\n')
    with pytest.raises(InputError, match=r"completions.jsonl: line 2: 'task_id' holds '\\udfff'"):
        evaluate(tmp_path, jsonl(tmp_path / "problems.jsonl", PROBLEM), completions)
    assert not (tmp_path / "results.jsonl").exists()


def peak_rss(script: str, *args) -> tuple[int, str]:
    """(peak RSS in bytes, stderr) of a child Python running `script`: its VmHWM, the high-water mark of its own
    memory (ru_maxrss would count the parent's pages it shared until exec)."""
    done = subprocess.run(
        [sys.executable, "-c", script + PEAK, *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        check=False,
    )
    peak = [line for line in done.stderr.splitlines() if line.startswith("VmHWM:")]
    assert peak, done.stderr
    return int(peak[-1].split()[1]) * 1024, done.stderr


PEAK = "\nprint([line for line in open('/proc/self/status') if line.startswith('VmHWM:')][0], file=sys.stderr)\n"
EVALUATE = """
import sys
from pathlib import Path
from sftdoctor.errors import InputError
from sftdoctor.eval import code
try:
    code.evaluate_code(Path(sys.argv[1]), Path(sys.argv[2]), out=Path(sys.argv[3]), ks=(1,), sandbox="bubblewrap",
                       workers=2, timeout_s=20.0, json_out=True)
except InputError as exc:
    print(exc, file=sys.stderr)
"""


@pytest.mark.slow
def test_a_gzip_bomb_is_refused_at_its_long_line_without_inflating_it(tmp_path):
    bomb = tmp_path / "completions.jsonl.gz"
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    with open(bomb, "wb") as f:
        f.write(compressor.compress(b'{"task_id": "t/0", "completion": "    return 1\\n"}\n'))
        f.write(compressor.compress(b'{"task_id": "t/0", "completion": "'))
        chunk = b"x" * (1 << 20)
        for _ in range(256):  # 256 MiB inflated, in a file of a few hundred KiB
            f.write(compressor.compress(chunk))
        f.write(compressor.compress(b'"}\n') + compressor.flush())
    assert bomb.stat().st_size < 1 << 20
    peak, stderr = peak_rss(EVALUATE, jsonl(tmp_path / "problems.jsonl", PROBLEM), bomb, tmp_path / "out.jsonl")
    assert "completions.jsonl.gz: line 2: longer than 16 MiB; expected one JSON object per line" in stderr
    assert peak < 100 << 20, f"peak RSS {peak >> 20} MiB"  # 256 MiB inflated whole


@needs_bwrap
@pytest.mark.slow
def test_the_evaluators_memory_does_not_grow_with_samples_or_their_output(tmp_path):
    loud = (
        "    import sys\n    sys.stdout.write('o' * (1 << 20))\n    sys.stderr.write('e' * (1 << 20))\n"
        "    return 1\n"
        f"# {'c' * (256 << 10)}\n"
    )  # a long completion: samples started far ahead would all be held
    problems = jsonl(tmp_path / "problems.jsonl", PROBLEM)
    peaks = {}
    for n in (10, 160):
        completions = jsonl(tmp_path / f"completions{n}.jsonl", *[{"task_id": "t/0", "completion": loud}] * n)
        peaks[n], stderr = peak_rss(EVALUATE, problems, completions, tmp_path / f"out{n}.jsonl")
        rows = (tmp_path / f"out{n}.jsonl").read_text().splitlines()
        assert len(rows) == n and all(json.loads(r)["status"] == "passed" for r in rows), stderr
        assert all(len(json.loads(r)["stdout"]) == code.RESULT_TAIL for r in rows)
    assert peaks[160] - peaks[10] < 8 << 20, {n: p >> 20 for n, p in peaks.items()}


@needs_bwrap
def test_nothing_a_completion_starts_is_running_after_the_command(tmp_path):
    marker = f"sftdoctor-daemon-{uuid.uuid4().hex}"
    daemon = (
        "    import os\n    if os.fork() == 0:\n        os.setsid()\n"
        f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 1000; : {marker}'])\n    return 1\n"
    )
    evaluate(
        tmp_path,
        jsonl(tmp_path / "problems.jsonl", PROBLEM),
        jsonl(tmp_path / "completions.jsonl", *[{"task_id": "t/0", "completion": daemon}] * 4),
    )
    assert not [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in _cmdline(p)]


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("signum, code_", [(2, 130), (15, 143)])
def test_ctrl_c_or_sigterm_kills_the_running_samples_and_writes_nothing(tmp_path, signum, code_):
    marker = f"sftdoctor-busy-{uuid.uuid4().hex}"
    busy = f"    import os\n    os.execv('/bin/sh', ['sh', '-c', 'while :; do :; done; : {marker}'])\n"
    completions = jsonl(tmp_path / "completions.jsonl", *[{"task_id": "t/0", "completion": busy}] * 6)
    out = tmp_path / "results.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sftdoctor",
            "eval",
            "--code",
            jsonl(tmp_path / "problems.jsonl", PROBLEM),
            "--completions",
            completions,
            "--out",
            out,
            "--timeout",
            "60",
            "--workers",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    deadline = time.monotonic() + 20
    while not [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in _cmdline(p)]:
        assert time.monotonic() < deadline and proc.poll() is None, "no sample started"
        time.sleep(0.05)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=15)
    assert proc.returncode == code_, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("sftdoctor: interrupted")
    time.sleep(0.2)
    assert not [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in _cmdline(p)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["completions.jsonl", "problems.jsonl"]


# --- the readers, fuzzed ---------------------------------------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ANY_TEXT = st.text(st.characters(blacklist_categories=()), max_size=12)  # surrogates and controls included
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)
RECORD = st.dictionaries(
    st.sampled_from(["task_id", "prompt", "test", "entry_point", "completion", "x"]), JSON_VALUE | ANY_TEXT, max_size=6
)


def read_both(path: Path) -> None:
    """Both readers, to the end: a table and a count, or one InputError naming the file."""
    try:
        problems = code.read_problems(path)
        code.count_completions(path, problems)
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path)), exc


@FUZZ
@given(data=st.binary(max_size=600), compressed=st.booleans())
def test_any_bytes_are_records_or_one_line_errors(tmp_path, data, compressed):
    path = tmp_path / ("fuzz.jsonl.gz" if compressed else "fuzz.jsonl")
    path.write_bytes(gzip.compress(data) if compressed and data[:1] != b"x" else data)
    read_both(path)


@FUZZ
@given(records=st.lists(RECORD | JSON_VALUE, min_size=1, max_size=4), raw=st.booleans())
def test_any_json_lines_are_records_or_one_line_errors(tmp_path, records, raw):
    path = tmp_path / "fuzz.jsonl"
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=not raw) + "\n" for r in records), encoding="utf-8", errors="surrogatepass"
    )
    read_both(path)
