"""`sftdoctor eval --code PROBLEMS.jsonl`: functional correctness of generated code, as HumanEval scores it
(Chen et al., 2021, "Evaluating Large Language Models Trained on Code"; github.com/openai/human-eval),
every sample run in a sandbox (sandbox.py), never in this process.

Problems are HumanEval lines (task_id, prompt, test, entry_point); completions are lines of task_id and
completion, several per task for several samples. A sample passes when `check(entry_point)` returns after
`prompt + completion` ran and then `test` (compiled on its own, so that a completion cannot swallow it), as
the sandbox's harness sees it: an exit of any kind, whatever its code, is not a pass (human-eval's rule:
the check ran to its end). pass@k is the unbiased estimator 1 - C(n-c, k) / C(n, k) averaged over the
problems. The per-sample results are written as JSONL, one line a row for every reader (ASCII: no U+2028 or
U+0085 inside a row), in a temporary file renamed at the end: whole or not at all.

Memory stays flat in the number of samples and in what they print: the completions file is read twice as a
stream (checked and counted, then run: so it is a regular file, never a pipe), at most a few samples per
worker are in flight, and each keeps only the last RESULT_TAIL bytes of its output.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import signal
import threading
import time
import uuid
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, Interrupted, did_you_mean, one_line, reading, regular_file
from sftdoctor.eval import sandbox as sandboxes
from sftdoctor.facts.json_lines import json_line

PROBLEM_KEYS = ("task_id", "prompt", "test", "entry_point")
COMPLETION_KEYS = ("task_id", "completion")
# Where a HumanEval completion ends: the function body is over when the model starts something else.
STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
RESULT_TAIL = 4096  # bytes of each stream kept per sample (in the results file)
MAX_LINE = 16 << 20  # a longer line is no problem or completion (a .gz inflating to gigabytes, say)
IN_FLIGHT = 2  # samples per worker started ahead of the one being written


def read_problems(path: Path) -> dict[str, dict[str, str]]:
    """task_id -> problem, in the file's order; one InputError naming the line for anything malformed."""
    problems: dict[str, dict[str, str]] = {}
    lines: dict[str, int] = {}
    for number, record in _records(path, "problems file"):
        problem = _fields(record, PROBLEM_KEYS, path, number, "task_id, prompt, test and entry_point (HumanEval)")
        task = problem["task_id"]
        if task in problems:
            raise InputError(
                path,
                f"task_id {task!r} again (first on line {lines[task]}); expected each problem once",
                key=f"line {number}",
            )
        if not problem["entry_point"].isidentifier():
            raise InputError(
                path,
                f"entry_point {problem['entry_point']!r} is not a Python name; expected the "
                "name of the function that check() is called with",
                key=f"line {number}",
            )
        problems[task], lines[task] = problem, number
    if not problems:
        raise InputError(path, "no problems; expected one JSON object per line (task_id, prompt, test, entry_point)")
    return problems


def count_completions(path: Path, problems: dict[str, dict[str, str]]) -> Counter:
    """task_id -> samples, after checking every line (a first pass over the file: nothing is kept)."""
    counts: Counter = Counter()
    for sample in read_completions(path):
        _known(sample, problems, path)
        counts[sample["task_id"]] += 1
    return _complete(counts, problems, path)


def read_completions(path: Path) -> Iterator[dict[str, Any]]:
    """The samples, in the file's order, one at a time: {task_id, completion, line}."""
    for number, record in _records(path, "completions file"):
        yield {**_fields(record, COMPLETION_KEYS, path, number, "task_id and completion"), "line": number}


def count_generated(samples: list[dict[str, Any]], problems: dict[str, dict[str, str]]) -> Counter:
    """The same checks for completions generated here (no file, no lines)."""
    for sample in samples:
        _known(sample, problems, "--model")
    return _complete(Counter(s["task_id"] for s in samples), problems, "--model")


def _known(sample: dict[str, Any], problems: dict[str, dict[str, str]], source: Path | str) -> None:
    if sample["task_id"] not in problems:
        where = f"line {sample['line']}" if sample.get("line") else None
        raise InputError(
            source,
            f"task_id {sample['task_id']!r} is not in the problems"
            f"{did_you_mean(sample['task_id'], problems)}; expected one of their task_ids",
            key=where,
        )


