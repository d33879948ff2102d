"""Reading a run back (facts/run_records.py): sftdoctor run directories, Trainer output directories and logs
of other tools, resumed logs, logs cut off mid-line, and broken input."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sftdoctor.errors import InputError
from sftdoctor.facts.run_records import read_run
from sftdoctor.run.checkpoints import mark_complete

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "curves"
# A resolved.json's schedule: cosine down to a tenth of the rate over 10 steps, after 1 of warmup.
GOOD_PLAN = {
    "lr_scheduler": "cosine_with_min_lr",
    "learning_rate": 1e-3,
    "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
    "warmup_steps": 1,
    "total_steps": 10,
}


def write_lines(path: Path, records, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_a_sftdoctor_run_directory_gives_its_series_schedule_and_checkpoints(tmp_path):
    write_lines(
        tmp_path / "metrics.jsonl",
        [
            {"step": 5, "loss": 2.0, "learning_rate": 1e-3, "grad_norm": 0.9, "max_grad_norm": 1.0, "tokens_seen": 100},
            {
                "step": 10,
                "loss": 1.5,
                "learning_rate": 5e-4,
                "grad_norm": 0.7,
                "max_grad_norm": 1.0,
                "tokens_seen": 200,
            },
            {"step": 10, "eval_loss": 1.6},
            {"step": 10, "train_runtime": 3.0},
        ],
    )
    (tmp_path / "resolved.json").write_text(
        json.dumps(
            {
                **GOOD_PLAN,
                "max_grad_norm": 1.0,
                "save_steps": 5,
                "eval_steps": 10,
                "precision": "bf16",
                "deepspeed": None,
            }
        )
    )
    for step in (5, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    mark_complete(tmp_path / "checkpoint-5", 5)  # checkpoint-10: killed while saving
    (tmp_path / "final").mkdir()
    curves = read_run(tmp_path)
    assert curves["series"]["loss"] == {"steps": [5, 10], "values": [2.0, 1.5]}
    assert curves["series"]["eval_loss"] == {"steps": [10], "values": [1.6]}
    assert curves["schedule"] == {
        "name": "cosine_with_min_lr",
        "learning_rate": 1e-3,
        "total_steps": 10,
        "warmup_steps": 1,
        "min_lr_rate": 0.1,
    }
    assert curves["checkpoints"] == [5] and curves["finished"] and curves["max_grad_norm"] == 1.0
    assert json.loads(json.dumps(curves)) == curves  # a fact: plain JSON


def test_the_schedule_spans_the_trainers_own_step_count(tmp_path):
    """With packing the plan's estimate (rows / batch) is too long: the Trainer's max_steps, in every record,
    is what its scheduler was built over, and the warmup ratio applies to that."""
    write_lines(tmp_path / "metrics.jsonl", [{"step": 1, "loss": 1.0, "max_steps": 40}])
    (tmp_path / "resolved.json").write_text(
        json.dumps(
            {
                "lr_scheduler": "linear",
                "learning_rate": 1e-3,
                "warmup": {"warmup_steps": 0.1},
                "warmup_steps": 10,
                "total_steps": 100,
            }
        )
    )
    curves = read_run(tmp_path)
    assert curves["planned_steps"] == 40 and curves["schedule"]["total_steps"] == 40
    assert curves["schedule"]["warmup_steps"] == 4


def test_a_deepspeed_scheduler_block_means_the_schedule_is_not_known(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", [{"step": 1, "loss": 1.0}])
    (tmp_path / "resolved.json").write_text(
        json.dumps(
            {
                "lr_scheduler": "cosine",
                "learning_rate": 1e-3,
                "warmup_steps": 0,
                "total_steps": 10,
                "deepspeed": {"scheduler": {"type": "WarmupDecayLR"}},
            }
        )
    )
    assert read_run(tmp_path)["schedule"] is None


@pytest.mark.parametrize(
    "text, says",
    [
        (b"\x88\x00binary", "expected a UTF-8 run record, got binary data"),
        (b'{"lr_scheduler": "cosine",', "not valid JSON ("),
        (b"[1, 2]", "expected a JSON object (the run's resolved settings), got list"),
        (json.dumps({**GOOD_PLAN, "total_steps": "x"}).encode(), "total_steps: expected int, got 'x'"),
        (json.dumps({**GOOD_PLAN, "learning_rate": True}).encode(), "learning_rate: expected int or float, got True"),
        (json.dumps({**GOOD_PLAN, "learning_rate": float("inf")}).encode(), "learning_rate: expected a finite number"),
        (json.dumps({**GOOD_PLAN, "max_grad_norm": float("nan")}).encode(), "max_grad_norm: expected a finite number"),
        (json.dumps({**GOOD_PLAN, "lr_scheduler_kwargs": {"min_lr_rate": "a"}}).encode(), "do not make a schedule"),
        (json.dumps({**GOOD_PLAN, "warmup": {"warmup_steps": float("nan")}}).encode(), "do not make a schedule"),
    ],
)
def test_a_broken_resolved_json_is_refused_not_read_as_no_schedule(tmp_path, text, says):
    """Read as "no configured schedule", a run whose floor was dropped would pass the lr-curve reader."""
    write_lines(tmp_path / "metrics.jsonl", [{"step": 1, "loss": 1.0, "learning_rate": 1e-3}])
    (tmp_path / "resolved.json").write_bytes(text)
    with pytest.raises(InputError) as caught:
        read_run(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'resolved.json'}: ") and says in str(caught.value)


def test_a_trainer_directory_without_resolved_json_has_no_schedule(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", [{"step": 1, "loss": 1.0, "learning_rate": 1e-3}])
    assert read_run(tmp_path)["schedule"] is None
    (tmp_path / "resolved.json").write_text(json.dumps(GOOD_PLAN))
    assert read_run(tmp_path)["schedule"]["name"] == "cosine_with_min_lr"


def test_a_resumed_log_keeps_the_later_launchs_records(tmp_path):
    """Steps 3-4 logged by the first launch, then again by the resumed one: the resume's count."""
    write_lines(
        tmp_path / "metrics.jsonl",
        [{"step": s, "loss": 10.0 + s} for s in (1, 2, 3, 4)] + [{"step": s, "loss": float(s)} for s in (3, 4, 5)],
    )
    assert read_run(tmp_path)["series"]["loss"] == {"steps": [1, 2, 3, 4, 5], "values": [11.0, 12.0, 3.0, 4.0, 5.0]}


