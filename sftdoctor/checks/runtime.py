"""Runtime checks: the same findings as before step 0, from facts the trainer streams while it runs.

The watcher (sftdoctor.train.watch) calls them with the facts of the moment; they return no
finding when all is well, so a healthy run prints nothing."""

from __future__ import annotations

import statistics
from typing import Any

from sftdoctor.checks import check
from sftdoctor.checks._collectives import FIX, describe, gaps, ranks_text, silent_fix
from sftdoctor.findings import error, warning

MIN_HISTORY = 8  # logged losses before the robust (median/MAD) rule is used
DIVERGED = 3.0  # any time: a loss this many times its lowest logged value (and 1 nat above it) is divergence
WARMUP_STEPS = 50  # early fp16 loss-scale skips are the scaler finding its level: normal


@check(
    "nan-loss",
    "a non-finite loss or gradient norm, caught before the optimizer step (DeepSpeed: as it skips it)",
    phase="runtime",
)
def nan_loss(step_stats: dict[str, Any]):
    if step_stats.get("finite", True):
        return []
    step, ranks = step_stats["step"], step_stats.get("ranks") or "all"
    last = step_stats.get("last_finite") or {}
    what = "the loss was non-finite" if step_stats.get("loss_finite") is False else "the gradients overflowed"
    parts = [f"At step {step} {what} (gradient norm {step_stats.get('grad_norm')}) on rank(s) {ranks}."]
    if last:
        parts.append("Last finite values: " + ", ".join(f"{k} {v:.4g}" for k, v in last.items() if v is not None) + ".")
    parts.append(
        f"Learning rate {step_stats.get('lr', float('nan')):.3g}, precision {step_stats.get('precision')}"
        + (f", loss scale {step_stats['loss_scale']:g}" if step_stats.get("loss_scale") else "")
        + "."
    )
    if step_stats.get("attribution"):
        parts.append(step_stats["attribution"])
    traced = rows_said(step_stats.get("rows"))
    parts += traced[1:]
    checkpoint = step_stats.get("checkpoint")
    parts.append(f"Last good checkpoint: {checkpoint or 'none yet'}.")
    action = step_stats.get("action", "stopped")
    # bf16 over fp16 is advice only for an fp16 run; fp32 and bf16 runs have no loss-scale overflow to blame.
    precision = "; use bf16 rather than fp16" if step_stats.get("precision") == "fp16" else ""
    fix = (
        (
            f"resume from {checkpoint} with `sftdoctor train RUN.toml --resume` after lowering learning_rate or "
            f"raising warmup{precision}; see which module went non-finite above"
        )
        if checkpoint
        else f"lower learning_rate or lengthen warmup{precision}"
    )
    if (step_stats.get("rows") or {}).get("verdict") == "rows":
        fix = (
            f"read the rows named (fix or drop them), then resume from {checkpoint or 'the start'}: the step is "
            "non-finite in fp32 on its pre-step weights, so a lower learning rate would not help"
        )
    return error(
        f"non-finite loss at step {step}: {action}" + (f"; {traced[0]}" if traced[0] else ""),
        detail=" ".join(parts),
        fix=fix,
        evidence={k: v for k, v in step_stats.items() if k != "attribution"},
    )


