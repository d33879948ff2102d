"""data-prep-timeout: rank 0 prepares the data while every other rank waits for it in a barrier that gives up
after ddp_timeout; the preparation is measured on a sample of the run's rows (facts/data_prep.py)."""

from __future__ import annotations

import math
from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, ok, warning

# The estimate is a sample's rate on this machine, extrapolated: rank 0's node may be slower or busier (the other
# ranks load their models at the same moment), and rows further down a file may cost more per byte than the first
# ones (longer turns, more template). Half the timeout leaves room for the estimate to be off by a factor of 2.
WARN_SHARE = 0.5
MARGIN = 2.0  # the ddp_timeout the fix proposes: twice the estimate


def _hang_timeout_for(seconds: float) -> int:
    """The [watch] hang_timeout_s whose ddp_timeout (run.resolve.ddp_timeout: 4 x it + 120) covers `seconds`."""
    return max(5, math.ceil((seconds - 120) / 4))


def _measured(prep: dict[str, Any]) -> str:
    if prep.get("basis") == "bound":
        return (
            f"{prep['bytes_total'] / 2**20:.2f} MiB of rows, bounded, not measured: even at "
            f"{prep['floor_bytes_s'] / 1e3:.0f} kB/s, 1/16 of the slowest rate measured, they take at most that long"
        )
    procs = prep.get("num_proc") or 1
    size = f"{prep['bytes_total'] / 2**20:.1f} MiB, " if prep.get("basis") == "bytes" else ""
    return (
        f"{prep['rows_total']:,} rows ({size}extrapolated by {prep['basis']} from {prep['sample_rows']} rows "
        f"prepared in {prep['prep_s']:.2f} s, {prep['per_1k_rows_s']:.2f} s per 1,000 rows) in "
        f"{procs} process{'es' if procs > 1 else ''} (SFTConfig.dataset_num_proc"
        f"{' unset' if not prep.get('num_proc') else ''})"
    )


@check(
    "data-prep-timeout",
    "rank 0's data preparation fits the process group's timeout the other ranks wait in",
    messages={
        "not-measured": "rank 0's data preparation could not be measured",
        "times-out": "rank 0's data preparation outlasts ddp_timeout",
        "close-to-timeout": "rank 0's data preparation takes most of ddp_timeout",
    },
)
def data_prep_timeout(data_prep: dict, plan):
    if plan.world_size <= 1:
        raise NotApplicable("one process: no rank waits for another's data preparation")
    estimate, limit = data_prep.get("estimate_s"), plan.ddp_timeout_s
    if estimate is None:
        return warning(
            "rank 0's data preparation could not be measured: it is not known to fit ddp_timeout",
            detail=f"the probe said: {data_prep.get('error', 'no answer')}",
            fix="`sftdoctor train RUN.toml --smoke` runs the preparation on a few rows; time a 1-process "
            "run of the full data to know",
            evidence=data_prep,
            id="data-prep-timeout/not-measured",
        )
    share = estimate / limit
    about = "at most" if data_prep.get("basis") == "bound" else "about"
    what = (
        f"rank 0 prepares the data in {about} {estimate:,.0f} s, {share:.0%} of ddp_timeout {limit} s that ranks 1-"
        f"{plan.world_size - 1} wait in"
    )
    detail = (
        f"{_measured(data_prep)}. TRL's SFTTrainer prepares its datasets (chat template, tokenization, "
        f"truncation{', packing' if data_prep.get('packing') else ''}) on rank 0 first, while every other rank "
        "waits in a barrier of the default process group (global_then_local_main_first); sftdoctor's watchdog "
        "starts only after, so ddp_timeout alone bounds this phase. The first launch on these files pays it; "
        "later launches read the datasets cache unless the data or the tokenizer changed."
    )
    needed = _hang_timeout_for(MARGIN * estimate)
    fix = (
        f"[watch] hang_timeout_s = {needed} (ddp_timeout = 4 x hang_timeout_s + 120 = {4 * needed + 120} s, twice "
        "the estimate; it also lets a real hang run that long), or prepare the data once before the launch with one "
        "process (its datasets cache serves every rank after); in plain TRL: SFTConfig(ddp_timeout=..., "
        "dataset_num_proc=N)"
    )
    evidence = {**data_prep, "ddp_timeout_s": limit, "share": round(share, 3), "world_size": plan.world_size}
    if estimate >= limit:
        return error(
            what + ": the other ranks will time out before it ends",
            detail=detail,
            fix=fix,
            evidence=evidence,
            id="data-prep-timeout/times-out",
        )
    if share >= WARN_SHARE:
        return warning(
            what + f": above {WARN_SHARE:.0%}, a slower node or longer rows would time out",
            detail=detail,
            fix=fix,
            evidence=evidence,
            id="data-prep-timeout/close-to-timeout",
        )
    return ok(what, detail=detail, evidence=evidence)
