"""`sftdoctor eval TARGET --tasks ...`: the target (and with --base, its base) on lm-eval tasks, side by side
with the difference and the standard errors; the result written as JSON next to the model (RUN_DIR/eval.json
for a run, with a line in its findings.jsonl)."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, Interrupted, interruptible, parse_problem, read_text
from sftdoctor.eval.outputs import check_output, folder_files
from sftdoctor.eval.target import Target, resolve_target
from sftdoctor.files import write_atomic


def run_eval(
    target: str,
    tasks: list[str],
    *,
    base: str | None,
    include: Path | None,
    limit: int | None,
    num_fewshot: int | None,
    batch_size: str,
    json_out: bool,
    out: Path | None,
    compare: Path | None,
) -> int:
    from sftdoctor.eval import harness

    wanted = resolve_target(target)
    against = resolve_target(base, "--base") if base else None
    previous = read_result(compare) if compare else None
    if previous is not None:
        comparable_settings(previous, compare, limit=limit, num_fewshot=num_fewshot)
    if include is not None and not include.is_dir():
        raise InputError(include, "not a folder of lm-eval task YAMLs", key="--include")
    path = check_output(
        out or default_output(wanted), "--out", result_inputs([wanted, against], include, compare), "the result"
    )
    if wanted.run_dir is not None:  # the result is also a line of the run's findings.jsonl (a pipe there blocks)
        check_output(wanted.run_dir / "findings.jsonl", "TARGET", [], "the run's findings")
    manager = harness.task_manager(tasks, include.resolve() if include else None)  # before any model loads
    device_ = device()
    common = {
        "include": include.resolve() if include else None,
        "num_fewshot": num_fewshot,
        "limit": limit,
        "batch_size": _batch(batch_size, device_),
        "device": device_,
    }
    doc: dict[str, Any] = {
        "time": time.time(),
        "target": wanted.to_json(),
        **_evaluated(wanted, tasks, manager, common),
    }
    if against is not None:
        doc["base"] = {"target": against.to_json(), **_evaluated(against, tasks, manager, common)}
    if previous is not None:
        doc["compared"] = _compared(previous, doc, compare)
    write_json(path, doc)
    if wanted.run_dir is not None:
        _record(wanted.run_dir, doc)
    print(json.dumps(doc, indent=2, default=float) if json_out else "\n" + table(doc) + f"\nresults: {path}")
    return 0


def _batch(batch_size: str, device_: str) -> int | str:
    """--batch-size as lm-eval takes it: "auto" on a GPU and 8 on a CPU by default."""
    if batch_size == "default":
        return "auto" if device_ == "cuda" else 8
    return batch_size if batch_size == "auto" else int(batch_size)


def _compared(previous: dict[str, Any], doc: dict[str, Any], compare: Path) -> dict[str, Any]:
    """The earlier result's metrics, beside this one's; InputError when its settings differ."""
    from sftdoctor.eval import harness

    problems = harness.differences(previous["settings"], doc["settings"])
    if problems:
        raise InputError(
            compare,
            "evaluated with other settings, so the numbers do not compare: " + "; ".join(problems),
            key="--compare",
        )
    return {"file": str(compare), "metrics": previous["metrics"]}


def _evaluated(target: Target, tasks: list[str], manager, common: dict[str, Any]) -> dict[str, Any]:
    from sftdoctor.eval import harness
    from sftdoctor.eval.target import load

    began = time.perf_counter()
    print(f"sftdoctor: evaluating {target.given} ({target.kind}) on {', '.join(tasks)}", flush=True)
    model, tokenizer = load(target, common["device"])
    result = harness.evaluate(model, tokenizer, tasks, manager, **common)
    print(f"sftdoctor: {target.given} done in {time.perf_counter() - began:.0f} s", flush=True)
    return result


@contextlib.contextmanager
def quiet():
    """One line per model instead of lm-eval's, datasets' and transformers' notices and progress bars (an
    instantiated model passed to HFLM is the documented way, and lm-eval warns about it every time; its own
    bars are off in harness.QuietHFLM). Everything is put back after, for a caller in the same process."""
    import logging

    import datasets
    import transformers

    loggers = [logging.getLogger(name) for name in ("lm_eval", "datasets", "transformers")]
    before = [logger.level for logger in loggers]
    bars = datasets.is_progress_bar_enabled(), transformers.utils.logging.is_progress_bar_enabled()
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        for logger, level in zip(loggers, before):
            logger.setLevel(level)
        if bars[0]:
            datasets.enable_progress_bars()
        if bars[1]:
            transformers.utils.logging.enable_progress_bar()


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def read_result(path: Path, option: str = "--compare", settings: bool = True) -> dict[str, Any]:
    """A result written by `sftdoctor eval`, its types checked (a score is a number, its standard error a
    number or null), or one InputError naming the file, the key and what was expected. `settings`: it must
    hold them too (to compare with; a sweep's objective reads the metrics only)."""
    what = f"result of sftdoctor eval (given to {option})"
    try:
        doc = json.loads(read_text(path, what))
    except (ValueError, RecursionError) as exc:
        raise InputError(path, f"not JSON ({parse_problem(exc)}); expected a {what}") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("metrics"), dict)
        or (settings and not isinstance(doc.get("settings"), dict))
    ):
        raise InputError(path, "not a result written by sftdoctor eval (no settings and metrics)", key=option)
    for task, metrics in doc["metrics"].items():
        if not isinstance(metrics, dict):
            raise InputError(path, f"a JSON {_kind(metrics)}; expected an object of metrics", key=f"metrics.{task}")
        for metric, value in metrics.items():
            where = f"metrics.{task}.{metric}"
            if not isinstance(value, dict):
                raise InputError(path, f"a JSON {_kind(value)}; expected an object with value and stderr", key=where)
            _score(value, "value", path, where)
            if value.get("stderr") is not None:
                _score(value, "stderr", path, where)
    return doc


