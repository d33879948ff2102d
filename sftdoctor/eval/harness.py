"""lm-evaluation-harness as a library (lm-eval 0.4.x: `simple_evaluate` over an `HFLM` built on the loaded
model, its `TaskManager` registry), the model beside its base, and the settings that make two results
comparable.

Task names are checked against the registry before any model loads. A local task folder (`--include`) is
indexed first, alone (fast), and lm-eval's 14,000 bundled tasks only when a name is not there. lm-eval
reads a local task's `data_files` relative to the working directory, so the harness runs from that folder,
and a task folder travels with its data.
"""

from __future__ import annotations

import contextlib
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, did_you_mean

FEWSHOT_SEED = 1234  # lm-eval's default, recorded so that two results are known to share it
COMPARED = ("num_fewshot", "limit", "apply_chat_template", "generation", "task_versions")


def task_manager(tasks: list[str], include: Path | None):
    """lm-eval's registry holding every task of `tasks`, or a one-line error naming the unknown one. The
    tasks of the user's own folder are built here too (their data read, their templates tried on the first
    document), before any model loads: a mistake in one would otherwise surface as a traceback from lm-eval,
    datasets or jinja after minutes of loading."""
    from lm_eval.tasks import TaskManager

    include_path = str(include) if include else None
    local = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if local is not None and all(name in local.all_tasks for name in tasks):
        build_local(local, tasks, include)
        return local
    manager = TaskManager(include_path=include_path)
    for name in tasks:
        if name not in manager.all_tasks:
            unread = unreadable_yamls(include) if include else []
            raise InputError(
                "--tasks",
                f"no lm-eval task {name!r}{did_you_mean(name, manager.all_tasks)}"
                + ("" if include else " (a task of your own: --include FOLDER)")
                + (f"; --include holds YAML lm-eval cannot read: {'; '.join(unread[:3])}" if unread else ""),
            )
    if local is not None:
        build_local(manager, [name for name in tasks if name in local.all_tasks], include)
    return manager


def build_local(manager, names: list[str], include: Path) -> None:
    """Build the user's own tasks as lm-eval will (a task's config, data and first document rendered), once
    their data files are known to be there and to be files: named by the YAML and key that name them, where
    datasets says only "Unable to find" (and skips a named pipe as if it were not there)."""
    import logging

    from sftdoctor.facts.eval_tasks import data_problems, task_data

    for problem in data_problems(task_data(manager, names, include), include)[:1]:
        raise InputError(
            problem["yaml"],
            f"{problem['problem']} (task {problem['task']!r}, read from the --include "
            "folder); expected the task's data file",
            key=problem["key"],
        )

    datasets_log = logging.getLogger("datasets")
    level = datasets_log.level
    datasets_log.setLevel(logging.CRITICAL)  # it logs the cause at ERROR before raising; the one line says it
    try:
        for name in names:
            try:
                with _working_dir(include):
                    manager.load([name])
            except Exception as exc:  # noqa: BLE001 - the user's task: any failure of it is bad input
                raise InputError(
                    include, f"task {name!r} cannot be built by lm-eval ({_root(exc)})", key="--include"
                ) from None
    finally:
        datasets_log.setLevel(level)


def _root(exc: BaseException) -> str:
    """The innermost cause ("DatasetGenerationError: An error occurred" says nothing), on one line."""
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    text = (str(exc).strip().splitlines() or [""])[0][:240]
    if isinstance(exc, StopIteration):
        text = "no documents in its split"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unreadable_yamls(include: Path) -> list[str]:
    """The folder's YAML files that lm-eval skips without a word (not UTF-8, not YAML), each with why."""
    import yaml

    class Tagged(yaml.SafeLoader):  # lm-eval's own tags (!function) are not the problem here
        pass

    Tagged.add_multi_constructor("!", lambda loader, suffix, node: None)
    found = []
    for path in sorted(p for p in include.rglob("*.y*ml") if p.is_file()):
        try:
            yaml.load(path.read_bytes().decode("utf-8"), Loader=Tagged)  # noqa: S506 - a SafeLoader
        except UnicodeDecodeError:
            found.append(f"{path.name}: not UTF-8")
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            found.append(f"{path.name}: not YAML" + (f" (line {mark.line + 1})" if mark else ""))
    return found


@contextlib.contextmanager
def _working_dir(folder: Path | None):
    before = os.getcwd()
    if folder:
        os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def evaluate(
    model,
    tokenizer,
    tasks: list[str],
    manager,
    *,
    include: Path | None,
    num_fewshot: int | None,
    limit: int | None,
    batch_size: int | str,
    device: str,
) -> dict[str, Any]:
    """One model on `tasks`: {"metrics": {task: {metric: {"value", "stderr"}}}, "settings": {...}}."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    from sftdoctor.eval.compat import no_git_probe

    no_git_probe()

    class QuietHFLM(HFLM):  # its request methods draw bars unless asked not to; the command prints its own lines
        def loglikelihood(self, requests, disable_tqdm=False):
            return super().loglikelihood(requests, disable_tqdm=True)

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            return super().loglikelihood_rolling(requests, disable_tqdm=True)

        def generate_until(self, requests, disable_tqdm=False):
            return super().generate_until(requests, disable_tqdm=True)

    lm = QuietHFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=device)
    with _working_dir(include):
        try:
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=tasks,
                task_manager=manager,
                num_fewshot=num_fewshot,
                limit=limit,
                log_samples=False,
                fewshot_random_seed=FEWSHOT_SEED,
                bootstrap_iters=1000,
            )
        except ValueError as exc:
            # lm-eval 0.4.x draws the shots with random.sample, which refuses more than the split holds
            if num_fewshot and "Sample larger than population" in str(exc):
                raise InputError(
                    "--num-fewshot",
                    f"{num_fewshot} few-shot examples: more than a task's few-shot "
                    "split (or its test split, less the question) holds",
                ) from None
            raise
    return {"metrics": _metrics(out["results"]), "settings": _settings(out, tasks, num_fewshot, limit)}


def _metrics(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """lm-eval's "acc,none" / "acc_stderr,none" pairs as {metric: {value, stderr}} (filter "none" dropped)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for task, values in results.items():
        for key, value in values.items():
            name, _, filt = key.partition(",")
            if not filt or name.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            label = name if filt == "none" else f"{name} ({filt})"
            stderr = values.get(f"{name}_stderr,{filt}")
            out.setdefault(task, {})[label] = {
                "value": float(value),
                "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
            }
    return out


def _settings(out: dict[str, Any], tasks: list[str], num_fewshot: int | None, limit: int | None) -> dict[str, Any]:
    configs = out.get("configs") or {}
    return {
        "tasks": sorted(tasks),
        "num_fewshot": num_fewshot,
        "n_shot": out.get("n-shot"),
        "limit": limit,
        "apply_chat_template": False,
        "fewshot_seed": FEWSHOT_SEED,
        "generation": {
            t: c.get("generation_kwargs")
            for t, c in sorted(configs.items())
            if c.get("output_type") == "generate_until"
        },
        "task_versions": out.get("versions"),
        "lm_eval": metadata.version("lm_eval"),
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Settings in which two results differ (fewshot, limit, chat template, generation, task versions)."""
    return [f"{key}: {a.get(key)!r} vs {b.get(key)!r}" for key in COMPARED if a.get(key) != b.get(key)]
