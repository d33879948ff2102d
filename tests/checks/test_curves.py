"""The curve readers (checks/curves.py) on real Trainer logs from public repositories (tests/fixtures/curves,
each citing its source) and on synthetic series shaped like each problem."""

import json
import math
from pathlib import Path

import pytest

from sftdoctor.checks import load_checks
from sftdoctor.facts.run_records import read_run
from sftdoctor.report.command import judge

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "curves"
INDEX = json.loads((FIXTURES / "index.json").read_text())


def recorded(name: str, schedule: bool = False) -> dict:
    """A real log read as `sftdoctor report` reads it, with the clipping threshold (and, asked for, the
    schedule) its repository's training arguments name: a Trainer's state carries neither."""
    entry = next(e for e in INDEX if e["file"] == f"{name}.json")
    curves = read_run(FIXTURES / entry["file"])
    config = entry.get("config") or {}
    curves["max_grad_norm"] = config.get("max_grad_norm")
    if schedule:
        curves["schedule"] = {
            "name": config["lr_scheduler_type"].split()[0],
            "learning_rate": config["learning_rate"],
            "total_steps": config.get("max_steps") or curves["planned_steps"],
            "warmup_steps": int(config.get("warmup_steps_resolved", config.get("warmup_steps"))),
            "min_lr_rate": 0.0,
        }
    return curves


def said(curves: dict) -> dict[str, str]:
    """finding id (CHECK/message) -> the title of its warning or error (quiet checks left out)."""
    findings, _ = judge(curves, plugins=False)
    return {f.id: f.title for f in findings if f.severity.value in ("warning", "error")}


def checks_of(said_: dict[str, str]) -> set[str]:
    """The checks that said something, whichever of their messages."""
    return {finding_id.split("/")[0] for finding_id in said_}


def synthetic(**series) -> dict:
    """A run logged every 10 steps; each keyword is a series' values."""
    length = max(len(v) for v in series.values())
    return {
        "name": "synthetic",
        "path": "runs/synthetic",
        "source": "metrics.jsonl",
        "schedule": None,
        "max_grad_norm": 1.0,
        "precision": "bf16",
        "planned_steps": 10 * length,
        "last_step": 10 * length,
        "save_steps": None,
        "eval_steps": None,
        "checkpoints": [],
        "best_checkpoint": None,
        "stopped": None,
        "finished": True,
        "series": {
            name: {"steps": [10 * (i + 1) for i in range(len(values))], "values": list(values)}
            for name, values in series.items()
        },
    }


def healthy(n: int = 60) -> dict:
    return synthetic(
        loss=[2.0 * math.exp(-i / 20) + 0.5 + 0.02 * math.sin(i) for i in range(n)],
        grad_norm=[0.6 + 0.1 * math.sin(i / 3) for i in range(n)],
        tokens_per_second=[12000 + 300 * math.sin(i) for i in range(n)],
        memory_allocated_gib=[30.0 + 0.01 * math.sin(i) for i in range(n)],
    )


def test_the_six_readers_are_post_run_checks_with_topics():
    ids = {spec.id for spec in load_checks(plugins=False).phase("postrun")}
    assert ids == {"lr-curve", "grad-norm-curve", "overfitting", "loss-plateau", "throughput-drop", "memory-growth"}


# ---------------------------------------------------------------- real logs

# Where the repository names its schedule; for three logs it was read off the logged rates themselves, and
# checking a log against a schedule inferred from that log would prove nothing.
CONFIGURED = [e for e in INDEX if "inferred" not in e["config"]["lr_scheduler_type"]]
INFERRED = [e for e in INDEX if e not in CONFIGURED]


@pytest.mark.parametrize("entry", CONFIGURED, ids=lambda e: e["file"])
def test_every_real_log_follows_the_schedule_its_repository_configures(entry):
    """The LR formula (run/schedule.py) against 11 real logs of transformers 4.27-4.57 whose repositories
    configure the schedule: each followed it, whichever step its version logs the rate for."""
    said_ = said(recorded(entry["file"][:-5], schedule=True))
    assert "lr-curve" not in checks_of(said_), said_


def test_the_logs_with_a_configured_schedule_are_counted():
    assert len(CONFIGURED) == 11 and len(INFERRED) == 3


