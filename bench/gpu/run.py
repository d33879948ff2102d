"""sftdoctor's GPU paths on a real GPU, in one command and a few minutes: the machine's facts and check (kept
as a recorded fixture), sftdoctor's trainer against plain TRL (tokens/s and MFU), the packing probe under each
attention implementation, the memory plan against torch.cuda.max_memory_allocated, all-reduce bus bandwidth
against a plain NCCL loop, the flight recorder, the watchers' overhead, and FSDP2 beside ZeRO-2 and ZeRO-3
(tokens/s, peak GPU memory against the plan's).

    python bench/gpu/run.py [--budget-s 480] [--out RESULTS.json] [--fixture-dir DIR] [--only STEP,...]
    python bench/gpu/run.py --cpu-rehearsal          # the same steps on a CPU with the tiny model (CI)

Every figure goes to one JSON (default bench/gpu/results-HOST-DATE.json) and a table at the end, with what could
not run and why. A failing step records its error and the suite goes on; every child process has a timeout and
the whole suite ends within --budget-s (plus a few seconds to write its results). See bench/gpu/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import procs  # noqa: E402
import steps  # noqa: E402
import workload as wl  # noqa: E402
from context import Context, last_json  # noqa: E402

ROOT = wl.ROOT
GRACE_S = 15  # past the budget, the suite's own alarm stops whatever still runs


def expected_s(ctx: Context, name: str) -> float:
    """What each step usually takes (seconds): its share of the budget. A step that will skip costs nothing."""
    gpu = {
        "machine": 30,
        "packing_probe": 45,
        "throughput": 150,
        "watch_overhead": 70,
        "memory_plan": 150,
        "sharding": 150,
        "allreduce": 70,
        "flight_recorder": 25,
    }
    cpu = {
        "machine": 5,
        "packing_probe": 30,
        "throughput": 110,
        "watch_overhead": 45,
        "memory_plan": 25,
        "sharding": 100,
        "allreduce": 40,
        "flight_recorder": 3,
    }  # measured on a busy 2-core machine, cold caches
    if not ctx.rehearsal and not ctx.cuda and name != "machine":
        return 0
    if not ctx.rehearsal and name == "allreduce" and len(ctx.cuda_devices) < 2:
        return 0
    if not ctx.rehearsal and name == "flight_recorder" and len(ctx.cuda_devices) >= 2:
        return 3  # reads the all-reduce step's loop
    return (cpu if ctx.rehearsal else gpu)[name]


STEPS: list[tuple[str, Callable[[Context], dict[str, Any]]]] = [
    ("machine", steps.machine),
    ("packing_probe", steps.packing_probe),
    ("throughput", steps.throughput),
    ("watch_overhead", steps.watch_overhead),
    ("memory_plan", steps.memory_plan),
    ("sharding", steps.sharding),
    ("allreduce", steps.allreduce),
    ("flight_recorder", steps.flight_recorder),
]
NAMES = [name for name, _ in STEPS]


class Overtime(Exception):
    """The suite's own alarm: the budget is spent and a step is still running."""


def on_alarm(signum, frame):
    raise Overtime("the suite's time budget ran out while this step ran")


# ================================================================ the machine and where results go


def gpu_name_slug(machine: dict[str, Any]) -> str:
    devices = machine.get("nvml", {}).get("devices") or machine.get("torch", {}).get("devices") or []
    if not devices:
        return "no-gpu"
    name = re.sub(r"[^a-z0-9]+", "-", str(devices[0].get("name", "gpu")).lower()).strip("-")
    return f"{len(devices)}x-{name}"


def peak(machine: dict[str, Any], given: float | None) -> tuple[float | None, str]:
    """The GPU's dense bf16 peak in TFLOPS: --peak-tflops, else sftdoctor's table (sftdoctor/plan/speed.py
    PEAK_TFLOPS: NVIDIA's datasheets, dense, no sparsity; e.g. H100 SXM and H200 989, H100 PCIe 756, A100 312,
    L40S 362, A10 125, RTX 4090 165). The A10G (AWS's A10 variant) has no NVIDIA datasheet and is not in it."""
    if given:
        return given, "--peak-tflops"
    from sftdoctor.plan.speed import peak_tflops

    devices = machine.get("torch", {}).get("devices") or machine.get("nvml", {}).get("devices") or []
    if not devices:
        return None, "no GPU"
    name = devices[0].get("name")
    tflops = peak_tflops(name)
    return (tflops, f"sftdoctor's table for {name!r}") if tflops else (None, f"{name!r} is not in sftdoctor's table")


