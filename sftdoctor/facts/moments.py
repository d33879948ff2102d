"""The facts no probe reads: each moment of a run, which sftdoctor.train.watch passes to the runtime checks as the
run produces it, and every rank's record of a job, which `check --distributed` gathers for the distributed
checks. Declared here so that a check can ask for them by name (facts.catalogue)."""

from __future__ import annotations

from sftdoctor.facts.catalogue import fact

STEP_STATS = fact(
    "step_stats",
    "one optimizer step, before it is taken: finite or not, loss, gradient norm, ranks; when a "
    "non-finite one stops the run, its rows and their fp32 re-runs",
    phase="runtime",
)
LOG_STATS = fact("log_stats", "a logged loss with its recent history", phase="runtime")
RANK_TIMES = fact(
    "rank_times",
    "each rank's own data and forward time per step over the last logging intervals, with its host and GPU "
    "(train.stragglers)",
    phase="runtime",
)
SCALE_STATS = fact("scale_stats", "fp16 dynamic loss scaling: the scale and the steps it skipped", phase="runtime")
HANG = fact(
    "hang",
    "the watchdog's report of a stall: each rank's step, phase and stack, and the flight recorder's "
    "dumps read by torch's analyzer",
    phase="runtime",
)
CLUSTER = fact(
    "cluster",
    "each rank's record, who joined, and the all-reduce sweep",
    phase="distributed",
    why_missing="only under `sftdoctor check --distributed` (every rank of a job)",
)
