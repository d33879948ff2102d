"""The block a finished run ends with, from its own metrics.jsonl records."""

import json

from sftdoctor.train.summary import line_count, read_records, summary

RECORDS = [  # as sftdoctor.train.callbacks.Metrics writes them (the tiny example, 2026-12-01)
    {"step": 10, "loss": 5.198, "tokens_seen": 40289, "tokens_per_second": 13156.0},
    {"step": 20, "loss": 4.0579, "tokens_seen": 77012, "tokens_per_second": 13223.9},
    {"step": 20, "eval_loss": 3.8554},
    {"step": 20, "train_runtime": 5.972, "train_loss": 4.628},
]


def test_a_finished_run_says_what_it_did_and_where_everything_is(tmp_path):
    (tmp_path / "final").mkdir()
    text = summary(tmp_path, RECORDS, 21.4, 0, tmp_path / "checkpoint-20", ["load it: ..."])
    lines = text.splitlines()
    assert lines[0] == "sftdoctor: run complete: 20 steps in 21 s, 6 s of it training"
    assert "77,012 trained, 12,896 tokens/s" in text
    assert "train 4.0579 (step 20); eval 3.8554 (step 20)" in text
    assert f"final model  {tmp_path / 'final'}" in text and "checkpoint-20 (newest complete)" in text
    assert lines[-1] == "  next         load it: ..."
    with_report = summary(tmp_path, RECORDS, 21.4, 0, None, ["load it: ..."], report="runs/x/report.html (5 panels)")
    assert with_report.splitlines()[-2:] == [
        "  report       runs/x/report.html (5 panels)",
        "  next         load it: ...",
    ]


def test_a_resumed_run_counts_only_its_own_steps_and_the_log_is_read_from_where_it_began(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS[:1]) + "not json\n")
    earlier = line_count(path)
    with open(path, "a") as handle:
        handle.write(json.dumps({"step": 20, "loss": 4.1, "tokens_seen": 30000}) + "\n")
    records = read_records(path, earlier)
    assert records == [{"step": 20, "loss": 4.1, "tokens_seen": 30000}]
    text = summary(tmp_path, records, 75, 10, None, [])
    assert text.splitlines()[0] == "sftdoctor: run complete: 10 steps (steps 11-20, resumed) in 1m15s"
    assert "final model" not in text and "tokens/s" not in text  # no end record: no rate to claim


def test_the_ids_the_gate_silenced_are_said_before_the_report(tmp_path):
    text = summary(tmp_path, RECORDS, 21.4, 0, None, [], report="r.html", silenced=("nccl-env/port-busy", "disk-full"))
    assert text.splitlines()[-2:] == [
        "  silenced     nccl-env/port-busy, disk-full ([checks] disable, --disable): shown marked silenced, never "
        "counted",
        "  report       r.html",
    ]
    assert "  silenced  " not in summary(tmp_path, RECORDS, 21.4, 0, None, [])