def test_a_last_line_cut_off_by_a_killed_writer_is_left_out(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", [{"step": 1, "loss": 1.0}], tail='{"step": 2, "lo')
    assert read_run(tmp_path)["series"]["loss"]["steps"] == [1]


def test_a_trainer_output_directory_reads_its_newest_checkpoints_state(tmp_path):
    state = json.loads((FIXTURES / "overfit_cpt_large_adgen.json").read_text())
    for step in (100, 2000):
        (tmp_path / f"checkpoint-{step}").mkdir()
        history = [r for r in state["log_history"] if r["step"] <= step]
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({**state, "log_history": history})
        )
    curves = read_run(tmp_path)
    assert curves["source"] == "trainer_state.json" and curves["path"] == str(tmp_path)
    assert curves["series"]["eval_loss"]["steps"][-1] == 1647  # checkpoint-2000's history, not checkpoint-100's
    assert curves["checkpoints"] == [100, 2000] and curves["schedule"] is None


def test_llama_factory_trainer_log_names_are_understood():
    curves = read_run(FIXTURES / "overfit_qwen25_7b_medical_lora.json")
    assert curves["series"]["learning_rate"]["steps"][:2] == curves["series"]["loss"]["steps"][:2]
    assert curves["planned_steps"] == 6750


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"step": 1, "loss": 1.0}\nnot json\n', "line 2: expected one JSON object per line"),
        ("[1, 2]\n", "line 1: expected a JSON object per record, got list"),
        ('{"loss": 1.0}\n', 'line 1: expected a "step" that is a whole number >= 0, got None'),
        ('{"step": -3, "loss": 1.0}\n', "got -3"),
        ('{"step": true, "loss": 1.0}\n', "got True"),
        ('{"step": 1, "epoch": 0.1}\n', "holds no metric records"),
        ("", "holds no metric records"),
    ],
)
def test_broken_metrics_are_one_line_naming_the_file_and_line(tmp_path, text, says):
    (tmp_path / "metrics.jsonl").write_text(text)
    with pytest.raises(InputError) as caught:
        read_run(tmp_path)
    assert str(caught.value).startswith(str(tmp_path / "metrics.jsonl")) and says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_folder_without_a_log_says_what_it_expected(tmp_path):
    with pytest.raises(InputError, match="holds no metrics.jsonl or trainer_state.json"):
        read_run(tmp_path)
    with pytest.raises(InputError, match="not found"):
        read_run(tmp_path / "nope")