def _complete(counts: Counter, problems: dict[str, dict[str, str]], source: Path | str) -> Counter:
    """At least one sample for every problem (leaving the hard ones out would raise the score)."""
    if not counts:
        raise InputError(source, "no completions; expected one JSON object per line (task_id, completion)")
    missing = [task for task in problems if task not in counts]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(
            source, f"no completion for task_id {missing[0]!r}{more}; expected at least one sample for every problem"
        )
    return counts


def _records(path: Path, what: str) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) of each non-blank line of a .jsonl (or .jsonl.gz) file, read as a stream.
    Lines end at "\\n" only: U+2028 and U+0085 are characters a JSON string may hold raw."""
    with _open(path, what) as stream:
        number = 0
        while True:
            number += 1
            line = _line(stream, path, what, number)
            if line is None:
                return
            if not line.strip():
                continue
            record = json_line(
                line,
                path,
                lambda why: f"not valid JSON ({why}); expected one JSON object per line",
                key=f"line {number}",
            )
            if not isinstance(record, dict):
                raise InputError(
                    path, f"a JSON {type(record).__name__}; expected one JSON object per line", key=f"line {number}"
                )
            yield number, record


def input_file(path: Path, what: str) -> None:
    """InputError unless `path` is a regular file: the completions are read twice (checked and counted, then
    run), which a named pipe cannot give, and /dev/zero never ends. Refused before any sample runs rather than
    read once into memory: memory stays flat in the samples, and `cmd > FILE` makes a pipe a file."""
    with reading(path, what):
        os.stat(path)  # "problems file not found", in the words of the readers below
    regular_file(path, what.removesuffix(" file"))
    if os.path.isdir(path):
        raise InputError(path, f"expected a {what}, got a folder")


@contextlib.contextmanager
def _open(path: Path, what: str):
    input_file(path, what)
    with reading(path, what):
        raw = open(path, "rb")  # noqa: SIM115 - closed below
    with raw:
        yield gzip.GzipFile(fileobj=raw, mode="rb") if str(path).endswith(".gz") else raw  # HumanEval.jsonl.gz


def _line(stream, path: Path, what: str, number: int) -> str | None:
    """The next line (None at the end), at most MAX_LINE bytes, decoded."""
    try:
        data = stream.readline(MAX_LINE + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(
            path, f"cannot read {what}: expected gzip-compressed UTF-8 JSONL ({exc})", key=f"line {number}"
        ) from None
    if not data:
        return None
    if len(data) > MAX_LINE:
        raise InputError(
            path, f"longer than {MAX_LINE >> 20} MiB; expected one JSON object per line", key=f"line {number}"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(path, f"not UTF-8; expected a UTF-8 {what}", key=f"line {number}") from None


def _fields(record: dict, keys: tuple[str, ...], path: Path, number: int, expected: str) -> dict[str, str]:
    for key in keys:
        if key not in record:
            raise InputError(path, f"missing {key!r}; expected {expected}", key=f"line {number}")
        if not isinstance(record[key], str):
            raise InputError(
                path, f"{key!r} is a JSON {type(record[key]).__name__}; expected a string", key=f"line {number}"
            )
        try:
            record[key].encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(
                path,
                f"{key!r} holds {record[key][exc.start]!r}, half of a surrogate pair; "
                "expected text that is valid UTF-8",
                key=f"line {number}",
            ) from None
    return {key: record[key] for key in keys}


def program(problem: dict[str, str], completion: str) -> sandboxes.Program:
    """What HumanEval's execution.py runs for one sample, with the test compiled apart from the sample."""
    return sandboxes.Program(problem["prompt"] + completion + "\n", problem["test"], problem["entry_point"])


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
            raise InputError(
                source,
                f"k={k} but task_id {fewest_task!r} has {fewest} sample"
                f"{'s' if fewest != 1 else ''}; expected at least k samples per task "
                "(more completions, or a smaller --k)",
            )
    return tuple(sorted(set(ks)))


def run_samples(
    problems: dict[str, dict[str, str]],
    samples: Iterable[dict[str, Any]],
    box: sandboxes.Sandbox,
    limits: sandboxes.Limits,
    workers: int,
) -> Iterator[tuple[dict[str, Any], sandboxes.Outcome]]:
    """(sample, outcome) in order, `workers` sandboxes at a time (threads: each only waits on its sandbox's
    pipes), at most IN_FLIGHT per worker ahead of the one the caller is writing. On an error or Ctrl-C the
    running sandboxes are killed (their whole trees) and nothing more starts."""
    cancel = sandboxes.Cancel()
    pending: deque = deque()
    with (
        _signals_cancel(cancel) as check,
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sftdoctor-sandbox") as pool,
    ):
        try:
            for sample in samples:
                check()
                pending.append(
                    (
                        sample,
                        pool.submit(
                            box.run, program(problems[sample["task_id"]], sample["completion"]), limits, cancel
                        ),
                    )
                )
                if len(pending) >= workers * IN_FLIGHT:
                    done, future = pending.popleft()
                    yield done, _outcome(future, check)
            while pending:
                done, future = pending.popleft()
                yield done, _outcome(future, check)
        finally:
            for _, future in pending:
                future.cancel()
            cancel.set()
    cancel.close()