def _score(value: dict, field: str, path: Path, where: str) -> None:
    if field not in value:
        raise InputError(path, "missing; expected a number", key=f"{where}.{field}")
    if not _is_number(value[field]):
        raise InputError(path, f"a JSON {_kind(value[field])}; expected a number", key=f"{where}.{field}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value) -> str:
    return {bool: "bool", str: "string", list: "list", dict: "object", type(None): "null"}.get(type(value), "number")


def comparable_settings(previous: dict[str, Any], path: Path, *, limit: int | None, num_fewshot: int | None) -> None:
    """The settings known before any model loads, compared with the earlier result's: a mismatch is refused
    now, not after the evaluation (the task versions and generation settings are compared after it)."""
    settings = previous["settings"]
    problems = [
        f"{key}: {settings.get(key)!r} vs {value!r}"
        for key, value in (("num_fewshot", num_fewshot), ("limit", limit), ("apply_chat_template", False))
        if settings.get(key) != value
    ]
    if problems:
        raise InputError(
            path,
            "evaluated with other settings, so the numbers do not compare: " + "; ".join(problems),
            key="--compare",
        )


def default_output(target: Target) -> Path:
    if target.run_dir is not None:
        return target.run_dir / "eval.json"
    if target.kind == "hub":
        return Path(f"eval-{target.path.replace('/', '--')}.json")
    return Path(target.path) / "eval.json"


def result_inputs(targets: list[Target | None], include: Path | None, compare: Path | None) -> list[tuple[str, Path]]:
    """The files `eval` reads, which its --out must not name: the earlier result, the task folder's files, and
    the files of every model, tokenizer and run directory it loads (all but earlier results, eval*.json)."""
    found = [("--compare result", compare)] if compare else []
    if include is not None:
        found += [("--include task file", p) for p in itertools.islice(include.rglob("*"), 10_000) if p.is_file()]
    for target in filter(None, targets):
        for folder in {target.path, target.tokenizer, target.base, target.run_dir}:
            found += [
                (f"model file of {target.given}", p)
                for p in folder_files(folder, lambda name: not (name.startswith("eval") and name.endswith(".json")))
            ]
    return found


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=2, default=float))


