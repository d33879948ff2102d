"""eval-tasks: the run's [eval] can run when training ends: lm-evaluation-harness is installed and knows
every task (its registry, plus the `include` folder), and the data files of the folder's own tasks are there,
checked before the run instead of after it."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import error, ok, warning


@check(
    "eval-tasks",
    "the [eval] tasks exist in the installed lm-evaluation-harness, before the run trains",
    messages={
        "no-lm-eval": "[eval] is set but lm-evaluation-harness is not installed",
        "lookup-failed": "the [eval] tasks could not be looked up",
        "unknown-task": "[eval] tasks lm-eval does not know",
        "data-unreadable": "an [eval] task cannot read its data",
    },
)
def eval_tasks(eval_tasks: dict[str, Any], plan=None):
    tasks = (plan.evaluation or {}).get("tasks") if plan is not None else None
    if not eval_tasks.get("installed"):
        return error(
            "[eval] is set but lm-evaluation-harness is not installed: the run would train, then fail",
            fix="pip install 'sftdoctor[eval]' (lm-eval), or remove [eval]",
            id="eval-tasks/no-lm-eval",
        )
    if "error" in eval_tasks:
        return warning(
            f"the [eval] tasks could not be looked up ({eval_tasks['error']})",
            fix="run `sftdoctor eval --tasks ...` on a saved model to see lm-eval's own error",
            id="eval-tasks/lookup-failed",
        )
    unknown = eval_tasks.get("unknown") or {}
    if unknown:
        named = "; ".join(
            f"{name!r}" + (f" (did you mean {near!r}?)" if near else "") for name, near in unknown.items()
        )
        return error(
            f"[eval] tasks lm-eval does not know: {named}",
            detail=f"Looked up among lm-eval's {eval_tasks.get('indexed', 0):,} tasks and groups, with the "
            "[eval] include folder's own.",
            fix="[eval] tasks = names from `lm-eval ls tasks`, or YAMLs of your own in [eval] include",
            evidence=eval_tasks,
            id="eval-tasks/unknown-task",
        )
    missing = eval_tasks.get("data_problems") or []
    if missing:
        first = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return error(
            f"[eval] task {first['task']!r} cannot read its data: {first['yaml']}: {first['key']}: "
            f"{first['problem']}{more}",
            detail="lm-eval knows the task by name, but reads its data (relative to the [eval] include "
            "folder) only when the training has ended, hours later: "
            + "; ".join(f"{m['yaml']}: {m['key']}: {m['problem']}" for m in missing[:5]),
            fix=f"put the file there, or correct {first['key']} in {first['yaml']}",
            evidence=eval_tasks,
            id="eval-tasks/data-unreadable",
        )
    return ok(
        f"lm-eval knows every [eval] task ({', '.join(tasks or [])})"
        + (" and its data files are there" if eval_tasks.get("data_files") else ""),
        evidence=eval_tasks,
    )
