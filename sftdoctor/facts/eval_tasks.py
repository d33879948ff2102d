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

from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached

TIMEOUT_S = 300


def probe_eval_tasks(facts) -> dict[str, Any] | None:
    run = facts.get("run")
    if run is None or run.eval is None:
        return None
    if not (facts.get("packages") or {}).get("lm_eval"):
        return {"installed": False}
    include = run.eval.include
    request = {"tasks": list(run.eval.tasks), "include": include}
    files = sorted(p for p in Path(include).rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml", ".py")) \
        if include else []
    return cached("eval-tasks", {**request, "include": None}, files, lambda: _child(request))


def _child(request: dict[str, Any]) -> dict[str, Any]:
    return {"installed": True, **in_child("sftdoctor.facts.eval_tasks", request, "lm-eval's task index", TIMEOUT_S)}


def unknown_tasks(tasks: list[str], include: str | None) -> dict[str, Any]:
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include)
    known = manager.all_tasks
    missing = {name: difflib.get_close_matches(name, known, n=1, cutoff=0.75) for name in tasks if name not in known}
    return {"installed": True, "unknown": {k: (v[0] if v else None) for k, v in missing.items()}, "indexed": len(known)}


if __name__ == "__main__":
    serve(lambda asked: unknown_tasks(asked["tasks"], asked["include"]))