@pytest.mark.parametrize("text", ['{"log_history": 3}', "[]", '{"log_history": [{"step": "x", "loss": 1}]}', "{"])
def test_broken_trainer_states_are_input_errors(tmp_path, text):
    (tmp_path / "trainer_state.json").write_text(text)
    with pytest.raises(InputError):
        read_run(tmp_path)


JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
RECORD = st.fixed_dictionaries(
    {"step": st.integers(-2, 50) | st.floats() | st.none()},
    optional={k: JSON for k in ("loss", "eval_loss", "learning_rate", "grad_norm", "lr")},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(RECORD.map(json.dumps), st.text(max_size=20)), max_size=8))
def test_fuzzed_logs_are_read_or_refused_in_one_line(tmp_path, lines):
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    try:
        curves = read_run(tmp_path)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    for series in curves["series"].values():
        assert series["steps"] == sorted(set(series["steps"])) and len(series["steps"]) == len(series["values"])


def test_a_loss_too_large_for_a_float_is_infinite_not_a_traceback(tmp_path):
    """json reads 1 followed by 400 zeros as an int; float() of it raised OverflowError."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1' + "0" * 400 + '}\n{"step": 2, "loss": NaN}\n')
    curves = read_run(tmp_path)
    assert curves["series"]["loss"]["values"][0] == float("inf")
    assert curves["non_finite"]["loss"] == {"step": 1, "value": "inf", "count": 2, "of": 2, "to_end": True}


@pytest.mark.parametrize("value", ['"nan"', "true", "[1]", '{"a": 1}'])
def test_a_logged_value_of_another_type_is_refused_not_dropped(tmp_path, value):
    """Dropped, a loss logged as "nan" left the curve judged without the point where it broke."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": ' + value + "}\n")
    with pytest.raises(InputError) as caught:
        read_run(tmp_path)
    assert str(caught.value).startswith(
        f"{tmp_path / 'metrics.jsonl'}: line 2: loss: expected a number (NaN and Infinity included), got "
    )
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0, "grad_norm": null}\n')  # null: not logged
    assert "grad_norm" not in read_run(tmp_path)["series"]


def test_an_infinite_clipping_threshold_in_a_record_is_not_taken(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0, "max_grad_norm": Infinity}\n')
    assert read_run(tmp_path)["max_grad_norm"] is None


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "unreadable", "dangling", "loop", "folder"])
def test_a_log_that_is_not_a_file_is_refused_by_name_never_read_or_passed_over(tmp_path, kind):
    """A FIFO blocked the read forever; /dev/zero never ended; skipped as absent, another log was read instead."""
    from hostile import no_hang, special_file

    special_file(tmp_path / "metrics.jsonl", kind)
    write_lines(tmp_path / "trainer_log.jsonl", [{"current_steps": 1, "loss": 1.0}])
    with no_hang(10), pytest.raises(InputError) as caught:
        read_run(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'metrics.jsonl'}: ")