@pytest.mark.parametrize("entry", INFERRED, ids=lambda e: e["file"])
def test_a_real_log_without_its_configuration_is_judged_on_its_shape_alone(entry):
    """No configured schedule: the reader says it had none to compare with and judges only oscillation."""
    findings, _ = judge(recorded(entry["file"][:-5]), plugins=False)
    [lr] = [f for f in findings if f.id == "lr-curve"]
    assert lr.severity.value == "ok" and lr.title.endswith("did not oscillate (no configured schedule to compare with)")


@pytest.mark.parametrize("name", ["overfit_qwen25_7b_medical_lora", "overfit_cpt_large_adgen"])
def test_real_overfitting_is_named_with_the_step_of_the_best_eval_loss(name):
    curves = recorded(name)
    best = min(zip(curves["series"]["eval_loss"]["values"], curves["series"]["eval_loss"]["steps"]))[1]
    title = said(curves)["overfitting/eval-loss-rising"]
    assert (
        title == f"overfitting: the eval loss stayed above its best for 4 evaluations after step {best} while the "
        "train loss fell"
    )


def test_a_trainer_state_alone_is_judged_against_the_trainers_default_threshold():
    curves = read_run(FIXTURES / "grad_clipped_mistral7b_medbot_lora.json")  # no training arguments at hand
    assert said(curves)["grad-norm-curve/mostly-clipped"] == (
        "the gradient norm was clipped on 83% of the logged steps: above 1.1x the "
        "threshold 1 (the Trainer's default; the log does not say)"
    )


def test_a_cosine_that_turns_back_up_against_its_configured_schedule():
    """num_cycles 1 instead of 0.5: the rate falls to 0 at mid-run and climbs back: one turn is one too many."""
    schedule = {"name": "cosine", "learning_rate": 1e-4, "total_steps": 600, "warmup_steps": 0, "min_lr_rate": 0.0}
    curves = synthetic(learning_rate=[1e-4 * 0.5 * (1 + math.cos(2 * math.pi * i / 60)) for i in range(60)])
    curves["schedule"] = schedule
    assert said(curves)["lr-curve/oscillates"].startswith(
        "the learning rate oscillates: it turned 1 times after its peak"
    )


def test_a_real_dpo_tail_that_only_wobbles_is_not_overfitting():
    assert "overfitting" not in checks_of(said(recorded("healthy_zephyr7b_dpo")))


@pytest.mark.parametrize(
    "name, share",
    [
        ("grad_clipped_tinyllama_lora", "100%"),
        ("grad_clipped_mistral7b_medbot_lora", "83%"),
        ("grad_rising_yandexgpt8b_lora", "65%"),
        ("lr_cosine_warmup_mistral7b_translator", "83%"),
    ],
)  # LLaMA-Factory's default 1.0
def test_real_runs_clipped_on_most_steps(name, share):
    assert said(recorded(name))["grad-norm-curve/mostly-clipped"].startswith(
        f"the gradient norm was clipped on {share}"
    )


@pytest.mark.parametrize("name", ["plateau_quality_multiple_choice", "plateau_llama31_8b_token_compressor"])
def test_real_runs_that_never_learned_are_a_plateau(name):
    assert said(recorded(name))["loss-plateau/flat"].startswith("the train loss stayed flat from the start")


@pytest.mark.parametrize(
    "name",
    [
        "healthy_qwen3_8b_unsloth_tcm",
        "healthy_lora_linear_warmup_250",
        "healthy_nsllm_full_ft",
        "healthy_zephyr7b_dpo",
        "lr_linear_stopped_early",
        "lr_linear_chatglm6b_ptuning",
    ],
)
def test_real_healthy_runs_are_quiet(name):
    assert said(recorded(name, schedule=True)) == {}


def test_a_floor_the_stack_dropped_is_named():
    """A real cosine that went to exactly 0, where the run configured a floor of a tenth: what a floor passed as
    an absolute min_lr that DeepSpeed's optimizer lacks, or passed to the plain cosine, looks like."""
    curves = recorded("lr_cosine_warmup_mistral7b_translator", schedule=True)
    curves["schedule"] = {**curves["schedule"], "name": "cosine_with_min_lr", "min_lr_rate": 0.1}
    title = said(curves)["lr-curve/below-floor"]
    assert title.startswith("the learning rate fell below its floor:") and "the floor is 5e-06" in title


def test_a_missing_warmup_is_named():
    curves = recorded("lr_linear_chatglm6b_ptuning", schedule=True)
    curves["schedule"] = {**curves["schedule"], "warmup_steps": 300}  # configured, but the real run had none
    assert said(curves)["lr-curve/no-warmup"] == "no warmup: the learning rate was already 0.0199 at step 10"