@contextlib.contextmanager
def _signals_cancel(cancel: sandboxes.Cancel):
    """Ctrl-C and SIGTERM kill the running sandboxes at once (the cancel pipe), and the run stops with
    Interrupted where the main thread checks: never inside the thread pool's own bookkeeping, where an
    exception can leave a started worker the pool does not know of, running a sample after the cancel (and
    the interpreter waiting for it at exit). Outside the main thread no handler can be set: as it was."""
    received: list[int] = []

    def check() -> None:
        if received:
            raise Interrupted(received[0])

    if threading.current_thread() is not threading.main_thread():
        yield check
        return

    def note(signum, frame):
        received.append(signum)
        cancel.set()

    before = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield check
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _outcome(future, check) -> sandboxes.Outcome:
    """The sample's outcome, waited for in short slices so that a signal is acted on; never one the cancel cut
    short (checked after it returns)."""
    while True:
        try:
            outcome = future.result(timeout=0.2)
        except FutureTimeout:
            check()
            continue
        check()
        return outcome


def result_row(sample: dict[str, Any], index: int, outcome: sandboxes.Outcome) -> dict[str, Any]:
    return {
        "task_id": sample["task_id"],
        "sample": index,
        "status": outcome.status,
        "passed": outcome.passed,
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "error": outcome.error,
        "wall_s": outcome.wall_s,
        "cpu_s": outcome.cpu_s,
        "memory_peak_bytes": outcome.memory_peak_bytes,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "dropped_bytes": outcome.dropped_bytes,
    }


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
        self.file.write(json.dumps(row) + "\n")  # ASCII: line breaks of other readers (U+2028) escaped

    def __exit__(self, kind, value, traceback) -> None:
        try:
            self.file.close()
            if kind is None:
                os.replace(self.temporary, self.path)
        except OSError as exc:  # a disk that filled, a folder made read-only meanwhile: nothing half-written
            kind = exc
            raise InputError(self.path, f"cannot write the results here: {exc.strerror or exc}", key="--out") from None
        finally:
            if kind is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.temporary)


def _samples(
    table: dict[str, Any], completions: Path | None, generated: list[dict[str, Any]] | None
) -> tuple[Counter, Iterable[dict[str, Any]], Path | str]:
    """How many samples each task has, the samples (streamed from the file, or generated), and where they come
    from."""
    if completions is not None:
        counts = count_completions(completions, table)  # the first pass checks every line; the second streams
        samples = (sample for sample in read_completions(completions) if _known(sample, table, completions) is None)
        return counts, samples, completions
    if generated is not None:
        return count_generated(generated, table), generated, "--model"
    raise InputError("eval", "give --completions FILE, or --model TARGET --samples N")


def _refuse_settings(workers: int, timeout_s: float, sandbox: str) -> None:
    """InputError for a setting the samples cannot run with, or a sandbox this machine cannot give."""
    if workers < 1:
        raise InputError("--workers", f"{workers}; expected at least 1")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise InputError("--timeout", f"{timeout_s}; expected a positive number of seconds")
    why = sandboxes.available(sandbox)
    if why is not None:
        raise InputError(
            "--sandbox", f"{why}; generated code only ever runs in a sandbox (there is no unsandboxed mode)"
        )


