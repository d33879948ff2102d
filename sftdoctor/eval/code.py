"""`sftdoctor eval --code PROBLEMS.jsonl`: functional correctness of generated code, as HumanEval scores it
(Chen et al., 2021, "Evaluating Large Language Models Trained on Code"; github.com/openai/human-eval),
every sample run in a sandbox (sandbox.py), never in this process.

Problems are HumanEval lines (task_id, prompt, test, entry_point); completions are lines of task_id and
completion, several per task for several samples. A sample passes when the program

    prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})\\n"

exits 0. pass@k is the unbiased estimator 1 - C(n-c, k) / C(n, k) averaged over the problems. The
per-sample results are written as JSONL (a temporary file renamed at the end: whole or not at all).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, did_you_mean, one_line, parse_problem, read_text
from sftdoctor.eval import sandbox as sandboxes

PROBLEM_KEYS = ("task_id", "prompt", "test", "entry_point")
COMPLETION_KEYS = ("task_id", "completion")
# Where a HumanEval completion ends: the function body is over when the model starts something else.
STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
RESULT_TAIL = 4096  # characters of each stream kept per sample in the results file


def read_problems(path: Path) -> dict[str, dict[str, str]]:
    """task_id -> problem, in the file's order; one InputError naming the line for anything malformed."""
    problems: dict[str, dict[str, str]] = {}
    lines: dict[str, int] = {}
    for number, record in _records(path, "problems file"):
        problem = _fields(record, PROBLEM_KEYS, path, number, "task_id, prompt, test and entry_point (HumanEval)")
        task = problem["task_id"]
        if task in problems:
            raise InputError(path, f"task_id {task!r} again (first on line {lines[task]}); expected each problem "
                                   "once", key=f"line {number}")
        if not problem["entry_point"].isidentifier():
            raise InputError(path, f"entry_point {problem['entry_point']!r} is not a Python name; expected the "
                                   "name of the function that check() is called with", key=f"line {number}")
        problems[task], lines[task] = problem, number
    if not problems:
        raise InputError(path, "no problems; expected one JSON object per line (task_id, prompt, test, entry_point)")
    return problems


def read_completions(path: Path, problems: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The samples, in the file's order: {task_id, completion, line}."""
    samples = [{**_fields(record, COMPLETION_KEYS, path, number, "task_id and completion"), "line": number}
               for number, record in _records(path, "completions file")]
    return check_completions(samples, problems, path)


def check_completions(samples: list[dict[str, Any]], problems: dict[str, dict[str, str]],
                      source: Path | str) -> list[dict[str, Any]]:
    """Every sample for a known problem, and at least one sample for every problem (leaving the hard ones
    out would raise the score)."""
    if not samples:
        raise InputError(source, "no completions; expected one JSON object per line (task_id, completion)")
    for sample in samples:
        if sample["task_id"] not in problems:
            where = f"line {sample['line']}" if sample.get("line") else None
            raise InputError(source, f"task_id {sample['task_id']!r} is not in the problems"
                                     f"{did_you_mean(sample['task_id'], problems)}; expected one of their task_ids",
                             key=where)
    counts = Counter(s["task_id"] for s in samples)
    missing = [task for task in problems if task not in counts]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(source, f"no completion for task_id {missing[0]!r}{more}; expected at least one sample "
                                 "for every problem")
    return samples


def _records(path: Path, what: str) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) of each non-blank line of a .jsonl (or .jsonl.gz) file."""
    for number, line in enumerate(_text(path, what).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InputError(path, f"not valid JSON ({parse_problem(exc)}); expected one JSON object per line",
                             key=f"line {number}") from None
        if not isinstance(record, dict):
            raise InputError(path, f"a JSON {type(record).__name__}; expected one JSON object per line",
                             key=f"line {number}")
        yield number, record


def _text(path: Path, what: str) -> str:
    if str(path).endswith(".gz"):  # HumanEval ships HumanEval.jsonl.gz
        try:
            return gzip.decompress(Path(path).read_bytes()).decode("utf-8")
        except FileNotFoundError:
            raise InputError(path, f"{what} not found") from None
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise InputError(path, f"cannot read {what}: expected gzip-compressed UTF-8 JSONL ({exc})") from None
    return read_text(path, what)


def _fields(record: dict, keys: tuple[str, ...], path: Path, number: int, expected: str) -> dict[str, str]:
    for key in keys:
        if key not in record:
            raise InputError(path, f"missing {key!r}; expected {expected}", key=f"line {number}")
        if not isinstance(record[key], str):
            raise InputError(path, f"{key!r} is a JSON {type(record[key]).__name__}; expected a string",
                             key=f"line {number}")
    return {key: record[key] for key in keys}


def program(problem: dict[str, str], completion: str) -> str:
    """What HumanEval's execution.py runs for one sample."""
    return (problem["prompt"] + completion + "\n" + problem["test"] + "\n"
            + f"check({problem['entry_point']})\n")


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) without the large binomials: the product form of the paper's numpy snippet."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_ks(counts: dict[str, tuple[int, int]], ks: Iterable[int]) -> dict[str, float]:
    """{"pass@k": the mean over problems} from task -> (samples, passed)."""
    return {f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts.values()) / len(counts) for k in ks}