def test_a_schedule_built_for_another_length_never_reaches_its_end():
    """A real linear decay stopped at step 24,000 of 155,800, read as if the run had been planned for 24,000
    steps (the scheduler sized for epochs, the run cut by max_steps): it ended far above the floor."""
    curves = recorded("lr_linear_stopped_early", schedule=True)
    curves["schedule"] = {**curves["schedule"], "total_steps": 24000}
    assert said(curves)["lr-curve/wrong-end"].startswith("the learning rate ended at 8.46e-06 at step 24000, not at")


# ---------------------------------------------------------------- synthetic shapes


def test_a_healthy_synthetic_run_is_quiet():
    curves = healthy()
    curves["series"]["eval_loss"] = {
        "steps": [100, 200, 300, 400, 500, 600],
        "values": [2.0, 1.5, 1.2, 1.1, 1.05, 1.04],
    }
    assert said(curves) == {}


def test_an_oscillating_learning_rate():
    lrs = [1e-4 * (0.5 + 0.5 * math.cos(math.pi * 3 * i / 60)) for i in range(60)]  # num_cycles 1.5: up and down
    title = said(synthetic(learning_rate=lrs))["lr-curve/oscillates"]
    assert title.startswith("the learning rate oscillates: it turned 2 times after its peak")


def test_a_gradient_norm_rising_over_the_last_third():
    norms = [0.5] * 40 + [0.5 * 1.06**i for i in range(20)]
    assert said(synthetic(grad_norm=norms))["grad-norm-curve/rising"].startswith(
        "the gradient norm rose over the last third"
    )


def test_a_norm_just_over_the_threshold_is_not_called_clipped():
    """1.02 against 1.0 rescales an update by 2%: that is not training with a smaller step."""
    assert "grad-norm-curve" not in checks_of(said(synthetic(grad_norm=[1.02, 0.98, 1.05, 1.01] * 5)))


def test_overfitting_names_the_kept_checkpoint_of_the_best_step():
    curves = healthy()
    curves["series"]["eval_loss"] = {"steps": [100, 200, 300, 400, 500, 600], "values": [2.0, 1.5, 1.4, 1.45, 1.5, 1.6]}
    curves["checkpoints"] = [300, 600]
    findings, _ = judge(curves, plugins=False)
    [finding] = [f for f in findings if f.id == "overfitting/eval-loss-rising"]
    assert finding.evidence["step"] == 300 and finding.evidence["checkpoint"] == "runs/synthetic/checkpoint-300"
    assert "runs/synthetic/checkpoint-300" in finding.detail


def test_eval_and_train_loss_rising_together_is_not_overfitting():
    curves = synthetic(loss=[1.0 + 0.01 * i for i in range(60)], eval_loss=[1.0, 0.9, 0.95, 1.0, 1.05])
    assert "overfitting" not in checks_of(said(curves))


def test_a_learning_rate_of_zero_is_a_plateau_and_says_so():
    curves = synthetic(loss=[2.3 + 0.01 * math.sin(i) for i in range(40)], learning_rate=[0.0] * 40)
    findings, _ = judge(curves, plugins=False)
    [finding] = [f for f in findings if f.id == "loss-plateau/flat"]
    assert finding.evidence["zero_lr"] and "The learning rate was 0 on every logged step." in finding.detail


def test_a_slow_steady_fall_is_learning_not_a_plateau():
    assert "loss-plateau" not in checks_of(said(synthetic(loss=[2.0 - 0.001 * i for i in range(60)])))  # 3% but steady


def test_throughput_that_halves_after_a_checkpoint_and_stays_down():
    speeds = [12000.0] * 30 + [6000.0] * 30
    curves = synthetic(tokens_per_second=speeds)
    curves["checkpoints"] = [300]
    title, detail = (
        said(curves)["throughput-drop/dropped"],
        next(f.detail for f in judge(curves, plugins=False)[0] if f.id == "throughput-drop/dropped"),
    )
    assert title == "throughput fell by 50% at step 310 and did not recover: 12,000 to 6,000 tokens/s"
    assert detail == "It coincides with a checkpoint save at step 300."


