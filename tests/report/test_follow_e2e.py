"""`report --follow` beside a real 2-rank run (torchrun, gloo, the tiny example), looked at in headless Chromium
while the run writes: the curves so far, then the drilled NaN and the run's end on the same, self-reloading page."""

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from browser import FLAGS, chromium, until
from trainrun import NAN_EXIT, ROOT, job_processes, metrics, write_config

TINY = ROOT / "examples" / "tiny"
NAN_AT = 150


def lines_of(proc: subprocess.Popen) -> list[str]:
    """The process's stdout lines as they come (read by a thread: the test never blocks on them)."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return lines


def body(page) -> str:
    """The page's text; "" while it is reloading itself."""
    from playwright.sync_api import Error

    try:
        return page.inner_text("body", timeout=2000)
    except Error:
        return ""


@pytest.mark.slow
def test_a_running_runs_page_follows_it_to_its_nan_and_end(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    cfg = write_config(
        tmp_path,
        {
            "model": {"path": str(TINY / "model"), "weights": "random"},
            "data": {"train": str(TINY / "data" / "train.jsonl"), "max_length": 128},
            "training": {
                "per_device_batch_size": 4,
                "max_steps": 200,
                "logging_steps": 1,
                "save_steps": 1000,
                "gradient_checkpointing": False,
                "output_dir": str(tmp_path / "out"),
            },
            "launch": {"nproc_per_node": 2, "master_port": "auto"},
        },
    )
    run_dir = tmp_path / "out" / "drill-nan-loss"
    with open(tmp_path / "train.out", "w") as out:
        train = subprocess.Popen(
            [sys.executable, "-m", "sftdoctor", "train", str(cfg), "--no-rehearse", "--drill", f"nan-loss@{NAN_AT}"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    follower = None
    try:
        until(lambda: (run_dir / "live.json").exists() or train.poll() is not None, 300, "the run's launcher mark")
        follower = subprocess.Popen(
            [sys.executable, "-m", "sftdoctor", "report", str(run_dir), "--follow", "--interval", "1", "--serve", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        said = lines_of(follower)
        port = until(lambda: said and re.search(r"http://127\.0\.0\.1:(\d+)/", said[0]), 60, "the address")[1]
        with playwright.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=chromium(), args=FLAGS)
            try:
                live, ended, loads = look(browser, port, run_dir, tmp_path)
            finally:
                browser.close()
        follower.wait(timeout=120)
        train.wait(timeout=120)
    finally:
        for proc in (train, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
    output = (tmp_path / "train.out").read_text()
    assert train.returncode == NAN_EXIT, output[-3000:]
    # while the run wrote: its curves so far, under the live banner
    step = int(re.search(r"live: last record at step (\d+), \d\d:\d\d:\d\d; run still writing", live["text"])[1])
    assert 1 <= step < NAN_AT, live["text"][:500]  # drawn a look or two behind the run
    assert re.search(rf"running: at step {step} of 200\s+[\d.]+ \(step {step}\)", live["text"]), live["text"][:2000]
    assert live["loss_panel"]["width"] > 0 and live["loss_panel"]["complete"]
    assert "non-finite loss" not in live["text"]
    # then, by itself (reloaded, never navigated again): the NaN the watcher found, and how the run ended
    assert loads >= 3, loads
    assert f"run ended: stopped by nan-loss at step {NAN_AT - 1}: non-finite loss at step {NAN_AT}" in ended["text"]
    assert re.search(rf"runtime\s+{NAN_AT}\s+nan-loss\s+non-finite loss at step {NAN_AT}", ended["text"])
    assert ended["scripts"] == 0  # the final page does not reload
    assert ended["loss_panel"]["src"] != live["loss_panel"]["src"]
    assert [m["step"] for m in metrics(run_dir)][-1] == NAN_AT - 1
    # the follower saw the NaN as it came, then the end, and left by itself: exit 0, nothing left behind
    assert follower.returncode == 0, follower.stderr.read()
    assert f"sftdoctor: error at step {NAN_AT}: nan-loss: non-finite loss at step {NAN_AT}" in "".join(said)
    assert said[-1].startswith(f"sftdoctor: run ended: stopped by nan-loss at step {NAN_AT - 1}")
    assert not (run_dir / "live.json").exists() and not list(run_dir.glob(".report*"))
    assert job_processes(run_dir) == []


PANEL = (
    "() => { const i = document.querySelector('#loss img'); return i && {width: i.naturalWidth, "
    "complete: i.complete, src: i.src.slice(-200)}; }"
)


def look(browser, port: str, run_dir: Path, tmp_path: Path):
    """The page opened once, while the run writes (a few steps in); then watched, never navigated again, until it
    says the run ended. (what it showed live, what it showed at the end, how many times it loaded)"""
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    loads = []
    page.on("load", lambda _: loads.append(time.monotonic()))
    until(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 5, 300, "five logged steps")
    page.goto(f"http://127.0.0.1:{port}/", wait_until="load")
    until(lambda: "run still writing" in body(page) and page.evaluate(PANEL), 60, "the live page with its panels")
    live = {"text": body(page), "loss_panel": page.evaluate(PANEL)}
    page.screenshot(path=str(tmp_path / "live.png"))
    until(lambda: "run ended" in body(page), 300, "the page saying the run ended")
    page.wait_for_load_state("load")
    ended = {
        "text": body(page),
        "loss_panel": page.evaluate(PANEL),
        "scripts": page.evaluate("document.scripts.length"),
    }
    return live, ended, len(loads)