def evaluate_code(
    problems: Path,
    completions: Path | None,
    *,
    out: Path,
    ks: tuple[int, ...],
    sandbox: str,
    workers: int,
    timeout_s: float,
    json_out: bool,
    generated: list[dict[str, Any]] | None = None,
) -> int:
    """Score the completions (a file, or `generated` by generate_completions) of the problems in a sandbox.

    Prints the summary (a table, or one JSON document), writes one result per sample to `out`. ks=() reports
    pass@1 and pass@n (n: the fewest samples of any task). Raises InputError on bad input and when the
    sandbox cannot run here (the CLI exits 2). Exit code 0: evaluated; 1: some samples could not be run
    (status error: the sandbox failed, not the program), so the scores are incomplete."""
    table = read_problems(problems)
    counts, samples, source = _samples(table, completions, generated)
    ks = choose_ks(tuple(ks), counts, source)
    _refuse_settings(workers, timeout_s, sandbox)
    box = sandboxes.sandbox(sandbox)
    limits = sandboxes.Limits(wall_s=timeout_s, cpu_s=max(1, math.ceil(timeout_s)), output_bytes=RESULT_TAIL)
    start = time.monotonic()
    statuses: Counter = Counter()
    passed: Counter = Counter()
    seen: Counter = Counter()
    outcomes = run_samples(table, samples, box, limits, workers)
    with JsonlWriter(out) as writer, contextlib.closing(outcomes):
        for sample, outcome in outcomes:
            writer.write(result_row(sample, seen[sample["task_id"]], outcome))
            seen[sample["task_id"]] += 1
            statuses[outcome.status] += 1
            passed[sample["task_id"]] += outcome.passed
        if seen != counts:  # read twice: the scores need the same samples both times
            raise InputError(source, "changed while it was read; expected a file that stays as it is")
    per_task = {task: (counts[task], passed[task]) for task in table}
    summary = {
        "problems": len(table),
        "samples": sum(counts.values()),
        "sandbox": sandbox,
        "isolation": box.isolation(),
        "workers": workers,
        "timeout_s": timeout_s,
        "seconds": round(time.monotonic() - start, 3),
        **pass_at_ks(per_task, ks),
        "statuses": {s: statuses[s] for s in sandboxes.STATUSES},
        "tasks": {task: {"samples": n, "passed": c} for task, (n, c) in per_task.items()},
        "results": str(out),
    }
    print(json.dumps(summary, indent=2) if json_out else render(summary, ks))
    return 1 if statuses["error"] else 0


def render(summary: dict[str, Any], ks: tuple[int, ...]) -> str:
    rows = [(f"pass@{k}", f"{summary[f'pass@{k}']:.3f}") for k in ks]
    rows += [(status, str(summary["statuses"][status])) for status in sandboxes.STATUSES]
    width = max(len(name) for name, _ in rows)
    head = (
        f"code: {summary['problems']} problems, {summary['samples']} samples, {summary['sandbox']} sandbox, "
        f"{summary['workers']} workers, {summary['seconds']:.1f} s"
    )
    lines = [head, f"  {summary['isolation']}"] + [f"  {name.ljust(width)}  {value:>7}" for name, value in rows]
    if summary["statuses"]["error"]:
        lines.append("some samples could not be run (status error in the results): the scores are incomplete")
    return "\n".join(lines + [f"results: {one_line(summary['results'])}"])


def truncate(completion: str) -> str:
    """The completion up to the first stop sequence (HumanEval's: the function is over)."""
    cut = min((i for i in (completion.find(s) for s in STOP) if i != -1), default=len(completion))
    return completion[:cut]


def generate_completions(
    model, tokenizer, problems, samples: int, max_new_tokens: int = 512, temperature: float = 0.8, batch_size: int = 16
) -> list[dict[str, str]]:
    """`samples` completions per problem from a loaded transformers model: the prompt fed raw (no chat
    template), nucleus sampling (top_p 0.95, as in the paper) at `temperature`, greedy at 0; each cut at
    the first stop sequence."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sampling = temperature > 0
    options = {
        "max_new_tokens": max_new_tokens,
        "do_sample": sampling,
        "pad_token_id": pad,
        "stop_strings": list(STOP),
        "tokenizer": tokenizer,
    }
    if sampling:
        options.update(temperature=temperature, top_p=0.95)
    records = []
    for problem in problems.values() if isinstance(problems, dict) else problems:
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
                text = (
                    text[len(prompt_text) :]
                    if text.startswith(prompt_text)
                    else tokenizer.decode(row[width:], skip_special_tokens=True)
                )
                completions.append(truncate(text))
        completions *= 1 if sampling else samples
        records += [{"task_id": problem["task_id"], "completion": text} for text in completions]
    return records


def write_completions(path: Path, records: list[dict[str, str]]) -> None:
    """Generated completions as a completions file (task_id, completion), so a score can be re-checked."""
    with JsonlWriter(path) as writer:
        for record in records:
            writer.write({"task_id": record["task_id"], "completion": record["completion"]})