def choose_ks(ks: tuple[int, ...], samples: Counter, source: Path | str) -> tuple[int, ...]:
    """The k to report: as asked (each at most the samples of every task), or by default 1 and n."""
    fewest_task, fewest = min(samples.items(), key=lambda item: item[1])
    if not ks:
        return (1,) if fewest == 1 else (1, fewest)
    for k in ks:
        if k < 1:
            raise InputError("--k", f"k={k}; expected a positive number of samples")
        if k > fewest:
            raise InputError(source, f"k={k} but task_id {fewest_task!r} has {fewest} sample"
                                     f"{'s' if fewest != 1 else ''}; expected at least k samples per task "
                                     "(more completions, or a smaller --k)")
    return tuple(sorted(set(ks)))


def run_samples(problems: dict[str, dict[str, str]], samples: list[dict[str, Any]], box: sandboxes.Sandbox,
                limits: sandboxes.Limits, workers: int) -> Iterator[sandboxes.Outcome]:
    """The outcome of each sample, in order, `workers` sandboxes at a time (threads: each only waits on its
    sandbox's pipes)."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sftdoctor-sandbox") as pool:
        futures = [pool.submit(box.run, program(problems[s["task_id"]], s["completion"]), limits) for s in samples]
        try:
            for future in futures:
                yield future.result()
        finally:  # an error or Ctrl-C: start nothing more (the running ones end within their limits)
            for future in futures:
                future.cancel()


def result_row(sample: dict[str, Any], index: int, outcome: sandboxes.Outcome) -> dict[str, Any]:
    return {"task_id": sample["task_id"], "sample": index, "status": outcome.status, "passed": outcome.passed,
            "exit_code": outcome.exit_code, "signal": outcome.signal, "error": outcome.error,
            "wall_s": outcome.wall_s, "stdout": outcome.stdout[-RESULT_TAIL:],
            "stderr": outcome.stderr[-RESULT_TAIL:], "dropped_bytes": outcome.dropped_bytes}


class JsonlWriter:
    """JSONL into a temporary file beside `path`, renamed onto it on success; removed on any error or Ctrl-C."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.temporary = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # os.open, not NamedTemporaryFile: the file gets the umask's permissions, not 0600
            fd = os.open(self.temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            self.file = open(fd, "w", encoding="utf-8")  # noqa: SIM115 - closed (and renamed) in __exit__
        except OSError as exc:
            raise InputError(path, f"cannot write the results here: {exc.strerror or exc}", key="--out") from None

    def __enter__(self):
        return self

    def write(self, row: dict[str, Any]) -> None:
        self.file.write(json.dumps(row, ensure_ascii=False) + "\n")

    def __exit__(self, kind, value, traceback) -> None:
        self.file.close()
        if kind is None:
            os.replace(self.temporary, self.path)
        else:
            os.unlink(self.temporary)


def evaluate_code(problems: Path, completions: Path | None, *, out: Path, ks: tuple[int, ...], sandbox: str,
                  workers: int, timeout_s: float, json_out: bool,
                  generated: list[dict[str, Any]] | None = None) -> int:
    """Score the completions (a file, or `generated` by generate_completions) of the problems in a sandbox.

    Prints the summary (a table, or one JSON document), writes one result per sample to `out`. ks=() reports
    pass@1 and pass@n (n: the fewest samples of any task). Raises InputError on bad input and when the
    sandbox cannot run here (the CLI exits 2). Exit code 0: evaluated; 1: some samples could not be run
    (status error: the sandbox failed, not the program), so the scores are incomplete."""
    table = read_problems(problems)
    if completions is not None:
        samples = read_completions(completions, table)
        source: Path | str = completions
    elif generated is not None:
        samples, source = check_completions(list(generated), table, "--model"), "--model"
    else:
        raise InputError("eval", "give --completions FILE, or --model TARGET --samples N")
    counts = Counter(s["task_id"] for s in samples)
    ks = choose_ks(tuple(ks), counts, source)
    if workers < 1:
        raise InputError("--workers", f"{workers}; expected at least 1")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise InputError("--timeout", f"{timeout_s}; expected a positive number of seconds")
    why = sandboxes.available(sandbox)
    if why is not None:
        raise InputError("--sandbox", f"{why}; generated code only ever runs in a sandbox (there is no "
                                      "unsandboxed mode)")
    limits = sandboxes.Limits(wall_s=timeout_s, cpu_s=max(1, math.ceil(timeout_s)))
    start = time.monotonic()
    statuses: Counter = Counter()
    passed: Counter = Counter()
    seen: Counter = Counter()
    outcomes = run_samples(table, samples, sandboxes.sandbox(sandbox), limits, workers)
    with JsonlWriter(out) as writer, contextlib.closing(outcomes):
        for sample, outcome in zip(samples, outcomes):
            writer.write(result_row(sample, seen[sample["task_id"]], outcome))
            seen[sample["task_id"]] += 1
            statuses[outcome.status] += 1
            passed[sample["task_id"]] += outcome.passed
    per_task = {task: (counts[task], passed[task]) for task in table}
    summary = {"problems": len(table), "samples": len(samples), "sandbox": sandbox, "workers": workers,
               "timeout_s": timeout_s, "seconds": round(time.monotonic() - start, 3),
               **pass_at_ks(per_task, ks), "statuses": {s: statuses[s] for s in sandboxes.STATUSES},
               "tasks": {task: {"samples": n, "passed": c} for task, (n, c) in per_task.items()},
               "results": str(out)}
    print(json.dumps(summary, indent=2) if json_out else render(summary, ks))
    return 1 if statuses["error"] else 0


def render(summary: dict[str, Any], ks: tuple[int, ...]) -> str:
    rows = [(f"pass@{k}", f"{summary[f'pass@{k}']:.3f}") for k in ks]
    rows += [(status, str(summary["statuses"][status])) for status in sandboxes.STATUSES]
    width = max(len(name) for name, _ in rows)
    head = (f"code: {summary['problems']} problems, {summary['samples']} samples, {summary['sandbox']} sandbox, "
            f"{summary['workers']} workers, {summary['seconds']:.1f} s")
    lines = [head] + [f"  {name.ljust(width)}  {value:>7}" for name, value in rows]
    if summary["statuses"]["error"]:
        lines.append("some samples could not be run (status error in the results): the scores are incomplete")
    return "\n".join(lines + [f"results: {one_line(summary['results'])}"])


def truncate(completion: str) -> str:
    """The completion up to the first stop sequence (HumanEval's: the function is over)."""
    cut = min((i for i in (completion.find(s) for s in STOP) if i != -1), default=len(completion))
    return completion[:cut]


def generate_completions(model, tokenizer, problems, samples: int, max_new_tokens: int = 512,
                         temperature: float = 0.8, batch_size: int = 16) -> list[dict[str, str]]:
    """`samples` completions per problem from a loaded transformers model: the prompt fed raw (no chat
    template), nucleus sampling (top_p 0.95, as in the paper) at `temperature`, greedy at 0; each cut at
    the first stop sequence."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sampling = temperature > 0
    options = {"max_new_tokens": max_new_tokens, "do_sample": sampling, "pad_token_id": pad,
               "stop_strings": list(STOP), "tokenizer": tokenizer}
    if sampling:
        options.update(temperature=temperature, top_p=0.95)
    records = []
    for problem in (problems.values() if isinstance(problems, dict) else problems):
        encoded = tokenizer(problem["prompt"], return_tensors="pt").to(device)
        prompt_text = tokenizer.decode(encoded["input_ids"][0], skip_special_tokens=True)
        width = encoded["input_ids"].shape[1]
        completions: list[str] = []
        while len(completions) < (samples if sampling else 1):  # greedy: one generation, repeated
            n = min(samples - len(completions), batch_size) if sampling else 1
            with torch.no_grad():
                output = model.generate(**encoded, num_return_sequences=n, **options)
            for row in output:
                text = tokenizer.decode(row, skip_special_tokens=True)
                # Decoding the whole sequence keeps a leading space a tokenizer merges into the first new token.
                text = text[len(prompt_text):] if text.startswith(prompt_text) else tokenizer.decode(
                    row[width:], skip_special_tokens=True)
                completions.append(truncate(text))
        completions *= 1 if sampling else samples
        records += [{"task_id": problem["task_id"], "completion": text} for text in completions]
    return records


def write_completions(path: Path, records: list[dict[str, str]]) -> None:
    """Generated completions as a completions file (task_id, completion), so a score can be re-checked."""
    with JsonlWriter(path) as writer:
        for record in records:
            writer.write({"task_id": record["task_id"], "completion": record["completion"]})
