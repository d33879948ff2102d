"""`sftdoctor report RUN_DIR --follow` (report/follow.py) over run directories the tests write as a run writes
them; the real run in Chromium is tests/report/test_follow_e2e.py."""

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from browser import until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sftdoctor.report import follow
from sftdoctor.run import liveness

NAN = {"phase": "runtime", "step": 6, "severity": "error", "id": "nan-loss", "title": "non-finite loss at step 6"}


def record(step: int) -> dict:
    return {"step": step, "loss": 2 * math.exp(-step / 10) + 0.5, "learning_rate": 1e-3, "grad_norm": 0.5}


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def started_run(folder: Path, steps: int = 3) -> Path:
    """A run directory as `train` leaves it a few steps in: the plan, the gate's findings, `steps` records."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "resolved.json").write_text(json.dumps({"lr_scheduler": "constant", "learning_rate": 1e-3}))
    (folder / "findings.jsonl").write_text(
        json.dumps({"phase": "preflight", "severity": "ok", "id": "bf16-support", "title": "fine"}) + "\n"
    )
    append(folder / "metrics.jsonl", "".join(json.dumps(record(s)) + "\n" for s in range(1, steps + 1)))
    return folder


class Script:
    """The follower's waits, each doing the test's next write to the run directory (or nothing)."""

    def __init__(self, *moves):
        self.moves, self.lines = list(moves), []

    def __call__(self, seconds):
        assert self.moves, "the follower went on after the run ended"
        self.moves.pop(0)()

    def say(self, line, flush=False):
        self.lines.append(line)

    def updates(self) -> int:
        return sum(line.endswith("page updated") for line in self.lines)


def test_draws_again_when_the_run_wrote_and_only_then_then_the_final_page(tmp_path):
    run = started_run(tmp_path / "run")
    pages = []
    keep = lambda: pages.append((run / "report.html").read_text())  # noqa: E731
    half = json.dumps(NAN)[:30]

    def last_words():  # a last finding, and the launcher is done before the next look
        append(run / "findings.jsonl", json.dumps({**NAN, "step": 7, "title": "late"}) + "\n")
        (run / "live.json").unlink()

    script = Script(
        keep,  # nothing written: no drawing
        lambda: append(run / "metrics.jsonl", json.dumps(record(4)) + "\n" + json.dumps(record(5))[:12]),
        keep,
        lambda: append(run / "findings.jsonl", half),  # the watcher is writing its line
        keep,
        lambda: append(run / "findings.jsonl", json.dumps(NAN)[30:] + "\n"),
        keep,
        last_words,
    )
    with liveness.marked(run):
        code = follow.Follower(run, run / "report.html", "step", False, 1.0, say=script.say, wait=script).follow()
    assert code == 0 and not script.moves
    # drawn at the start, after the records, after the half line, after the whole one: never without a change
    assert script.updates() == 4, script.lines
    first, records, torn, whole = pages
    assert "live: last record at step 3" in first and "location.reload()" in first
    assert "<td>running: at step 3</td>" in first  # not "ended at step 3" while it runs
    assert "live: last record at step 4" in records  # step 5's line is half written: left for the next look
    assert "nan-loss" not in torn and "Not read" not in torn  # a half-written finding is neither shown nor a problem
    assert "<td class='error'>nan-loss</td><td>non-finite loss at step 6" in whole
    assert script.lines.count("sftdoctor: error at step 6: nan-loss: non-finite loss at step 6") == 1
    final = (run / "report.html").read_text()
    assert "run ended: ended at step 4" in final and "its launcher is done" in final and "train.log" in final
    assert "<script" not in final and "refresh" not in final and "banner live" not in final
    assert script.lines[-2:-1] == ["sftdoctor: error at step 7: nan-loss: late"]  # told, though never drawn live
    assert script.lines[-1].startswith("sftdoctor: run ended: ended at step 4")
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_waits_for_the_first_step_then_draws_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "findings.jsonl").write_text("")
    seen = []
    script = Script(
        lambda: seen.append((run / "report.html").read_text()),
        lambda: append(run / "metrics.jsonl", json.dumps(record(1))[:10]),  # a first line, half written
        lambda: seen.append((run / "report.html").read_text()),
        lambda: append(run / "metrics.jsonl", json.dumps(record(1))[10:] + "\n"),
        lambda: seen.append((run / "report.html").read_text()),
        lambda: (run / "live.json").unlink(),
    )
    with liveness.marked(run):
        assert follow.Follower(run, run / "report.html", "step", False, 1.0, say=script.say, wait=script).follow() == 0
    assert "live: waiting for the run&#x27;s first logged step" in seen[0] and "location.reload()" in seen[0]
    assert "first logged step" in seen[1]
    assert "live: last record at step 1" in seen[2] and "<img" in seen[2]
    assert script.lines.count("sftdoctor: waiting for the run's first logged step") == 1


def test_a_launcher_killed_without_removing_its_mark_is_gone(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert liveness.over(run) == "its launcher is done"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mark = {"host": socket.gethostname(), "pid": proc.pid, "pid_start": liveness.process_start(proc.pid)}
        (run / "live.json").write_text(json.dumps(mark))
        assert liveness.over(run) is None
        proc.kill()  # not waited for yet: a zombie, its pid still listed
        gone = f"its launcher (pid {proc.pid}) is gone without removing live.json (killed?)"
        assert until(lambda: liveness.over(run) == gone, 10)
    finally:
        proc.kill()
        proc.wait()
    assert liveness.over(run) == gone
    (run / "live.json").write_text(json.dumps({**mark, "host": "another-node"}))
    assert liveness.over(run) is None  # another host's process cannot be looked at: the mark is trusted


def test_the_mark_is_removed_on_the_way_out_but_not_another_launchers(tmp_path):
    with liveness.marked(tmp_path):
        assert json.loads((tmp_path / "live.json").read_text())["pid"] == os.getpid()
    assert not (tmp_path / "live.json").exists()
    with pytest.raises(RuntimeError), liveness.marked(tmp_path):
        raise RuntimeError
    assert not (tmp_path / "live.json").exists()
    with liveness.marked(tmp_path):
        (tmp_path / "live.json").write_text('{"pid": 1}')  # a later `train` on the same folder
    assert (tmp_path / "live.json").exists()
    with liveness.marked(tmp_path, owner=False):  # another node's launcher marks nothing
        assert (tmp_path / "live.json").read_text() == '{"pid": 1}'


def sftdoctor(*argv, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "sftdoctor", *map(str, argv)], capture_output=True, text=True, **kwargs
    )


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["report", "{trainer}", "--follow"],
            "{trainer}: holds no resolved.json, findings.jsonl or metrics.jsonl: not",
        ),
        (["report", "{missing}", "--follow"], "{missing}: not a run directory (--follow watches the folder"),
        (["report", "{run}", "{run}", "--follow"], "--follow: follows one run directory, got 2"),
        (["report", "{run}", "--follow", "--json"], "--follow: does not go with --json"),
        (["report", "{run}", "--interval", "2"], "--interval: goes with --follow"),
        (["report", "{run}", "--serve", "0"], "--serve: goes with --follow"),
        (
            ["report", "{run}", "--follow", "--interval", "0"],
            "Invalid value for '--interval': 0.0 is not in the range 0.5<=x<=3600",
        ),
        (["report", "{run}", "--follow", "--interval", "nan"], "'nan' is not a finite number"),
        (["report", "{run}", "--follow", "--serve", "-1"], "Invalid value for '--serve'"),
    ],
)
def test_refused_in_one_line(tmp_path, argv, line):
    run = started_run(tmp_path / "run")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "trainer_state.json").write_text('{"log_history": []}')
    names = {"run": run, "trainer": tmp_path / "trainer", "missing": tmp_path / "missing"}
    proc = sftdoctor(*[a.format(**names) for a in argv], timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    [said] = proc.stderr.splitlines()
    assert said.startswith("sftdoctor: error: ") and line.format(**names) in said, said
    assert not (run / "report.html").exists()


def test_a_busy_port_is_refused_in_one_line(tmp_path):
    run = started_run(tmp_path / "run")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = sftdoctor("report", run, "--follow", "--serve", port, timeout=60)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == f"sftdoctor: error: --serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert not (run / "report.html").exists()


def launcher(run: Path) -> subprocess.Popen:
    """A process standing in for the launcher: it marks the run live (run/liveness.py) until it is killed."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from sftdoctor.run.liveness import marked\n"
            "with marked(Path(sys.argv[1])):\n    print('marked', flush=True); time.sleep(120)",
            str(run),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "marked\n"
    return proc