def _record(run_dir: Path, doc: dict[str, Any]) -> None:
    """The result as one line of the run's findings.jsonl, beside its preflight and runtime findings."""
    line = {
        "phase": "eval",
        "id": "eval",
        "severity": "info",
        "time": doc["time"],
        "title": headline(doc),
        "evidence": {"metrics": doc["metrics"], "base": (doc.get("base") or {}).get("metrics")},
    }
    with open(run_dir / "findings.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(line, default=float) + "\n")


def rows(doc: dict[str, Any]) -> list[tuple[str, str, dict, dict | None]]:
    """(task, metric, the target's value, the base's or the compared result's value)."""
    other = (doc.get("base") or doc.get("compared") or {}).get("metrics") or {}
    return [
        (task, metric, value, (other.get(task) or {}).get(metric))
        for task, metrics in sorted(doc["metrics"].items())
        for metric, value in sorted(metrics.items())
    ]


def difference(value: dict, other: dict | None) -> str:
    """The model's value less the other's, or why there is none: a NaN or infinite score is not a number to
    compare, so it is never shown as better, worse or the same."""
    if other is None:
        return "-"
    if not (math.isfinite(value["value"]) and math.isfinite(other["value"])):
        return "not compared"
    return f"{value['value'] - other['value']:+.3f}"


def headline(doc: dict[str, Any]) -> str:
    parts = []
    for task, metric, value, other in rows(doc):
        text = f"{task} {metric} {value['value']:.3f}"
        if other:
            text += f" (base {other['value']:.3f}, {difference(value, other)})"
        parts.append(text)
    return "eval: " + "; ".join(parts)


def _cell(value: dict | None) -> str:
    if value is None:
        return "-"
    stderr = f" ±{value['stderr']:.3f}" if value.get("stderr") is not None else ""
    return f"{value['value']:.3f}{stderr}"


def table(doc: dict[str, Any]) -> str:
    label = "base" if "base" in doc else "compared" if "compared" in doc else None
    header = ["task", "metric"] + ([label] if label else []) + ["model"] + (["difference"] if label else [])
    lines, unjudged = [header], []
    for task, metric, value, other in rows(doc):
        row = [task, metric] + ([_cell(other)] if label else []) + [_cell(value)]
        if label:
            row.append(difference(value, other))
            if row[-1] == "not compared":
                unjudged.append(f"{task} {metric}")
        lines.append(row)
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    settings = doc["settings"]
    shots = "default" if settings["num_fewshot"] is None else settings["num_fewshot"]
    note = (
        f"lm-eval {settings['lm_eval']}; few-shot {shots}; limit {settings['limit'] or 'none'}; "
        f"± is lm-eval's standard error"
    )
    if unjudged:
        note += (
            f"\nnot compared: {', '.join(unjudged)}: a value is not a number (nan or inf), so no difference "
            "can be judged"
        )
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines) + "\n" + note


def run_code_eval(
    problems: Path,
    completions: Path | None,
    model: str | None,
    *,
    samples: int,
    ks: tuple[int, ...],
    sandbox: str,
    workers: int,
    timeout_s: float,
    max_new_tokens: int,
    temperature: float,
    out: Path | None,
    json_out: bool,
) -> int:
    """`sftdoctor eval --code`: the samples (given, or generated by `model`) scored in the sandbox. Bad input
    and a missing sandbox are found before any model loads."""
    from sftdoctor.eval import code
    from sftdoctor.eval import sandbox as sandboxes
    from sftdoctor.eval.target import load

    if (completions is None) == (model is None):
        raise InputError("eval", "with --code give --completions FILE, or --model TARGET --samples N")
    out, written = code_outputs(problems, completions, out, generate=model is not None)
    generated = None
    if model is not None:
        table_ = code.read_problems(problems)
        target = resolve_target(model, "--model")
        why = sandboxes.available(sandbox)
        if why is not None:
            raise InputError("--sandbox", f"{why}; generated code only ever runs in a sandbox")
        loaded, tokenizer = load(target, device())
        generated = code.generate_completions(loaded, tokenizer, table_, samples, max_new_tokens, temperature)
        code.write_completions(written, generated)
    return code.evaluate_code(
        problems,
        completions,
        out=out,
        ks=ks,
        sandbox=sandbox,
        workers=workers,
        timeout_s=timeout_s,
        json_out=json_out,
        generated=generated,
    )


