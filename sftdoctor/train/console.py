"""What the person at the terminal reads of the workers' output.

train.log gets every byte as the workers wrote it (what `sftdoctor explain --log` reads). The terminal gets
the same lines, with what says nothing folded: a rank prefix repeated on one line (`[rank1]: [rank1]: `, torch
>= 2.2 under torchrun) is shown once; torchrun's own traceback and its ChildFailedError report, which only
restate which rank failed first, are left to the log after their first line, since the launcher then prints
the root cause itself; the stack's harmless lines (noise.QUIET_LINES) are not shown. A line that comes in
pieces with carriage returns (a progress bar redrawn) passes as it comes. Once the user has stopped the run
(Ctrl-C, SIGTERM) only sftdoctor's own lines still show: what the ranks print as they die (a KeyboardInterrupt
traceback each, torchrun's death-signal warnings) goes to train.log, and the launcher's one line says where the
run stopped and how to resume it.
"""

from __future__ import annotations

import re
from typing import BinaryIO

from sftdoctor.train.noise import QUIET_LINES

_PREFIX = r"\[(?:rank|default)(\d+)\]:"
REPEATED_PREFIX = re.compile(rf"^{_PREFIX}(?: ?\[(?:rank|default)\1\]:)+")
PREFIXED = re.compile(_PREFIX)
# torchrun (torch/distributed/elastic/multiprocessing/api.py), once a rank has exited non-zero:
# "E1201 13:14:09.686000 15254 .../api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 15275) of binary: ..."
TORCHRUN_FAILED = re.compile(r"elastic/multiprocessing/api\.py:\d+\] failed \(exitcode: -?\d+\)")
TORCHRUN_LOG = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d")  # torchrun's own log lines: level, date, time
REPORT_RULE = re.compile(r"^={20,}$")  # the report opens and closes with a rule of '='
OWN_LINE = re.compile(rf"^(?:{_PREFIX} ?)*sftdoctor: ")  # a rank's "sftdoctor: SIGTERM: checkpoint-8 saved"


class Console:
    def __init__(self, log: BinaryIO, terminal: BinaryIO | None):
        self.log, self.terminal = log, terminal
        self.partial = b""
        self.raw = False  # part of the current line has already gone out as it came
        self.skip = 0  # lines still to hide that belong to a hidden one
        self.failed = False  # torchrun has said a rank failed: its traceback and report may follow
        self.report_rules: int | None = None  # inside torchrun's traceback and report: its '=' rules seen so far
        self.stopping = False  # the user stopped the run: only sftdoctor's own lines still show

    def feed(self, data: bytes) -> None:
        self.log.write(data)
        self.log.flush()
        if self.terminal is None:
            return
        *lines, self.partial = (self.partial + data).split(b"\n")
        out = []
        for line in lines:
            if self.raw:
                out.append(line + b"\n")
                self.raw = False
            elif (shown := self.show(line.decode("utf-8", "replace").rstrip("\r"))) is not None:
                out.append(shown.encode() + b"\n")
        if self.partial and (self.raw or b"\r" in self.partial):
            out.append(self.partial)
            self.partial, self.raw = b"", True
        if out:
            self.terminal.write(b"".join(out))
            self.terminal.flush()

    def close(self) -> None:
        if self.partial:
            self.feed(b"\n")

    def show(self, text: str) -> str | None:
        """The line as the terminal shows it, or None."""
        if self.stopping and not OWN_LINE.match(text):
            return None
        if self.skip:
            self.skip -= 1
            return None
        if self.report_rules is not None and not PREFIXED.match(text):  # a rank's own lines still show
            if REPORT_RULE.match(text.strip()):
                self.report_rules += 1
                if self.report_rules == 2:
                    self.report_rules = None
            return None
        if self.failed and not PREFIXED.match(text) and not TORCHRUN_LOG.match(text):
            self.failed = False  # what follows is torchrun's traceback, or (a restart) the ranks' own output
            if text.startswith("Traceback (most recent call last):"):
                self.report_rules = 0
                return None
        for pattern, after in QUIET_LINES:
            if pattern.search(text):
                self.skip = after
                return None
        if TORCHRUN_FAILED.search(text):
            self.failed = True
            return text + "  (torchrun's traceback and report: in train.log)"
        return REPEATED_PREFIX.sub(lambda m: m.group(0).split(":", 1)[0] + ":", text)