def test_a_throughput_drop_at_an_evaluation_says_so():
    curves = synthetic(tokens_per_second=[12000.0] * 30 + [6000.0] * 30, eval_loss=[2.0, 1.9, 1.8, 1.7])
    curves["series"]["eval_loss"]["steps"] = [100, 200, 305, 400]
    [detail] = [f.detail for f in judge(curves, plugins=False)[0] if f.id == "throughput-drop/dropped"]
    assert detail == "It coincides with an evaluation at step 305."


def test_throughput_that_dips_at_each_save_and_recovers_is_quiet():
    speeds = [3000.0 if i % 10 == 0 else 12000.0 for i in range(60)]
    assert "throughput-drop" not in checks_of(said(synthetic(tokens_per_second=speeds)))


def test_gpu_memory_growing_step_after_step_is_a_leak():
    memory = [20.0] * 5 + [20.0 + 0.05 * i for i in range(55)]
    title = said(synthetic(memory_allocated_gib=memory))["memory-growth/leak"]
    assert title.startswith("GPU memory (allocated, the peak of each logging interval) grew from") and "a leak" in title


def test_host_memory_that_steps_up_once_is_not_a_leak():
    rss = [8.0] * 30 + [9.0] * 30  # one allocation (a cache filled), then flat
    assert "memory-growth" not in checks_of(said(synthetic(host_rss_gib=rss)))


def test_too_few_points_are_skipped_with_the_count_needed():
    _, skipped = judge(synthetic(loss=[1.0, 0.9], eval_loss=[1.0]), plugins=False)
    reasons = {s.id: s.reason for s in skipped}
    assert reasons["loss-plateau"] == "2 logged train losses: too few to judge (8 needed)"
    assert reasons["overfitting"] == "1 logged eval losses: too few to judge (4 needed)"
    assert reasons["memory-growth"] == "no memory was logged"


def test_a_non_finite_point_is_a_finding_and_never_judged_over():
    """Dropped, a loss that went NaN for its last steps "fell", and a norm that went inf "stayed level"."""
    curves = healthy()
    curves["series"]["loss"]["values"][-3:] = [float("nan")] * 3
    curves["series"]["grad_norm"]["values"][5] = float("inf")
    findings, skipped = judge(curves, plugins=False)
    by_id = {f.id: f for f in findings}
    plateau = by_id["loss-plateau/non-finite"]
    assert plateau.severity.value == "error"
    assert plateau.title == "the train loss is non-finite from step 580 (NaN): 3 of 60 logged points"
    assert plateau.evidence["step"] == 580 and plateau.explain == "nan-loss"
    assert by_id["grad-norm-curve/non-finite"].title == (
        "the gradient norm is non-finite at 1 of 60 logged points, first at step 60 (inf)"
    )
    assert not any(word in f.title for f in findings for word in ("fell", "stayed level"))


def test_a_rate_that_went_nan_is_not_said_to_follow_its_schedule():
    curves = synthetic(learning_rate=[1e-3] * 10 + [float("nan")] * 2)
    [finding] = [f for f in judge(curves, plugins=False)[0] if f.id == "lr-curve/non-finite"]
    assert finding.severity.value == "error"
    assert finding.title.startswith("the learning rate is non-finite from step 110")


def test_a_reader_whose_second_series_is_non_finite_is_skipped_saying_why():
    curves = synthetic(eval_loss=[1.0, 0.9, 1.0, 1.1, 1.2, 1.3], loss=[1.0, 0.8, float("inf"), 0.5, 0.4, 0.3])
    findings, skipped = judge(curves, plugins=False)
    reasons = {s.id: s.reason for s in skipped}
    assert (
        reasons["overfitting"] == "the train loss is non-finite at 1 of 6 logged points, first at step 30 (inf): "
        "not judged over those"
    )
    assert {f.id: f.severity.value for f in findings}["loss-plateau/non-finite"] == "error"


def test_fp16_overflowed_steps_are_left_out_of_the_gradient_norm_and_said():
    """An fp16 step that overflows logs an infinite norm by design (the loss scaler skips it)."""
    curves = healthy()
    curves["precision"] = "fp16"
    curves["series"]["grad_norm"]["values"][5] = float("inf")
    [finding] = [f for f in judge(curves, plugins=False)[0] if f.id == "grad-norm-curve"]
    assert finding.severity.value == "ok" and finding.title.endswith("; 1 overflowed fp16 steps (inf) left out")
    curves["series"]["grad_norm"]["values"][6] = float("nan")  # NaN is no overflow
    assert said(curves)["grad-norm-curve/non-finite"].startswith("the gradient norm is non-finite at 2 of 60")
