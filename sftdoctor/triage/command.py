"""`sftdoctor explain`: a topic of the knowledge base, or (--log) what went wrong in a run's log."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sftdoctor import __version__, kb
from sftdoctor.checks._collectives import dumps_finding
from sftdoctor.errors import InputError, read_text
from sftdoctor.facts.child import in_child
from sftdoctor.facts.flight_recorder import FR_DIR, dumps_in
from sftdoctor.run.layout import RESOLVED
from sftdoctor.triage import Diagnosis, add_dumps_finding, diagnose
from sftdoctor.triage.render import diagnosis_json_text, render_diagnosis
from sftdoctor.triage.sniff import SAMPLE, unreadable

FR_TIMEOUT_S = 120  # torch's import and the analyzer over 2,000 entries per rank take seconds


def main(
    topic: str | None = None,
    list_topics: bool = False,
    log_file: str | None = None,
    as_json: bool = False,
    jobs: int | None = None,
) -> int:
    """With --log, exit 0: nothing recognised; 1: a problem found. Bad input raises InputError."""
    if as_json:
        text, code = json_text(topic, list_topics, log_file, jobs)
        sys.stdout.write(text)
        return code
    if log_file is not None:
        log_alone(topic, list_topics, log_file)
        return triage(log_file, jobs or default_jobs())
    if list_topics or not topic:
        for t in kb.topics():
            print(f"{t.name:<22} {t.summary}")
        return 0
    kb.render(kb.topic(topic))
    return 0


def json_text(
    topic: str | None = None, list_topics: bool = False, log_file: str | None = None, jobs: int | None = None
) -> tuple[str, int]:
    """What `explain --json` prints (the log's diagnosis, the topic, or the list of topics), and its exit code
    (for `sftdoctor mcp`, which prints nothing)."""
    if log_file is not None:
        log_alone(topic, list_topics, log_file)
        return log_json(log_file, jobs)
    return topics_json() if list_topics or not topic else topic_json(topic), 0


def log_alone(topic: str | None, list_topics: bool, log_file: str) -> None:
    if topic or list_topics:
        raise InputError("explain", "give a TOPIC or --log FILE, not both")
    if not log_file.strip():
        raise InputError("--log", "an empty path (an unset shell variable?); expected a log file, or - for stdin")


def default_jobs() -> int:
    return min(os.cpu_count() or 1, 8)


def topic_json(name: str) -> str:
    """What `explain TOPIC --json` prints: the topic (or its TOPIC/slug section) as Markdown, its summary and the
    checks that point to it."""
    entry = kb.topic(name)
    checks = entry.meta.get("checks", [])
    doc = {"sftdoctor": __version__, "topic": entry.name, "summary": entry.summary, "checks": checks}
    return json.dumps({**doc, "text": entry.body}, indent=2) + "\n"


def topics_json() -> str:
    """What `explain --list --json` prints: every topic's name and summary."""
    topics = [{"name": t.name, "summary": t.summary} for t in kb.topics()]
    return json.dumps({"sftdoctor": __version__, "topics": topics}, indent=2) + "\n"


def triage(log_file: str, jobs: int) -> int:
    diagnosis = diagnosed(log_file, jobs)
    render_diagnosis(diagnosis)
    return 1 if diagnosis.problems else 0


def log_json(log_file: str, jobs: int | None = None) -> tuple[str, int]:
    """What `explain --log FILE --json` prints, and its exit code (for `sftdoctor mcp`, which prints nothing)."""
    diagnosis = diagnosed(log_file, jobs or default_jobs())
    return diagnosis_json_text(diagnosis), 1 if diagnosis.problems else 0


def diagnosed(log_file: str, jobs: int) -> Diagnosis:
    """The log's diagnosis (- reads stdin), with the flight-recorder dumps beside a log file."""
    try:
        stream = sys.stdin.buffer if log_file == "-" else open(log_file, "rb")  # noqa: SIM115 - `with stream` below
    except OSError as exc:
        raise InputError(log_file, f"cannot read the log: {exc.strerror or exc}") from None
    with stream:
        try:
            why = unreadable(stream.peek(SAMPLE)[:SAMPLE] if log_file == "-" else _head(stream))
            if why:
                raise InputError(log_file, f"cannot triage the log: {why}")
            diagnosis = diagnose(stream, "<stdin>" if log_file == "-" else log_file, jobs=jobs)
        except OSError as exc:  # a directory, a vanished file
            raise InputError(log_file, f"cannot read the log: {exc.strerror or exc}") from None
    if log_file != "-":
        beside(diagnosis, Path(log_file).parent)
    return diagnosis


def beside(diagnosis: Diagnosis, folder: Path) -> None:
    """The flight-recorder dumps beside the log (the run directory, or its flight-recorder/ folder that the hang
    watchdog writes), read by torch's analyzer in a child process: which collective, which rank stayed out. The
    dumps that cannot be read are named in the finding; the log's own verdict stands whatever they hold."""
    for where in (folder / FR_DIR, folder):
        if found := dumps_in(where):
            request = {"folder": str(where), "world": world_of(folder)}
            fr = in_child(
                "sftdoctor.facts.flight_recorder", request, "reading the flight-recorder dumps", timeout_s=FR_TIMEOUT_S
            )
            if "dumps" not in fr:  # the reader itself failed (a timeout): each dump unread, for that reason
                why = fr.get("error")
                fr = {**fr, "dumps": [], "unreadable": {str(r): f"{p.name}: {why}" for r, p in found.items()}}
            add_dumps_finding(diagnosis, dumps_finding({"folder": str(where), **fr}))
            return


def world_of(run_dir: Path) -> int | None:
    """The run's world size from its resolved.json beside the log (sftdoctor's run directory), or None: the dumps
    alone may not say how many ranks there were, and a rank that sent no dump must still be counted."""
    try:
        size = json.loads(read_text(run_dir / RESOLVED, "resolved plan", limit=1 << 20)).get("world_size")
    except (InputError, ValueError, AttributeError, RecursionError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _head(stream) -> bytes:
    """The first bytes of a log file, the file left at its start for the scan."""
    head = stream.read(SAMPLE)
    stream.seek(0)
    return head