def page_served(port: int) -> str:
    """The page, or "" before the first one is written (503)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            raise
        return ""


def test_served_niced_and_ends_with_the_launcher(tmp_path):
    run = started_run(tmp_path / "run")
    stand_in = launcher(run)
    follower = subprocess.Popen(
        [sys.executable, "-m", "sftdoctor", "report", run, "--follow", "--interval", "0.5", "--serve", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = follower.stdout.readline()
        port = int(first.rsplit("http://127.0.0.1:", 1)[1].strip().strip("/"))
        assert until(lambda: "live: last record at step 3" in page_served(port))
        nice = int(Path(f"/proc/{follower.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        assert nice >= os.nice(0) + follow.NICE or nice == 19  # a lower priority than the shell that started it
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/resolved.json", timeout=10)
        append(run / "metrics.jsonl", json.dumps(record(4)) + "\n")
        assert until(lambda: "live: last record at step 4" in page_served(port))
        (run / "report.html").write_text("<html>train's own report, no reload</html>")  # as `train` at its end
        assert "live: last record at step 4" in page_served(port)  # the follower's page, not the file
        stand_in.kill()  # SIGKILL: the mark stays, its pid is gone
        stand_in.wait()
        assert until(lambda: "run ended" in page_served(port))  # still served for a last reload
        out, err = follower.communicate(timeout=60)
    finally:
        for proc in (stand_in, follower):
            proc.kill() if proc.poll() is None else None
    assert follower.returncode == 0, err
    assert "is gone without removing live.json (killed?)" in out.splitlines()[-1]
    assert "<script" not in (run / "report.html").read_text()


def test_sigterm_leaves_a_whole_page_and_nothing_else(tmp_path):
    run = started_run(tmp_path / "run", steps=40)
    stand_in = launcher(run)
    try:
        follower = subprocess.Popen(
            [sys.executable, "-m", "sftdoctor", "report", run, "--follow", "--interval", "0.5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        until(lambda: (run / "report.html").exists())
        for step in range(41, 44):  # drawn again and again; stopped in the midst
            append(run / "metrics.jsonl", json.dumps(record(step)) + "\n")
            time.sleep(0.7)
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=60)
    finally:
        stand_in.kill()
        stand_in.wait()
    assert follower.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "sftdoctor: interrupted; the page left is the last one written, whole"
    page = (run / "report.html").read_text()
    assert page.endswith("</html>\n") and "live: last record at step" in page
    assert sorted(p.name for p in run.iterdir()) == [
        "findings.jsonl",
        "live.json",
        "metrics.jsonl",
        "report.html",
        "resolved.json",
    ]


OPTION_VALUES = ["0", "0.4", "0.5", "1", "3600", "3601", "-1", "nan", "inf", "1e400", "x", "", "65535", "65536"]


@given(
    options=st.lists(
        st.sampled_from(["--interval", "--serve", "--json", "--follow", "--x", "--output", "RUN", "OTHER"]), max_size=5
    ),
    values=st.lists(st.sampled_from(OPTION_VALUES + ["step", "tokens"]), min_size=5, max_size=5),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_new_options_fuzzed(tmp_path_factory, monkeypatch, options, values):
    """Whatever the mix: a refusal of one line naming an option or a path, or (the run's launcher done) one final
    page and exit 0; nothing left running, no temporary file."""
    from cli_contract import RUNNER

    from sftdoctor.cli import main

    monkeypatch.setattr(follow, "lower_priority", lambda: None)  # not this test process's priority
    root = tmp_path_factory.mktemp("fuzz")
    run = started_run(root / "run")
    monkeypatch.chdir(root)  # two runs without --follow draw into ./sftdoctor-report: here, not in the checkout
    argv = ["report"]
    for option, value in zip(options, values):
        if option in ("RUN", "OTHER"):
            argv.append(str(run if option == "RUN" else root / "other"))
        elif option in ("--json", "--follow"):
            argv.append(option)
        elif option == "--output":
            argv += [option, str(root / "out")]
        else:
            argv += [option, value]
    result = RUNNER.invoke(main, argv)
    shown = f"{argv}\n{result.stdout}\n{result.stderr}"
    assert isinstance(result.exception, (SystemExit, type(None))), shown
    assert result.exit_code in (0, 1, 2), shown
    if result.exit_code == 2:
        [line] = result.stderr.splitlines()
        assert line.startswith("sftdoctor: error: ") or line.startswith("Usage") or "Error" in line, shown
    if "--follow" in argv and result.exit_code == 0:
        folder = root / "out" if "--output" in argv else run
        assert "run ended" in (folder / "report.html").read_text()
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == [], shown


def test_a_live_page_opened_as_a_file_reloads_itself_and_says_when_it_is_old(tmp_path):
    """In headless Chromium, from the file (no --serve): it reloads itself, keeps where it was scrolled, and a
    page older than three intervals says the follower may have stopped (one stopped by Ctrl-C leaves it)."""
    playwright = pytest.importorskip("playwright.sync_api")
    from browser import FLAGS, chromium

    run = started_run(tmp_path / "run", steps=30)
    script = Script(lambda: None, lambda: (run / "live.json").unlink())
    pages = []
    script.moves[0] = lambda: pages.append((run / "report.html").read_text())
    with liveness.marked(run):
        follow.Follower(run, run / "report.html", "step", False, 1.0, say=script.say, wait=script).follow()
    live = run / "live.html"
    live.write_text(re.sub(r"written=\d+", f"written={round((time.time() - 60) * 1000)}", pages[0]))
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 600})
            loads = []
            page.on("load", lambda _: loads.append(1))
            page.goto(live.as_uri(), wait_until="load")
            page.evaluate("window.scrollTo(0, 700)")
            until(lambda: page.wait_for_timeout(200) or len(loads) >= 3, 30)  # waiting in playwright hears the loads
            page.wait_for_load_state("load")
            stale = page.inner_text("#stale")
            scrolled = page.evaluate("window.scrollY")
        finally:
            browser.close()
    assert "the follower (report --follow) may have stopped" in stale and "written 6" in stale
    assert scrolled == 700
