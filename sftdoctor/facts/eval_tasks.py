"""Do the run's [eval] tasks exist in the installed lm-evaluation-harness (and its `include` folder)? Asked
of lm-eval's own TaskManager in a child process (lm-eval imports torch and indexes ~14,000 task files in
seconds), kept in the probe cache, so a misspelt task stops `sftdoctor train` before hours of training, not
after.

    python -m sftdoctor.facts.eval_tasks '{"tasks": [...], "include": FOLDER_OR_NULL}'
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached

TIMEOUT_S = 300


@fact(
    "eval_tasks",
    "the [eval] tasks, found in lm-eval's registry",
    inputs=RUN_CONFIG,
    why_missing="no [eval] in the run config (or no --config)",
    needs=("run",),
)
def probe_eval_tasks(facts, run) -> dict[str, Any] | None:
    if run.eval is None:
        return None
    if not (facts.get("packages") or {}).get("lm_eval"):
        return {"installed": False}
    include = run.eval.include
    request = {"tasks": list(run.eval.tasks), "include": include}
    files = (
        sorted(p for p in Path(include).rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml", ".py"))
        if include
        else []
    )
    found = cached("eval-tasks", {**request, "include": None}, files, lambda: _child(request))
    if found.get("data_files"):  # whether they are there is read now: the cache only knows the YAML files
        found = {**found, "data_problems": data_problems(found["data_files"], include)}
    return found


def _child(request: dict[str, Any]) -> dict[str, Any]:
    return {"installed": True, **in_child("sftdoctor.facts.eval_tasks", request, "lm-eval's task index", TIMEOUT_S)}


def unknown_tasks(tasks: list[str], include: str | None) -> dict[str, Any]:
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include)
    known = manager.all_tasks
    missing = {name: difflib.get_close_matches(name, known, n=1, cutoff=0.75) for name in tasks if name not in known}
    local = [name for name in tasks if name in known and _in_folder(manager, name, include)]
    return {
        "installed": True,
        "unknown": {k: (v[0] if v else None) for k, v in missing.items()},
        "indexed": len(known),
        "data_files": task_data(manager, local, include) if include else [],
    }


def _in_folder(manager, name: str, include: str | None) -> bool:
    path = getattr(manager.task_index.get(name), "yaml_path", None)
    return bool(include and path and Path(path).resolve().is_relative_to(Path(include).resolve()))


# ---- the data files of the user's own tasks, as datasets.load_dataset reads them (datasets 4-5, lm-eval 0.4.x)
# lm-eval 0.4.13 `ConfigurableTask.download`: load_dataset(path=dataset_path, name=dataset_name, **dataset_kwargs).
# datasets 5.2 `load.dataset_module_factory`: a packaged builder (json, csv, ...) reads `data_files` relative to
# `data_dir` (itself relative to the working directory: the task folder, where sftdoctor runs lm-eval), a local
# folder reads them relative to that folder (and its data_dir); anything else is a hub dataset, not a file here.
# A pattern is a glob (fsspec's, equivalent to Python's since fsspec 2023.12); a URL is not checked.


def task_data(manager, names: list[str], include: str | Path) -> list[dict[str, Any]]:
    """{"task", "yaml", "key", "pattern", "base"} for each data file that `names` (tasks, groups, tags of the
    registry `manager`) read, each relative to `base`; "pattern" None with "base" a folder that must exist. The
    YAML and the base are relative to `include` (so the answer holds for a copy of the folder)."""
    import os

    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    cwd = Path(include).resolve()
    found: list[dict[str, Any]] = []
    for name, yaml_path, config, origin in _configs(manager, names):
        for key, pattern, base in _patterns(config, cwd, set(_PACKAGED_DATASETS_MODULES)):
            yaml_file = Path(origin.get(key.split(".")[0], yaml_path)).resolve()
            found.append(
                {
                    "task": name,
                    "yaml": os.path.relpath(yaml_file, cwd),
                    "key": key,
                    "pattern": pattern,
                    "base": os.path.relpath(base, cwd),
                }
            )
    return found


def _configs(manager, names: list[str], seen: set[str] | None = None):
    """(task, its YAML, its merged config, which YAML set each top-level key) of each task `names` stand for."""
    seen = set() if seen is None else seen
    index = manager.task_index
    for name in names:
        entry = index.get(name)
        if name in seen or entry is None:
            continue
        seen.add(name)
        kind = getattr(getattr(entry, "kind", None), "name", "")
        if kind == "TAG":
            yield from _configs(manager, sorted(n for n, e in index.items() if name in (e.tags or ())), seen)
            continue
        if entry.yaml_path is None:
            continue
        config, origin = task_yaml(Path(entry.yaml_path))
        members = config.get("task") if kind == "GROUP" else None
        if isinstance(members, list):
            yield from _configs(manager, [m for m in members if isinstance(m, str)], seen)
            yield from ((f"{name}[{i}]", entry.yaml_path, m, {}) for i, m in enumerate(members) if isinstance(m, dict))
        elif kind != "GROUP":
            yield name, entry.yaml_path, config, origin


def task_yaml(path: Path, depth: int = 0) -> tuple[dict[str, Any], dict[str, Path]]:
    """A task YAML with its `include`s merged as lm-eval merges them (the including file's keys win), and the
    file each top-level key came from; lm-eval's tags (!function) read as nothing."""
    import yaml

    class Tagged(yaml.SafeLoader):
        pass

    Tagged.add_multi_constructor("!", lambda loader, suffix, node: None)
    try:
        config = yaml.load(path.read_bytes().decode("utf-8"), Loader=Tagged)  # noqa: S506 - a SafeLoader
    except (OSError, ValueError, yaml.YAMLError):
        return {}, {}
    if not isinstance(config, dict):
        return {}, {}
    merged, origin = {}, {}
    includes = config.pop("include", None)
    for inc in (includes if isinstance(includes, list) else [includes]) if includes and depth < 8 else []:
        if isinstance(inc, str):
            inner, where = task_yaml(path.parent / inc, depth + 1)
            merged.update(inner)
            origin.update(where)
    merged.update(config)
    origin.update({key: path for key in config})
    return merged, origin


def _patterns(config: dict[str, Any], cwd: Path, packaged: set[str]):
    """(key, pattern or None, base folder) of each local data file or folder a task's config names."""
    path, kwargs = config.get("dataset_path"), config.get("dataset_kwargs")
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if not isinstance(path, str) or config.get("custom_dataset") is not None or path.startswith("hf://"):
        return
    data_dir = kwargs.get("data_dir") if isinstance(kwargs.get("data_dir"), str) else None
    if path in packaged:
        base = cwd / Path(data_dir).expanduser() if data_dir else cwd
    elif _is_dir(cwd / Path(path).expanduser()) or path.startswith((".", "/", "~")) or path.count("/") > 1:
        yield "dataset_path", None, cwd / Path(path).expanduser()  # a local folder (datasets' own test)
        base = cwd / Path(path).expanduser() / (data_dir or "")
    else:
        return  # a hub dataset
    if data_dir:
        yield "dataset_kwargs.data_dir", None, base
    yield from (
        (f"dataset_kwargs.data_files{where}", pattern, base) for where, pattern in _data_files(kwargs.get("data_files"))
    )


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # a name with a NUL byte, too long: no folder
        return False


def _data_files(value, where: str = ""):
    """(where in data_files, pattern) of each str in a data_files value (a str, a list, a split -> str | list,
    or datasets' [{"split", "path"}] form)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            inner = item.get("path") if isinstance(item, dict) else item
            yield from _data_files(inner, f"{where}[{i}]" + (".path" if isinstance(item, dict) else ""))
    elif isinstance(value, dict):
        for split, item in value.items():
            yield from _data_files(item, f"{where}.{split}")


def data_problems(entries: list[dict[str, Any]], include: str | Path) -> list[dict[str, Any]]:
    """The entries of task_data whose file or folder is not here (or is no regular file: datasets skips a
    named pipe or a device as if it were not there), each with "problem" and its YAML's path; read from the disk
    now, never from a cache."""
    problems = []
    for entry in entries:
        base, pattern = Path(include) / entry["base"], entry["pattern"]
        entry = {**entry, "yaml": str(Path(include) / entry["yaml"])}
        why = _folder_problem(base) if pattern is None else None if "://" in pattern else _file_problem(base, pattern)
        if why:
            problems.append({**entry, "problem": why})
    return problems


def _folder_problem(folder: Path) -> str | None:
    return None if folder.is_dir() else f"no folder {folder}"


def _file_problem(base: Path, pattern: str) -> str | None:
    import glob
    import os

    from sftdoctor.errors import NOT_REGULAR

    full = os.path.join(base, os.path.expanduser(pattern))
    matched = glob.glob(full, recursive=True) if glob.has_magic(pattern) else [full] if os.path.lexists(full) else []
    if not matched:
        return f"{'no file matches' if glob.has_magic(pattern) else 'no file'} {full}"
    for path in matched:
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            return f"{path} cannot be read ({exc.strerror})"
        if os.path.isdir(path) and not glob.has_magic(pattern):
            return f"{path} is a folder, not a data file"
        if stat_kind := NOT_REGULAR.get(mode & 0o170000):
            return f"{path} is {stat_kind}, not a data file"
    return None


if __name__ == "__main__":
    serve(lambda asked: unknown_tasks(asked["tasks"], asked["include"]))