def code_outputs(
    problems: Path, completions: Path | None, out: Path | None, *, generate: bool
) -> tuple[Path, Path | None]:
    """(the results file, the file the generated completions go to): each refused before any sample or model
    when it names an input (the problems, the completions), the other output, a folder or a pipe."""
    from sftdoctor.eval import code

    code.input_file(problems, "problems file")
    if completions is not None:
        code.input_file(completions, "completions file")
    named = completions if completions is not None else Path("code-completions.jsonl")
    out = out or named.with_name(named.name.removesuffix(".jsonl") + "_results.jsonl")
    inputs = [("problems file", problems)] + ([("completions file", completions)] if completions else [])
    check_output(out, "--out", inputs, "the results")
    if not generate:
        return out, None
    stem = out.name.removesuffix(".jsonl")
    written = out.with_name(
        (stem.replace("_results", "_completions") if "_results" in stem else stem + "_completions") + ".jsonl"
    )
    check_output(written, "--out", inputs + [("results file", out)], "the generated completions")
    return out, written


def names(value: str | None) -> list[str]:
    """A comma-separated option (--tasks, --k) as its items."""
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def main(target: str | None = None, tasks: str | None = None, *, code_problems: Path | None = None, **options) -> int:
    """lm-eval on TARGET (and --base), or (--code) generated code scored in a sandbox. `options`: the `eval`
    command's others, by name; each mode reads its own. Bad input raises InputError; a missing part of the
    stack, ModuleNotFoundError."""
    if code_problems is None:
        return _tasks_eval(target, tasks, **options)
    if target or tasks:
        raise InputError("eval", "give --code PROBLEMS or TARGET --tasks, not both")
    return _code_eval(code_problems, **options)


def _code_eval(
    code_problems: Path,
    *,
    completions: Path | None,
    code_model: str | None,
    samples: int,
    k_values: str | None,
    sandbox_kind: str,
    workers: int | None,
    timeout_s: float,
    max_new_tokens: int,
    temperature: float,
    out: Path | None,
    as_json: bool,
    **_task_options,
) -> int:
    """--code: the completions (given, or generated by --model) scored in a sandbox."""
    if k_values is not None and not all(k.isdecimal() and int(k) > 0 for k in names(k_values)):
        raise InputError("--k", f"expected positive integers separated by commas, got {k_values!r}")
    try:
        with interruptible():
            return run_code_eval(
                code_problems,
                completions,
                code_model,
                samples=samples,
                ks=tuple(int(k) for k in names(k_values)),
                sandbox=sandbox_kind,
                workers=workers,
                timeout_s=timeout_s,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                out=out,
                json_out=as_json,
            )
    except Interrupted as exc:
        print("\nsftdoctor: interrupted; the running samples were killed and no results were written", file=sys.stderr)
        return 128 + exc.signum


def _tasks_eval(
    target: str | None,
    tasks: str | None,
    *,
    base: str | None,
    include: Path | None,
    limit: int | None,
    num_fewshot: int | None,
    batch_size: str | None,
    compare: Path | None,
    out: Path | None,
    as_json: bool,
    **_code_options,
) -> int:
    """lm-eval's tasks on TARGET (and --base)."""
    if not target:
        raise InputError("eval", "give TARGET (a run directory, checkpoint, model folder or hub id) and --tasks")
    if not names(tasks):
        raise InputError("eval", "give --tasks NAMES (comma-separated lm-eval task names)")
    if batch_size is not None and batch_size != "auto" and not (batch_size.isdecimal() and int(batch_size) > 0):
        raise InputError("--batch-size", f"expected a positive integer or auto, got {batch_size!r}")
    try:
        # SIGTERM unwinds like Ctrl-C: the result's temporary file is removed on the way out
        with interruptible(), quiet():
            return run_eval(
                target,
                names(tasks),
                base=base,
                include=include,
                limit=limit,
                num_fewshot=num_fewshot,
                batch_size=batch_size or "default",
                json_out=as_json,
                out=out,
                compare=compare,
            )
    except Interrupted as exc:
        print("\nsftdoctor: interrupted; no result was written", file=sys.stderr)
        return 128 + exc.signum
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "lm_eval":
            raise
        raise InputError("eval", "needs lm-evaluation-harness: pip install 'sftdoctor[eval]'") from None