def default_out(rehearsal: bool) -> Path:
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", socket.gethostname())
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M")
    return HERE / f"results-{host}-{stamp}{'-cpu-rehearsal' if rehearsal else ''}.json"


def probe_machine(work: Path, rehearsal: bool, timeout: float) -> dict[str, Any]:
    """children/env_probe.py: torch and its GPUs, sftdoctor's NVML and nvidia-smi probes, flash-attn, liger."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if rehearsal:
        env["CUDA_VISIBLE_DEVICES"] = ""
    try:
        _, out, _ = procs.run(
            [sys.executable, str(HERE / "children" / "env_probe.py")], work / "logs" / "env-probe", timeout, env=env
        )
        return last_json(out)
    except (procs.ChildFailed, ValueError) as exc:
        return {"torch": {"available": False, "why": f"the environment probe failed: {exc}"}, "error": str(exc)}


# ================================================================ running the steps within the budget


def allowance(ctx: Context, index: int, names: list[str], end: float, scale: float) -> tuple[float, float]:
    """(seconds this step may take, what it usually takes, scaled): all that is left, less half of what the
    later steps usually take, and at most three times its own."""
    own = expected_s(ctx, names[index]) * scale
    later = sum(expected_s(ctx, n) for n in names[index + 1 :]) * scale
    left = end - time.monotonic()
    return min(left - 0.5 * later, 3 * own if own else left), own


def run_step(ctx: Context, name: str, func: Callable[[Context], dict[str, Any]], seconds: float) -> dict[str, Any]:
    ctx.deadline = time.monotonic() + seconds
    began = time.monotonic()
    try:
        result = func(ctx)
        status = "skipped" if "skipped" in result else "ok"
        out = {"status": status, **result}
    except procs.ChildFailed as exc:
        out = {"status": "error", "error": exc.line, "output_tail": exc.tail}
    except Overtime as exc:
        out = {"status": "error", "error": str(exc)}
    except Exception as exc:  # a bug or an unexpected output: recorded, the suite goes on
        import traceback

        out = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}"[:400],
            "output_tail": procs.tail(traceback.format_exc(), 12),
        }
    out["seconds"] = round(time.monotonic() - began, 1)
    return out


def run_all(ctx: Context, names: list[str], budget: float, results: dict[str, Any], out: Path) -> None:
    start = time.monotonic()
    end = start + budget
    total = sum(expected_s(ctx, n) for n in names) or 1
    scale = min(1.0, budget / total) if total else 1.0
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(budget + GRACE_S))
    try:
        for index, name in enumerate(names):
            seconds, own = allowance(ctx, index, names, end, scale)
            if time.monotonic() > end or (own and seconds < 0.25 * own):
                results["steps"][name] = {
                    "status": "skipped",
                    "skipped": f"out of time: {max(0, end - time.monotonic()):.0f} s of the "
                    f"budget left, the step usually takes {own / scale:.0f} s",
                }
                continue
            print(
                f"[{time.monotonic() - start:5.0f} s] {name} (up to {seconds:.0f} s) ...", file=sys.stderr, flush=True
            )
            results["steps"][name] = run_step(ctx, name, dict(STEPS)[name], max(seconds, 1.0))
            step = results["steps"][name]
            print(
                f"[{time.monotonic() - start:5.0f} s] {name}: {step['status']}"
                + (f": {step.get('error') or step.get('skipped')}" if step["status"] != "ok" else ""),
                file=sys.stderr,
                flush=True,
            )
            write_results(results, out, start)
    finally:
        signal.alarm(0)
    write_results(results, out, start)


def write_results(results: dict[str, Any], out: Path, start: float) -> None:
    results["elapsed_s"] = round(time.monotonic() - start, 1)
    results["could_not_run"] = could_not_run(results)
    results["children"] = procs.HISTORY
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_suffix(".json.tmp")
    staged.write_text(json.dumps(results, indent=2, default=str) + "\n")
    staged.replace(out)


# ================================================================ the table


def could_not_run(results: dict[str, Any]) -> list[str]:
    lines = []
    for name, step in results["steps"].items():
        if step["status"] == "skipped":
            lines.append(f"{name}: skipped: {step['skipped']}")
        elif step["status"] == "error":
            lines.append(f"{name}: failed: {step['error']}")
        for part, why in (step.get("not_run") or {}).items():
            lines.append(f"{name} / {part}: {why}")
    return lines


def show(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1e6:
            return f"{value:.3e}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) >= 0.01 or value == 0 else f"{value:.2e}"
    return str(value)


def table(results: dict[str, Any]) -> str:
    rows = [("step", "figure", "value")]
    for name, step in results["steps"].items():
        if step["status"] != "ok":
            rows.append((name, step["status"], step.get("skipped") or step.get("error")))
            continue
        figures = step.get("figures") or {}
        rows += [(name, figure, show(value)) for figure, value in figures.items()] or [(name, "-", "no figures")]
        rows.append((name, "seconds", show(step["seconds"])))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows]
    lines.insert(1, "-" * min(120, width[0] + width[1] + 20))
    missing = results.get("could_not_run") or []
    lines += [
        "",
        f"could not run ({len(missing)}):" if missing else "could not run: nothing",
        *(f"  {line}" for line in missing),
    ]
    return "\n".join(lines)


# ================================================================ main


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="sftdoctor's GPU paths on a real GPU, in one command and a few minutes (or rehearsed on a CPU).",
        epilog=f"steps: {', '.join(NAMES)}",
    )
    parser.add_argument(
        "--cpu-rehearsal",
        action="store_true",
        help="every step on the CPU with the tiny example model (the GPUs hidden): CI keeps it working",
    )
    parser.add_argument("--budget-s", type=float, default=480, help="the whole suite's time (default 480)")
    parser.add_argument("--out", type=Path, help="the results JSON (default bench/gpu/results-HOST-DATE.json)")
    parser.add_argument(
        "--fixture-dir",
        type=Path,
        help="where facts.json and check.json go (default tests/fixtures/gpu-machines/COUNTx-GPU-NAME/; "
        "in the rehearsal OUT's name with -fixture)",
    )
    parser.add_argument("--only", help="run only these steps (comma-separated)")
    parser.add_argument(
        "--attn",
        default=",".join(steps.SFTDOCTOR_ATTN),
        help="attention implementations for the packing probe (default: sftdoctor's choices)",
    )
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, when sftdoctor's table lacks it")
    parser.add_argument("--steps", type=int, help="measured training steps (GPU 30, CPU 4)")
    parser.add_argument("--warmup", type=int, help="warm-up steps left out of the rates (GPU 5, CPU 2)")
    parser.add_argument("--batch", type=int, help="per-device micro-batch (GPU 8, CPU 4)")
    parser.add_argument("--max-length", type=int, help="tokens per row (GPU 1024, CPU 128)")
    parser.add_argument("--keep-work", action="store_true", help="keep the temporary folder (configs, runs, logs)")
    args = parser.parse_args(argv)
    if args.only:
        unknown = [n for n in args.only.split(",") if n not in NAMES]
        if unknown:
            parser.error(f"no step {', '.join(unknown)}; steps: {', '.join(NAMES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="sftdoctor-gpu-suite-"))
    machine = probe_machine(work, args.cpu_rehearsal, timeout=min(120, args.budget_s / 4))
    has_gpu = bool(
        machine.get("nvml", {}).get("devices")
        or machine.get("nvidia_smi", {}).get("devices")
        or machine.get("torch", {}).get("devices")
    )
    if not has_gpu and not args.cpu_rehearsal:
        shutil.rmtree(work, ignore_errors=True)
        print(
            "bench/gpu/run.py: no NVIDIA GPU found here; run `python bench/gpu/run.py --cpu-rehearsal` "
            "to rehearse the steps on the CPU",
            file=sys.stderr,
        )
        return 2
    mode = "cpu-rehearsal" if args.cpu_rehearsal else "gpu"
    out = args.out or default_out(args.cpu_rehearsal)
    fixture = args.fixture_dir or (
        out.with_name(out.stem + "-fixture")
        if args.cpu_rehearsal
        else ROOT / "tests" / "fixtures" / "gpu-machines" / gpu_name_slug(machine)
    )
    load = wl.prepare(
        work,
        "tiny" if args.cpu_rehearsal else "qwen2-0.5b",
        {"steps": args.steps, "warmup": args.warmup, "batch": args.batch, "max_length": args.max_length},
    )
    tflops, source = peak(machine, args.peak_tflops) if not args.cpu_rehearsal else (None, "CPU rehearsal: no GPU")
    ctx = Context(mode, work, load, machine, fixture, tflops, source, args.attn.split(","))
    names = args.only.split(",") if args.only else NAMES
    results = {
        "suite": "bench/gpu/run.py",
        "mode": mode,
        "host": socket.gethostname(),
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "budget_s": args.budget_s,
        "workload": load.describe(),
        "machine": machine,
        "peak_tflops": tflops,
        "peak_source": source,
        "steps": {},
    }
    try:
        run_all(ctx, names, args.budget_s - (time.monotonic() - started), results, out)
    finally:
        if args.keep_work:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    write_results(results, out, started)
    print(table(results))
    print(f"\n{mode}: {len(names)} steps in {results['elapsed_s']:.0f} s; results: {out}; fixture: {fixture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