def rows_said(rows: dict[str, Any] | None) -> list[str]:
    """[a headline or "", then sentences] of a non-finite step's trace (sftdoctor.train.rows): each rank's rows,
    and what re-running its micro-batches alone in fp32 on the pre-step weights said."""
    if not rows:
        return [""]
    said = []
    for rank, t in sorted((rows.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        for i, mb in enumerate(t.get("micro_batches", [])):
            fp32 = mb.get("fp32") or {}
            outcome = (
                "non-finite again in fp32"
                if fp32.get("finite") is False
                else "finite in fp32"
                if fp32.get("finite")
                else f"not re-run ({fp32.get('error') or t.get('why_not_fp32') or 'no result'})"
            )
            said.append(f"Rank {rank} micro-batch {i + 1}: {'; '.join(mb['rows'])} ({outcome}).")
    v = rows.get("verdict")
    if rows.get("empty"):
        said.append(
            "No micro-batch of the step has a target token (every label is -100): its loss is 0/0. Each of "
            "these rows lost its trained part, e.g. a prompt longer than max_length cut the completion off."
        )
        return [f"no target token in the step's {len(rows.get('culprits', []))} rows", *said]
    if v == "rows":
        culprits = rows.get("culprits") or []
        headline = (
            f"traced to {culprits[0]}" + (f" and {len(culprits) - 1} more row(s)" if len(culprits) > 1 else "")
            if culprits
            else "the rows of " + ", ".join(rows.get("again", []))
        )
        said.append(
            "Re-run alone in fp32 on the pre-step weights, " + ", ".join(rows.get("again", [])) + " went non-finite "
            "again: these rows, not numerics. "
            + (
                f"Alone, non-finite: {'; '.join(culprits)}."
                if culprits
                else "No row is non-finite alone: their combination is (e.g. a micro-batch with no target tokens)."
            )
        )
        return [headline, *said]
    if v == "numerics":
        said.append(
            "Every micro-batch re-run alone in fp32 on the pre-step weights is finite: not these rows but the "
            "run's precision (an overflow in bf16/fp16), or a non-finite value injected in the loss."
        )
        return ["finite in fp32: numerics, not the rows", *said]
    if v == "not-reproduced":
        said.append(
            "Every micro-batch re-run alone on the pre-step weights (fp32, as trained) is finite: not these rows "
            "by themselves (a non-deterministic kernel, or a value injected in the loss)."
        )
        return ["", *said]
    said.append(f"Not judged rows or numerics: {rows.get('why') or 'a re-run failed'}.")
    return ["", *said]


def robust_spike(value: float, history: list[float], factor: float) -> tuple[bool, float, float]:
    """Median and MAD (scaled to a standard deviation) of recent values; a spike is far above both."""
    median = statistics.median(history)
    mad = statistics.median(abs(x - median) for x in history) * 1.4826
    threshold = median + factor * max(mad, 0.01 * abs(median), 1e-8)
    return value > threshold and value > 1.2 * median, median, threshold


@check(
    "loss-spike",
    "a logged loss far above its recent level (median and MAD)",
    phase="runtime",
    messages={
        "diverging": "the loss is several times its lowest so far: divergence",
        "spike": "a loss far above its recent median",
    },
)
def loss_spike(log_stats: dict[str, Any]):
    history, loss = log_stats.get("history") or [], log_stats.get("loss")
    if loss is None or not history:
        return []
    best = min(history)
    if best > 0 and loss > DIVERGED * best and loss > best + 1.0:
        return warning(
            f"loss diverging at step {log_stats['step']}: {loss:.4g}, "
            f"{loss / best:.1f}x its lowest so far ({best:.4g})",
            detail=f"Grad norm {log_stats.get('grad_norm')}, learning rate {log_stats.get('lr')}. "
            "A loss that multiplies "
            "is an update too large for the model: the learning rate (or warmup) is off.",
            fix="stop and lower learning_rate (full SFT of 7B-class models: 1e-5 to 2e-5), lengthen warmup, keep "
            "max_grad_norm = 1.0",
            evidence=log_stats,
            id="loss-spike/diverging",
        )
    if len(history) < MIN_HISTORY:
        return []
    spike, median, threshold = robust_spike(loss, history, log_stats.get("factor", 6.0))
    if not spike:
        return []
    return warning(
        f"loss spike at step {log_stats['step']}: {loss:.4g} against a recent median of {median:.4g}",
        detail=f"Above the threshold {threshold:.4g} (median + {log_stats.get('factor', 6.0):g} robust deviations over "
        f"the last {len(history)} logged values) in the logging window ending at step {log_stats['step']}, "
        f"grad norm {log_stats.get('grad_norm')}, learning rate {log_stats.get('lr')}.",
        fix="if it recurs or keeps rising: lower learning_rate, check max_grad_norm (1.0), and look at the data of "
        "that window (a corrupt or very long sample)",
        evidence=log_stats,
        id="loss-spike/spike",
    )


@check(
    "fp16-loss-scale",
    "fp16 dynamic loss scaling stuck at its minimum or skipping most steps",
    phase="runtime",
    messages={
        "stuck-at-minimum": "the fp16 loss scale is stuck at its minimum",
        "skipping": "fp16 loss scaling skips most steps",
    },
)
def fp16_loss_scale(scale_stats: dict[str, Any]):
    step, scale = scale_stats["step"], scale_stats.get("scale")
    skipped, window = scale_stats.get("skipped", 0), scale_stats.get("window", 0)
    if scale is None or step < WARMUP_STEPS:
        return []
    if scale <= scale_stats.get("min_scale", 1.0) and skipped:
        return error(
            f"fp16 loss scale stuck at its minimum {scale:g} at step {step}",
            detail=f"{skipped} of the last {window} steps overflowed and were skipped: the gradients overflow "
            "fp16 whatever the scale — the model is diverging or its activations exceed fp16's range.",
            fix="train in bf16 on Ampere or newer; otherwise lower learning_rate",
            evidence=scale_stats,
            id="fp16-loss-scale/stuck-at-minimum",
        )
    if window and skipped > window // 2:
        return warning(
            f"fp16 loss scaling skipped {skipped} of the last {window} steps (scale {scale:g})",
            detail="Skipped steps are lost updates; past warm-up this many means overflow is chronic.",
            fix="train in bf16 on Ampere or newer; otherwise lower learning_rate",
            evidence=scale_stats,
            id="fp16-loss-scale/skipping",
        )
    return []


@check("nccl-timeout", "no progress on some rank: which rank is behind, where, and what it was doing", phase="runtime")
def nccl_timeout(hang: dict[str, Any]):
    behind = hang.get("behind") or []
    arrived = hang.get("arrived") or {}
    silent = [int(r) for r, got in arrived.items() if not (got.get("report") or got.get("stacks") or got.get("dump"))]
    who = f"rank {', '.join(map(str, behind))}" if behind else "no single rank (all stalled alike)"
    if behind and set(behind) <= set(silent):
        states = [_process(arrived[str(r)].get("process")) for r in behind]
        who += " (sent nothing: no report, no stacks, no dump" + "".join(f"; {s}" for s in states if s) + ")"
    headline, collectives = describe(hang.get("flight_recorder"))
    fr = hang.get("flight_recorder") or {}
    short, _ = gaps(fr) if fr.get("dumps") else ("", "")
    if silent and short and headline.endswith(f"; {short}") and set(fr.get("no_dump") or []) <= set(silent):
        headline = headline[: -len(short) - 2]  # the title has already said these ranks sent nothing
    if silent:
        fix = _frozen_fix(silent, arrived) + "; then read the stacks of the ranks that did report"
    elif fr.get("groups"):
        fix = FIX
    else:
        fix = (
            "read the stacks of the rank behind: a data-loader or I/O stall, a rank that skipped or added a "
            "collective (e.g. a rank-dependent branch), or a dead GPU/NIC (`nvidia-smi`, dmesg on its node)"
        )
    return error(
        f"hang: no progress for {hang['timeout_s']:.0f} s; behind: {who}" + (f"; {headline}" if headline else ""),
        detail=_what_arrived(hang, silent) + f" {collectives}",
        fix=fix,
        evidence=hang,
    )


def _process(proc: dict[str, Any] | None) -> str:
    """ "process 6976 on node-a: T (stopped (SIGSTOP))", what the reporting rank could see of a silent rank."""
    if not proc:
        return ""
    state = proc.get("state") or "its state unseen from this host"
    wchan = f", waiting in {proc['wchan']}" if proc.get("wchan") else ""
    return f"process {proc.get('pid')} on {proc.get('host')}: {state}{wchan}"


def _frozen_fix(silent: list[int], arrived: dict[str, Any]) -> str:
    """The silent ranks' own state first where it was seen (a stopped one is resumed or killed, a D one is the
    kernel's), then how to look at a process that answers nothing."""
    seen = []
    for r in silent:
        proc = (arrived.get(str(r)) or {}).get("process") or {}
        letter = (proc.get("state") or " ")[0]
        if letter == "T":
            seen.append(
                f"rank {r}'s process {proc['pid']} was stopped (SIGSTOP: a debugger, ^Z, a scheduler's "
                f"suspend): `kill -CONT {proc['pid']}` resumes it"
            )
        elif letter == "D":
            seen.append(
                f"rank {r}'s process {proc['pid']} is blocked in the kernel: `cat /proc/{proc['pid']}/stack` "
                "says where (nfs_*: the NFS server; nvidia/uvm: the GPU driver)"
            )
    return "; ".join([*seen, silent_fix(silent)])


def _what_arrived(hang: dict[str, Any], silent: list[int]) -> str:
    """Rank by rank, what reached the watchdog: the progress report (step, phase, where), the stacks, the dump;
    the ranks that sent nothing first, as the first suspects."""
    ranks, arrived = hang.get("ranks") or {}, hang.get("arrived") or {}
    said = []
    for r in sorted({*ranks, *arrived}, key=int):
        info, got = ranks.get(r), arrived.get(r) or {}
        parts = [
            f"step {info.get('step')}, {info.get('phase')}, {info.get('stalled_s', 0):.0f} s without progress; "
            f"at {info.get('where', '?')}"
            if info
            else "no report"
        ]
        if arrived:
            parts += [
                f"stacks {got['stacks']}" if got.get("stacks") else "no stacks",
                f"dump {got['dump']}" if got.get("dump") else "no dump",
            ]
        if int(r) in silent:
            parts = ["nothing (no report, no stacks, no dump)", *filter(None, [_process(got.get("process"))])]
        said.append(f"rank {r}: " + "; ".join(parts))
    text = " | ".join(said) + "."
    if silent:
        whose = "its process is" if len(silent) == 1 else "their processes are"
        text = (
            f"{ranks_text(silent).capitalize()} sent nothing: {whose} "
            "unresponsive (stopped, in uninterruptible sleep (D) on a stuck NFS read or a wedged GPU, or the host "
            f"is gone), the first suspect. What arrived, per rank: {text}"
        )
    if hang.get("store_answered") is False:  # the c10d store is served from rank 0's process
        text += (
            " The ranks' store (TCP, served from rank 0's process) did not answer either: the reports could "
            "not be swapped, and rank 0's process is not answering."
        )
    return text + f" Python stacks: {hang.get('stacks')}."
