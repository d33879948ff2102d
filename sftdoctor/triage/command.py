"""`sftdoctor explain`: a topic of the knowledge base, or (--log) what went wrong in a run's log."""

from __future__ import annotations

import os
import sys

from sftdoctor import kb
from sftdoctor.errors import InputError
from sftdoctor.triage import diagnose
from sftdoctor.triage.render import render_diagnosis, render_diagnosis_json
from sftdoctor.triage.sniff import SAMPLE, unreadable


def main(topic: str | None = None, list_topics: bool = False, log_file: str | None = None, as_json: bool = False,
         jobs: int | None = None) -> int:
    """With --log, exit 0: nothing recognised; 1: a problem found. Bad input raises InputError."""
    if log_file is not None:
        if topic or list_topics:
            raise InputError("explain", "give a TOPIC or --log FILE, not both")
        if not log_file.strip():
            raise InputError("--log", "an empty path (an unset shell variable?); expected a log file, or - for stdin")
        return triage(log_file, as_json, jobs or min(os.cpu_count() or 1, 8))
    if as_json:
        raise InputError("explain", "--json goes with --log FILE")
    if list_topics or not topic:
        for t in kb.topics():
            print(f"{t.name:<22} {t.summary}")
        return 0
    kb.render(kb.topic(topic))
    return 0


def triage(log_file: str, as_json: bool, jobs: int) -> int:
    try:
        stream = sys.stdin.buffer if log_file == "-" else open(log_file, "rb")
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
    (render_diagnosis_json if as_json else render_diagnosis)(diagnosis)
    return 1 if diagnosis.problems else 0


def _head(stream) -> bytes:
    """The first bytes of a log file, the file left at its start for the scan."""
    head = stream.read(SAMPLE)
    stream.seek(0)
    return head
