"""The straggler check: a rank whose own data or forward time per step stays above the other ranks' for several
logging intervals, named with its host and GPU, while it is still only slowing the job (before it turns into a
hang). The measurement, and why these two signals, is in sftdoctor.train.stragglers; the rule is here.

The rule, per signal (data: fetching the step's batches; forward: the rank's own forward passes) and per rank:
- an interval is slow for rank r when its time per step is at least RATIO times the median of the other ranks'
  and at least MARGIN more: the larger of FLOOR_S and SHARE of the step's wall time;
- a straggler is slow in each of the last INTERVALS logging intervals, and those cover MIN_STEPS optimizer steps.

Why these numbers:
- RATIO = 1/0.7: NVIDIA's nvidia-resiliency-ext flags a rank whose relative performance score (the reference
  rank's time over its own) falls below 0.7, its default `gpu_relative_perf_threshold` (as in Megatron-Bridge's
  NVRxStragglerDetectionConfig and NeMo's StragglerDetectionCallback examples): about 43% slower. The reference
  here is the other ranks' median rather than the fastest rank, so one lucky rank does not make the rest look slow.
- FLOOR_S = 50 ms: a rank's data or forward time moves by tens of milliseconds with the host's scheduling, a
  garbage collection or a page-cache miss; a difference under it is noise on tiny steps, whatever the ratio.
- SHARE = 5%: the others wait for the straggler in the gradient all-reduce, so its excess is the job's loss per
  step; under 5% of the step it is not worth a warning.
- INTERVALS = 3 and MIN_STEPS = 6: one slow interval is an event (a checkpoint save, an evaluation, a page-cache
  flush, another job's burst on that host); three in a row, over at least six steps, is a condition.
Rank 0's own extra work (writing the logs and checkpoints, evaluating) happens outside both measured windows, so
it never makes rank 0 a straggler; what a collective inside a window would do is said where the windows are.

A rank whose time did not arrive is unknown, never healthy: it is said once (info), and judged again when it
arrives. Each rank and signal is named once: the watcher passes the keys it has published back (`reported`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import info, warning

RELATIVE_SCORE = 0.7  # nvidia-resiliency-ext's default gpu_relative_perf_threshold
RATIO = 1 / RELATIVE_SCORE
FLOOR_S = 0.05
SHARE = 0.05
INTERVALS = 3
MIN_STEPS = 6
SIGNALS = {"forward": "in its forward passes", "data": "fetching its batches"}
CAUSES = {
    "forward": "Its own compute is slow: a GPU throttled (thermal or power capping), a slower or degraded GPU, "
    "another process on the same GPU, or a host whose CPUs are starved so that it launches its kernels late.",
    "data": "Its batches come slowly: that host's disk or network file system, CPUs busy with something else on "
    "that node (sftdoctor's trainer loads the data in the training process: dataloader_num_workers = 0), or "
    "longer rows reaching that rank alone.",
}


def number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def judged(interval: dict[str, Any], signal: str, rank: int) -> tuple[bool | None, float, float]:
    """(slow or not, or None when it cannot be told; this rank's time; the other ranks' median) in one interval."""
    values = interval.get(f"{signal}_s") or []
    mine = values[rank] if rank < len(values) else None
    others = [v for r, v in enumerate(values) if r != rank and number(v)]
    if not number(mine) or not others:
        return None, math.nan, math.nan
    median = statistics.median(others)
    margin = max(FLOOR_S, SHARE * (interval.get("step_time_s") or 0.0))
    return mine >= RATIO * median and mine - median >= margin, mine, median


def sustained(intervals: list[dict[str, Any]], signal: str, rank: int) -> list[tuple[dict, float, float]]:
    """The newest run of slow intervals for this rank, newest first, once it is long enough; [] before."""
    run: list[tuple[dict, float, float]] = []
    steps = 0
    for interval in reversed(intervals):
        slow, mine, median = judged(interval, signal, rank)
        if not slow:
            return []
        run.append((interval, mine, median))
        steps += max(1, int(interval.get("steps") or 1))
        if len(run) >= INTERVALS and steps >= MIN_STEPS:
            return run
    return []


def unmeasured(intervals: list[dict[str, Any]], signal: str, world: int) -> list[int]:
    """The ranks whose time for this signal arrived in none of the last INTERVALS intervals."""
    recent = intervals[-INTERVALS:]
    if len(recent) < INTERVALS:
        return []
    return [r for r in range(world) if not any(number(_at(i.get(f"{signal}_s"), r)) for i in recent)]


def _at(values: list | None, rank: int) -> Any:
    return values[rank] if values and rank < len(values) else None


def where(ranks: list, rank: int) -> tuple[str, str]:
    """(host, GPU) of a rank, as it said at the start; unknown when its identity did not arrive."""
    said = _at(ranks, rank) or {}
    return str(said.get("host") or "host unknown"), str(said.get("gpu") or "GPU unknown")


@check(
    "straggler",
    "a rank whose own data or forward time per step stays above the other ranks' (warning: the run goes on)",
    phase="runtime",
    messages={
        "forward": "a rank's forward passes stay slower than the other ranks'",
        "data": "a rank's batches stay slower to fetch than the other ranks'",
        "unmeasured": "a rank's own times did not arrive: whether it straggles is unknown",
    },
)
def straggler(rank_times: dict[str, Any]):
    intervals = [i for i in rank_times.get("intervals") or [] if isinstance(i, dict)]
    world = max((len(i.get(f"{s}_s") or []) for i in intervals for s in SIGNALS), default=0)
    reported = set(rank_times.get("reported") or [])
    unjudged = rank_times.get("unjudged") or {}
    found = []
    for signal in SIGNALS:
        if signal in unjudged or world < 2:
            continue
        for rank in range(world):
            run = sustained(intervals, signal, rank)
            if run and f"{signal}/{rank}" not in reported:
                found.append(_straggler(rank_times, signal, rank, run, world))
        missing = unmeasured(intervals, signal, world)
        key = f"unmeasured-{signal}/" + ",".join(map(str, missing))
        if missing and key not in reported:
            found.append(_unknown(signal, missing, world, intervals, key))
    return found


def _straggler(rank_times: dict[str, Any], signal: str, rank: int, run: list, world: int):
    host, gpu = where(rank_times.get("ranks") or [], rank)
    newest, first = run[0][0], run[-1][0]
    steps = sum(max(1, int(i.get("steps") or 1)) for i, _, _ in run)
    since = int(first["step"]) - max(1, int(first.get("steps") or 1)) + 1
    mine = [round(m, 4) for _, m, _ in reversed(run)]
    medians = [round(m, 4) for _, _, m in reversed(run)]
    ratio = min(m / max(d, 1e-9) for m, d in zip(mine, medians))
    step_time = statistics.median(float(i.get("step_time_s") or 0.0) for i, _, _ in run)
    excess = statistics.median(m - d for m, d in zip(mine, medians))
    seconds = sum(float(i.get("step_time_s") or 0.0) * max(1, int(i.get("steps") or 1)) for i, _, _ in run)
    others = "the other rank's" if world == 2 else f"the median of the other {world - 1} ranks'"
    waiting = (
        f" The other ranks wait for it in each step's gradient all-reduce, so the whole job runs at its pace: about "
        f"{excess:.3g} s of each {step_time:.3g} s step ({excess / step_time:.0%}) is spent waiting for rank {rank}."
        if step_time > 0
        else ""
    )
    return warning(
        f"straggler: rank {rank} ({host}, {gpu}) takes {mine[-1]:.3g} s per step {SIGNALS[signal]}, "
        f"{mine[-1] / max(medians[-1], 1e-9):.1f}x {others} {medians[-1]:.3g} s, for {steps} steps (since step "
        f"{since})",
        detail=f"Rank {rank} on {host} ({gpu}), time per step {SIGNALS[signal]} over the last {len(run)} logging "
        f"intervals (steps {since}-{newest['step']}, about {seconds:.0f} s): {_list(mine)} s, against {others} "
        f"{_list(medians)} s; at least {ratio:.1f}x in each, above the threshold of {RATIO:.2f}x and "
        f"{FLOOR_S * 1000:.0f} ms (or {SHARE:.0%} of the step) more.{waiting} {CAUSES[signal]} A warning: the run "
        "goes on, and left alone a rank that keeps slowing ends in a collective timeout (nccl-timeout).",
        fix=_fix(signal, host, gpu),
        evidence={
            "key": f"{signal}/{rank}",
            "rank": rank,
            "host": host,
            "gpu": gpu,
            "signal": signal,
            "steps": [since, newest["step"]],
            "seconds_per_step": mine,
            "others_median_s": medians,
            "step_time_s": round(step_time, 4),
        },
        id=f"straggler/{signal}",
    )


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


def _fix(signal: str, host: str, gpu: str) -> str:
    resume = "resume with `sftdoctor train RUN.toml --resume`"
    if signal == "data":
        return (
            f"on {host}: put the data files on a local disk rather than a network file system, and look for what "
            f"else keeps its CPUs busy (`top`); if it stays slow, leave {host} out and {resume}"
        )
    if not gpu.startswith("cuda:"):
        return (
            f"on {host}: look for what else keeps its CPUs busy (`top`); if it stays slow, leave {host} out and "
            + resume
        )
    # the UUID names the GPU whatever CUDA_VISIBLE_DEVICES renumbered; without one, the process's own index
    uuid = gpu.rsplit("(", 1)[-1].rstrip(")") if "(GPU-" in gpu else gpu.split()[0].removeprefix("cuda:")
    return (
        f"on {host}: `nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE -i {uuid}` (throttle reasons, clocks) and "
        f"`nvidia-smi` (other processes on that GPU); if it stays slow, drain that GPU or {host} and {resume}"
    )


def _unknown(signal: str, missing: list[int], world: int, intervals: list, key: str):
    what = "forward time" if signal == "forward" else "data time"
    said = (
        f"no rank's {what} arrived"
        if len(missing) == world
        else ", ".join(f"rank {r}'s" for r in missing) + f" {what} did not arrive"
    )
    return info(
        f"straggler: {said} for the last {INTERVALS} logging intervals: {'they are' if len(missing) > 1 else 'it is'} "
        "not judged",
        detail=f"Each rank sends its own {what} per step with the logging interval's metrics. For "
        f"{'these ranks' if len(missing) > 1 else 'this rank'} none arrived up to step {intervals[-1].get('step')}, "
        "so whether it is a straggler is unknown, not healthy. It is judged again as soon as its times arrive.",
        fix="look for the rank's own lines in train.log (a rank that trains no step in an interval measures nothing)",
        evidence={"key": key, "ranks": missing, "signal": signal},
        id="straggler/unmeasured",
    )
