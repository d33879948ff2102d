"""Sandboxed executions per second (`sftdoctor eval --code`'s bubblewrap sandbox) against the same programs
run in plain subprocesses, in the same run.

    python bench/sandbox_overhead.py [--runs 200] [--workers 1 2] [--repeats 3]

The programs are built from the test fixtures (tests/fixtures/code): prompt + completion + test + check()
for each problem's canonical solution and the wrong completions (trusted code only: the plain mode has no
sandbox), cycled to --runs executions. "plain" is `python3 -I -S -c PROGRAM` with the sandbox's own
interpreter and flags, so the ratio is the cost of the sandbox alone (namespaces, mounts, the seccomp
filter, the sample's cgroup, the harness's setup and its pass token, output capping). Each worker count is
timed --repeats times, plain and sandboxed interleaved; the table shows the best of each. Also checks that
both modes agree on which samples pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sftdoctor.eval import code, sandbox  # noqa: E402 - once sys.path holds the checkout

FIXTURES = ROOT / "tests" / "fixtures" / "code"


def programs(runs: int) -> list[sandbox.Program]:
    """Trusted programs only, since the plain mode has no sandbox: each problem's canonical solution and the
    fixtures' wrong completions, not the one that reaches for the network."""
    problems = code.read_problems(FIXTURES / "problems.jsonl")
    canonical = {
        json.loads(line)["task_id"]: json.loads(line)["canonical_solution"]
        for line in (FIXTURES / "problems.jsonl").read_text().splitlines()
    }
    samples = [{"task_id": t, "completion": c} for t, c in canonical.items()]
    samples += [
        s
        for s in code.read_completions(FIXTURES / "completions.jsonl")
        if "import" not in s["completion"] and s["completion"] != canonical[s["task_id"]]
    ]
    every = [code.program(problems[s["task_id"]], s["completion"]) for s in samples]
    return [every[i % len(every)] for i in range(runs)]


def plain(python: str, program: sandbox.Program, limits: sandbox.Limits) -> bool:
    """HumanEval's own way: the concatenated program, passed when it exits 0."""
    source = f"{program.source}\n{program.test}\ncheck({program.entry_point})\n"
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c", source],
            capture_output=True,
            timeout=limits.wall_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def timed(run, sources: list[str], workers: int) -> tuple[float, list[bool]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        passed = list(pool.map(run, sources))
    return time.perf_counter() - start, passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="executions per measurement")
    parser.add_argument("--workers", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    why = sandbox.available("bubblewrap")
    if why is not None:
        sys.exit(f"no sandbox: {why}")
    box, limits = sandbox.Bubblewrap(), sandbox.Limits(wall_s=10)
    python = os.path.realpath(box.python)
    sources = programs(args.runs)
    modes = {"plain": lambda s: plain(python, s, limits), "bubblewrap": lambda s: box.run(s, limits).passed}
    timed(modes["bubblewrap"], sources[:4], 1)  # warm the page cache for both alike
    rows = []
    for workers in args.workers:
        best = {name: float("inf") for name in modes}
        verdicts = {}
        for _ in range(args.repeats):
            for name, run in modes.items():
                seconds, verdicts[name] = timed(run, sources, workers)
                best[name] = min(best[name], seconds)
        if verdicts["plain"] != verdicts["bubblewrap"]:
            sys.exit(f"the modes disagree on which samples pass (workers {workers})")
        rows.append((workers, best["plain"], best["bubblewrap"], sum(verdicts["plain"])))
    print(f"{args.runs} executions of {len(set(sources))} programs, interpreter {python}; best of {args.repeats}")
    print(
        f"{'workers':>7}  {'plain exec/s':>12}  {'sandboxed exec/s':>16}  "
        f"{'ratio sandboxed/plain':>21}  {'ms added per exec':>17}"
    )
    for workers, plain_s, boxed_s, _passed in rows:
        print(
            f"{workers:>7}  {args.runs / plain_s:>12.1f}  {args.runs / boxed_s:>16.1f}  {plain_s / boxed_s:>21.3f}  "
            f"{(boxed_s - plain_s) / args.runs * workers * 1000:>17.1f}"
        )
    print(f"both modes agree: {rows[-1][3]} of {args.runs} pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
