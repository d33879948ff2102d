"""`sftdoctor report RUN_DIR --follow`: the run's page kept up to date while it trains, then its final page.

How, and why so:
- A process of its own beside the training, not a callback in the workers: what it reads and draws cannot
  lengthen a step, and at a lower CPU priority (os.nice) it gives way to the ranks when they want the CPU
  (bench/watch_overhead.py measures a run with and without it).
- It looks, every --interval seconds, at the size and time of the files a run writes (metrics.jsonl,
  findings.jsonl, stopped.json, resolved.json, the rehearsal's findings) and draws again only when one
  changed: a run between two logging steps costs a stat() per file per interval.
- It reads them while they are written: a last line without its newline is left for the next look
  (metrics: facts.run_records always; findings: report.command's `live`).
- It writes report.html alone, panels inlined, whole (files.write_atomic, a temporary name of its own).
  `train`'s end-of-run report writes the same page through another temporary name, so whichever writes last
  wins and either page is complete. It never rewrites findings.jsonl (the watchers append to it meanwhile;
  `report` without --follow records the curve readers' findings there) nor the report/ PNGs (their folder is
  swapped whole by `report`, which one writer at a time does safely).
- The run is live while its launcher's mark is there (run/liveness.py: stopped.json and final/ say how a
  run ended, not that a crashed or killed one did). Once the mark is gone, the launcher's own report is
  written: the final page (how the run ended, no reload) is written after it and the command exits 0.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from sftdoctor.errors import InputError, interruptible
from sftdoctor.facts.run_records import shown as number
from sftdoctor.files import write_atomic
from sftdoctor.report import page
from sftdoctor.report.command import Judged, load
from sftdoctor.report.panels import Axis, render, shown
from sftdoctor.run import layout, liveness

INTERVAL_S = 5.0
NICE = 10  # the increment: a follower shares the node with the ranks and waits for them
WATCHED = (layout.METRICS, layout.FINDINGS, layout.STOPPED, layout.RESOLVED, f"{layout.REHEARSAL}/{layout.FINDINGS}")
MARKS = {"runtime"}  # the findings told on the terminal as they come: the watchers'


def run_folder(runs: list[Path], as_json: bool) -> Path:
    """The one run directory to follow, or InputError."""
    if as_json:
        raise InputError(
            "--follow", "does not go with --json (it keeps a page up to date; `report --json` reads a run once)"
        )
    if len(runs) != 1:
        raise InputError("--follow", f"follows one run directory, got {len(runs)}")
    run = Path(runs[0])
    what = "the folder `sftdoctor train` writes, its [training] output_dir"
    if not run.is_dir():
        raise InputError(run, f"not a run directory (--follow watches {what})")
    if not any(os.path.lexists(run / name) for name in (layout.RESOLVED, layout.FINDINGS, layout.METRICS, layout.LIVE)):
        raise InputError(
            run,
            f"holds no {layout.RESOLVED}, {layout.FINDINGS} or {layout.METRICS}: not a sftdoctor run directory "
            f"(--follow watches {what}; `report` without --follow draws a Trainer's output directory)",
        )
    return run


def stamp(run: Path) -> tuple:
    """What a change to the run's files changes: each watched file's size and modification time."""
    seen = []
    for name in WATCHED:
        try:
            info = os.stat(run / name)
            seen.append((info.st_size, info.st_mtime_ns))
        except OSError:
            seen.append(None)
    return tuple(seen)


def logged(run: Path) -> bool:
    """metrics.jsonl holds a whole line (a record); one that is not a regular file is refused when read."""
    path = run / layout.METRICS
    if not os.path.lexists(path):
        return False
    if not path.is_file():
        return True
    with open(path, "rb") as handle:
        return b"\n" in handle.read(1 << 16)


def reload_script(interval: float) -> str:
    """The live page reloads itself every `interval` seconds, where it was scrolled to. Served over HTTP
    (--serve), it asks first and stays, saying so, when the follower is not answering (a reload would show
    the browser's error page); from a file it reloads the file. It says when the page is old: a follower
    stopped (Ctrl-C) leaves its last live page."""
    every, written = round(interval * 1000), round(time.time() * 1000)
    return (
        f"<noscript><meta http-equiv='refresh' content='{max(1, round(interval))}'></noscript><script>"
        f"(function(){{var every={every},written={written},key='sftdoctor-scroll:'+location.pathname;"
        "function old(){var s=document.getElementById('stale'),age=Math.round((Date.now()-written)/1000);"
        "if(s&&age*1000>3*every+10000)s.textContent=' This page was written '+age+' s ago: the follower "
        "(report --follow) may have stopped.';}"
        "addEventListener('load',function(){var y=sessionStorage.getItem(key);if(y!==null)scrollTo(0,+y);old();});"
        "function reload(){sessionStorage.setItem(key,String(scrollY));location.reload();}"
        "function stale(){old();setTimeout(tick,every);}"
        "function tick(){if(location.protocol==='file:'){reload();return;}"
        "fetch(location.href,{method:'HEAD',cache:'no-store'}).then(function(r){r.ok?reload():stale();},stale);}"
        "setTimeout(tick,every);})();</script>"
    )


def clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def live_banner(run: Path, judged: list[Judged] | None, interval: float) -> str:
    if judged is None:
        said = f"live: waiting for the run's first logged step (no record in {layout.METRICS} yet)"
    else:
        said = (
            f"live: last record at step {judged[0].run.curves['last_step']}, "
            f"{clock(os.path.getmtime(run / layout.METRICS))}; run still writing"
        )
    return (
        f"<div class='banner live' id='state'>{page.esc(said)}<span class='muted'> (this page reloads every "
        f"{interval:g} s)</span><span class='warning' id='stale'></span></div>"
    )


def ended(run: Path, judged: list[Judged] | None, why: str) -> str:
    """How the run ended, as its directory says (page.ending); for a run neither a watcher stopped nor complete
    (a crash, Ctrl-C, a killed launcher), where to look."""
    if judged is None:
        said = f"run ended before it logged a step ({why}); see {run / layout.LOG}"
    else:
        curves = judged[0].run.curves
        said = f"run ended: {page.ending(curves)}"
        if not curves.get("stopped") and not curves.get("finished"):
            said += f" ({why}); why it ended: see {run / layout.LOG}"
    return said


class Follower:
    def __init__(self, run: Path, target: Path, by: str, plugins: bool, interval: float, say=print, wait=time.sleep):
        self.run, self.target, self.by, self.plugins, self.interval = run, target, by, plugins, interval
        self.say, self.wait = say, wait  # what it prints with, how it waits between looks
        self.told: set[tuple] = set()
        self.latest: bytes | None = None  # the last page written, as --serve serves it

    def follow(self) -> int:
        """Draws on every change while the run is live, then the final page; 0."""
        drawn, waited = None, False
        while True:
            why = liveness.over(self.run)  # looked at first: the last drawing then reads all the run wrote
            now = stamp(self.run)
            if why is not None:
                return self.end(why)
            if now != drawn:
                judged = self.draw(page_banner=lambda j: live_banner(self.run, j, self.interval), live=True)
                drawn = now
                if judged is None and not waited:
                    self.say("sftdoctor: waiting for the run's first logged step", flush=True)
                waited = judged is None
            self.wait(self.interval)

    def end(self, why: str) -> int:
        judged = self.draw(
            page_banner=lambda j: f"<div class='banner ended' id='state'>{page.esc(ended(self.run, j, why))}</div>",
            live=False,
        )
        if judged is not None:
            self.tell_findings(judged[0])  # one the watchers wrote as the run ended
        self.say(f"sftdoctor: {ended(self.run, judged, why)}; final page: {os.path.normpath(self.target)}", flush=True)
        return 0

    def draw(self, page_banner, live: bool) -> list[Judged] | None:
        """The page written (live: with its reload script); the run's judged record, None before its first step."""
        extra = reload_script(self.interval) if live else ""
        title = f"sftdoctor report: {self.run.resolve().name}"
        if not logged(self.run):
            self.write(page.waiting(title, extra, page_banner(None)))
            return None
        judged = load([self.run], self.by, self.plugins, live=True)
        axis, runs = Axis(self.by), [j.run for j in judged]
        panels = [(panel, render(panel, runs, axis)) for panel in shown(runs)]
        self.write(page.page(judged, panels, axis, extra, page_banner(judged), live))
        if live:
            self.tell(judged[0])
        return judged

    def write(self, html: str) -> None:
        data = html.encode("utf-8")
        write_atomic(self.target, data)
        self.latest = data

    def tell(self, judged: Judged) -> None:
        """One line per drawing, and each new finding of the watchers."""
        curves = judged.run.curves
        loss = curves["series"].get("loss")
        self.say(
            f"sftdoctor: {clock(time.time())} step {curves['last_step']}"
            + (f", loss {number(loss['values'][-1])}" if loss else "")
            + ": page updated",
            flush=True,
        )
        self.tell_findings(judged)

    def tell_findings(self, judged: Judged) -> None:
        for record in judged.run.findings:
            key = (record.get("id"), record.get("step"), record.get("title"))
            if record.get("phase") in MARKS and key not in self.told:
                self.told.add(key)
                self.say(
                    f"sftdoctor: {record.get('severity')} at step {record.get('step')}: {record.get('id')}: "
                    f"{record.get('title')}",
                    flush=True,
                )


def page_file(run: Path, output: Path | None) -> Path:
    folder = Path(output) if output is not None else run
    if folder.exists() and not folder.is_dir():
        raise InputError(folder, "exists and is not a folder (expected the folder to write report.html in)")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / layout.REPORT


def lower_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):  # no nice() (Windows): it runs at the same priority
        os.nice(NICE)


def main(
    runs: list[Path],
    output: Path | None,
    by: str,
    as_json: bool,
    plugins: bool,
    interval: float | None = None,
    port: int | None = None,
) -> int:
    """Exit 0 once the run ended and its final page is written. Bad input raises InputError; Ctrl-C or SIGTERM
    raises Interrupted, leaving the last page written whole (and no temporary file)."""
    run = run_folder(runs, as_json)
    interval = INTERVAL_S if interval is None else interval
    with interruptible():
        target = page_file(run, output)
        follower, server = Follower(run, target, by, plugins, interval), None
        if port is not None:
            from sftdoctor.report.serve import serve

            server = serve(lambda: follower.latest, port)
        lower_priority()
        print(
            f"sftdoctor: following {os.path.normpath(run)} (every {interval:g} s, at a lower CPU priority); "
            f"the page: {os.path.normpath(target)}"
            + (f"; served at http://127.0.0.1:{server.server_address[1]}/" if server else ""),
            flush=True,
        )
        try:
            code = follower.follow()
            if server is not None:  # a browser's next reload gets the final page, not an error
                time.sleep(2 * interval + 1)
            return code
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
