"""eval-tasks on the facts its probe records: lm-eval missing, unknown names with their nearest, all known."""

from conftest import plan_of, run_of


def plan():
    return plan_of(run_of(eval={"tasks": ("mmlu", "gsm8k")}))


def test_lm_eval_missing_is_an_error_before_the_run_trains(run):
    [finding] = run("eval-tasks", eval_tasks={"installed": False}, plan=plan())
    assert finding.severity.value == "error" and "sftdoctor[eval]" in finding.fix


def test_unknown_tasks_are_named_each_with_its_nearest_known_one(run):
    fact = {
        "installed": True,
        "unknown": {"mmlu_abstract_algebr": "mmlu_abstract_algebra", "zzz": None},
        "indexed": 14687,
    }
    [finding] = run("eval-tasks", eval_tasks=fact, plan=plan())
    assert finding.severity.value == "error"
    assert "'mmlu_abstract_algebr' (did you mean 'mmlu_abstract_algebra'?); 'zzz'" in finding.title
    assert "14,687" in finding.detail


def test_known_tasks_are_ok_and_a_failed_lookup_is_a_warning(run):
    [ok] = run("eval-tasks", eval_tasks={"installed": True, "unknown": {}, "indexed": 10}, plan=plan())
    assert ok.severity.value == "ok" and "mmlu, gsm8k" in ok.title
    [failed] = run("eval-tasks", eval_tasks={"installed": True, "error": "ImportError: x"}, plan=plan())
    assert failed.severity.value == "warning" and "ImportError: x" in failed.title
