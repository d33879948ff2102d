"""Private APIs of lm-evaluation-harness that sftdoctor touches, in one place, each pinned by a test
(tests/eval/test_compat.py) against the installed version."""

from __future__ import annotations


def no_git_probe() -> None:
    """lm-eval 0.4.x records the git commit of the working directory by running `git describe` with stderr
    inherited, so outside a repository (a task folder) every evaluation prints "fatal: not a git repository".
    sftdoctor records its own settings instead; the probe is replaced by one that says nothing."""
    import lm_eval.evaluator as evaluator

    if hasattr(evaluator, "get_git_commit_hash"):
        evaluator.get_git_commit_hash = lambda: None
