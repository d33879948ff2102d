"""[eval] at the end of a run: what is evaluated (every n-th complete checkpoint, then the final model), the
command each evaluation runs, and the table the summary shows."""

import json
import sys

from conftest import plan_of, run_of

from sftdoctor.run.checkpoints import mark_complete
from sftdoctor.train.evaluation import command, result_line, targets


def plan(tmp_path, **given):
    return plan_of(
        run_of(eval={"tasks": ("a", "b"), **given}, model={"weights": "random"}, training={"output_dir": str(tmp_path)})
    )


def test_every_nth_complete_checkpoint_then_the_final_model(tmp_path):
    for step in (10, 20, 30, 40):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if step != 30:
            mark_complete(tmp_path / f"checkpoint-{step}", step)
    chosen = targets(plan(tmp_path, every_n_checkpoints=2), tmp_path)
    assert [(t.name, o.name) for t, o in chosen] == [
        ("checkpoint-20", "eval-checkpoint-20.json"),
        (tmp_path.name, "eval.json"),
    ]
    assert [t for t, _ in targets(plan(tmp_path), tmp_path)] == [tmp_path]  # 0: the final model only


def test_the_command_evaluates_against_the_random_base_the_run_saved(tmp_path):
    argv = command(plan(tmp_path, limit=50, include=str(tmp_path)), tmp_path, tmp_path / "eval.json")
    assert argv[:4] == [sys.executable, "-m", "sftdoctor", "eval"]
    assert argv[argv.index("--tasks") + 1] == "a,b" and argv[argv.index("--limit") + 1] == "50"
    assert argv[argv.index("--base") + 1] == str(tmp_path / "base")
    assert "--base" not in command(plan(tmp_path, base=False), tmp_path, tmp_path / "eval.json")
    assert "--num-fewshot" not in argv  # each task's own


def test_the_summary_line_is_read_from_the_result_and_absent_without_one(tmp_path):
    assert result_line(tmp_path) is None
    (tmp_path / "eval.json").write_text(
        json.dumps(
            {
                "metrics": {"t": {"acc": {"value": 0.75, "stderr": 0.04}}},
                "base": {"metrics": {"t": {"acc": {"value": 0.64, "stderr": 0.05}}}},
                "settings": {"num_fewshot": None, "limit": None, "lm_eval": "0.4.13"},
            }
        )
    )
    assert result_line(tmp_path) == f"t acc 0.750 (base 0.640, +0.110); {tmp_path / 'eval.json'}"
