"""The recipe's Trainer callbacks (train/callbacks.py): token counting, the metrics log, the step lines,
stopping after a step, and marking checkpoints complete, on real transformers objects and a real Trainer."""

from __future__ import annotations

import json
import time

import pytest
import torch
import transformers
from trainrun import tiny_qwen2
from transformers import TrainerControl, TrainerState, TrainingArguments

from sftdoctor.run.checkpoints import MARKER, is_complete, newest_complete
from sftdoctor.train.callbacks import CompleteCheckpoints, Metrics, MetricsInLogs, StepLines, StopAfter, TokenCounter


def batch(mask_rows):
    """A micro-batch of input ids whose attention mask has these rows (1 = real token, 0 = padding)."""
    mask = torch.tensor(mask_rows)
    return {"input_ids": torch.ones_like(mask) * 5, "attention_mask": mask}


def args_for(tmp_path, **kw):
    return TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kw)


# ---------------------------------------------------------------- TokenCounter


def test_token_counter_counts_real_tokens_from_the_attention_mask():
    counter = TokenCounter()
    counter.add(batch([[1, 1, 1, 0], [1, 0, 0, 0]]))
    counter.add(batch([[1, 1, 1, 1], [1, 1, 0, 0]]))
    assert counter.read() == (10.0, 16)


def test_a_padding_free_batch_counts_every_id():
    counter = TokenCounter()
    counter.add({"input_ids": torch.arange(12).reshape(1, 12), "position_ids": torch.arange(12).reshape(1, 12)})
    assert counter.read() == (12.0, 12)


def test_the_real_count_stays_a_tensor_until_read():
    counter = TokenCounter()
    for _ in range(3):
        counter.add(batch([[1, 1, 0]]))
        assert isinstance(counter.real, torch.Tensor)
    assert counter.read() == (6.0, 9)


def test_adding_never_reads_the_count_back_from_the_device():
    # Meta tensors have no values: any .item()/float()/bool() in add() (a device sync on a GPU) would raise here.
    counter = TokenCounter()
    for _ in range(3):
        counter.add(
            {
                "input_ids": torch.ones(2, 8, dtype=torch.long, device="meta"),
                "attention_mask": torch.ones(2, 8, dtype=torch.long, device="meta"),
            }
        )
    assert counter.real.device.type == "meta"
    assert counter.slots == 48
    with pytest.raises(RuntimeError, match="meta tensors"):
        counter.read()  # reading is where the value crosses to the host


# ---------------------------------------------------------------- Metrics


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


class Held:
    """What Metrics reads of its trainer: the arguments."""

    def __init__(self, tmp_path, **kw):
        self.args = args_for(tmp_path, **kw)


def log(metrics, args, state, control, logs):
    """As the trainer's log() does it: enrich, then the callbacks."""
    metrics.enrich(logs, state)
    metrics.on_log(args, state, control, logs=logs)


def test_metrics_writes_one_record_per_logging_step_with_token_throughput(tmp_path):
    counter, path = TokenCounter(), tmp_path / "metrics.jsonl"
    metrics = Metrics(counter, path, Held(tmp_path, max_grad_norm=0.5))
    args, state, control = args_for(tmp_path), TrainerState(), TrainerControl()
    metrics.on_train_begin(args, state, control)

    counter.add(batch([[1] * 1000, [0] * 1000]))  # 1000 real of 2000 slots
    state.global_step = 10
    log(metrics, args, state, control, {"loss": 2.5, "learning_rate": 1e-3})
    time.sleep(0.2)
    counter.add(batch([[1] * 10 + [0] * 990, [0] * 1000]))  # 10 more real tokens
    state.global_step = 20
    log(metrics, args, state, control, {"loss": 2.0, "learning_rate": 1e-3})

    first, second = records(path)
    assert (first["step"], second["step"]) == (10, 20)
    assert (first["loss"], second["loss"]) == (2.5, 2.0)
    assert (first["tokens_seen"], second["tokens_seen"]) == (1000, 1010)
    assert first["padding_fraction"] == 0.5
    assert second["padding_fraction"] == round(1 - 1010 / 4000, 4)
    assert first["tokens_per_second"] > 0
    # the rate is over the interval since the last log (10 tokens in >= 0.2 s), not the whole run
    assert 0 < second["tokens_per_second"] <= 10 / 0.2
    # the step's wall time over the interval's 10 steps, the clipping threshold, and this process's memory
    assert 0.02 <= second["step_time_s"] < 1 and second["max_grad_norm"] == 0.5
    assert 0.01 < second["host_rss_gib"] < 64 and second["host_rss_rank"] == 0
    assert "memory_allocated_gib" not in second  # no CUDA here: host RSS is the memory curve


def test_metrics_adds_the_token_fields_to_the_logs_the_other_callbacks_see(tmp_path):
    counter = TokenCounter()
    metrics = Metrics(counter, tmp_path / "metrics.jsonl", Held(tmp_path))
    args, state, control = args_for(tmp_path), TrainerState(), TrainerControl()
    metrics.on_train_begin(args, state, control)
    counter.add(batch([[1, 1, 1, 0]]))
    logs = {"loss": 1.0}
    metrics.enrich(logs, state)
    assert logs["tokens_seen"] == 3 and logs["padding_fraction"] == 0.25 and "tokens_per_second" in logs


def test_an_eval_log_is_recorded_without_token_fields(tmp_path):
    path = tmp_path / "metrics.jsonl"
    metrics = Metrics(TokenCounter(), path, Held(tmp_path))
    args, state, control = args_for(tmp_path), TrainerState(global_step=5), TrainerControl()
    metrics.on_train_begin(args, state, control)
    log(metrics, args, state, control, {"eval_loss": 0.75})
    [record] = records(path)
    assert record["step"] == 5 and record["eval_loss"] == 0.75 and "tokens_seen" not in record


def test_only_rank_0_writes_the_metrics_log(tmp_path):
    counter, path = TokenCounter(), tmp_path / "metrics.jsonl"
    metrics = Metrics(counter, path, Held(tmp_path))
    args, control = args_for(tmp_path), TrainerControl()
    state = TrainerState(is_world_process_zero=False, global_step=1)
    metrics.on_train_begin(args, state, control)
    counter.add(batch([[1, 1]]))
    log(metrics, args, state, control, {"loss": 1.0})
    assert not path.exists()


# ---------------------------------------------------------------- StepLines


def test_step_lines_print_one_concise_line_per_logging_step(tmp_path, capsys):
    lines = StepLines()
    args, control = args_for(tmp_path), TrainerControl()
    state = TrainerState(global_step=3, max_steps=10)
    lines.on_log(
        args,
        state,
        control,
        logs={"loss": 1.23451, "grad_norm": 0.5, "learning_rate": 0.001, "tokens_per_second": 1234.4, "epoch": 0.3},
    )
    assert capsys.readouterr().out == "step 3/10  loss 1.2345  grad_norm 0.500  lr 0.001  tok/s 1234\n"


def test_step_lines_leave_out_what_was_not_logged(tmp_path, capsys):
    state = TrainerState(global_step=3, max_steps=10)
    StepLines().on_log(args_for(tmp_path), state, TrainerControl(), logs={"loss": 2.0, "grad_norm": None})
    assert capsys.readouterr().out == "step 3/10  loss 2.0000  lr 0\n"


def test_step_lines_print_an_eval_line(tmp_path, capsys):
    state = TrainerState(global_step=30, max_steps=60)
    StepLines().on_log(args_for(tmp_path), state, TrainerControl(), logs={"eval_loss": 0.98765, "eval_runtime": 1.0})
    assert capsys.readouterr().out == "step 30/60  eval_loss 0.9877\n"


def test_step_lines_print_nothing_on_other_ranks_or_for_other_logs(tmp_path, capsys):
    args, control = args_for(tmp_path), TrainerControl()
    StepLines().on_log(
        args, TrainerState(is_world_process_zero=False, global_step=1, max_steps=2), control, logs={"loss": 1.0}
    )
    StepLines().on_log(args, TrainerState(global_step=2, max_steps=2), control, logs={"train_runtime": 3.0})
    StepLines().on_log(args, TrainerState(global_step=2, max_steps=2), control, logs=None)
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------- StopAfter and CompleteCheckpoints


def test_stop_after_saves_and_stops_at_its_step(tmp_path):
    stop, args = StopAfter(3), args_for(tmp_path)
    for step in (1, 2):
        control = TrainerControl()
        stop.on_step_end(args, TrainerState(global_step=step), control)
        assert not control.should_save and not control.should_training_stop
    control = TrainerControl()
    stop.on_step_end(args, TrainerState(global_step=3), control)
    assert control.should_save and control.should_training_stop


def test_complete_checkpoints_marks_the_saved_checkpoint(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-2").mkdir()
    CompleteCheckpoints().on_save(args_for(tmp_path), TrainerState(global_step=4), TrainerControl())
    assert is_complete(tmp_path / "checkpoint-4")
    assert not is_complete(tmp_path / "checkpoint-2")
    assert (tmp_path / "checkpoint-4" / MARKER).read_text() == "4\n"


def test_complete_checkpoints_marks_nothing_without_the_folder_or_off_rank_0(tmp_path):
    CompleteCheckpoints().on_save(args_for(tmp_path), TrainerState(global_step=6), TrainerControl())
    assert not (tmp_path / "checkpoint-6").exists()  # no folder is created for a save that did not happen
    (tmp_path / "checkpoint-6").mkdir()
    CompleteCheckpoints().on_save(
        args_for(tmp_path), TrainerState(global_step=6, is_world_process_zero=False), TrainerControl()
    )
    assert not is_complete(tmp_path / "checkpoint-6")


# ---------------------------------------------------------------- a real Trainer


class Rows(torch.utils.data.Dataset):
    """Rows of 8 ids, the last `pad` of them padding."""

    def __init__(self, pads):
        self.pads = pads

    def __len__(self):
        return len(self.pads)

    def __getitem__(self, i):
        mask = torch.tensor([1] * (8 - self.pads[i]) + [0] * self.pads[i])
        ids = torch.arange(1, 9) * mask
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class CountingTrainer(MetricsInLogs, transformers.Trainer):
    """Counts the micro-batches it trains on, as the recipe's trainer does."""

    def compute_loss(self, model, inputs, *a, **kw):
        result = super().compute_loss(model, inputs, *a, **kw)
        if model.training:
            self.counter.add(inputs)
        return result


class Seen(transformers.TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs.append(dict(logs))


def test_a_real_trainer_logs_marks_its_checkpoint_and_stops_after_the_step(tmp_path, capsys):
    model = tiny_qwen2()
    out = tmp_path / "run"
    args = TrainingArguments(
        output_dir=str(out),
        report_to="none",
        use_cpu=True,
        max_steps=10,
        logging_steps=1,
        save_steps=100,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        disable_tqdm=True,
        save_only_model=True,
    )
    counter = TokenCounter()
    seen = Seen()  # at construction, as report_to's wandb and tensorboard callbacks are: before ours
    trainer = CountingTrainer(model=model, args=args, train_dataset=Rows([3] * 6), callbacks=[seen])
    trainer.counter = counter
    trainer.sftdoctor_metrics = Metrics(counter, tmp_path / "metrics.jsonl", trainer)
    trainer.add_callback(trainer.sftdoctor_metrics)
    trainer.add_callback(StepLines())
    trainer.add_callback(CompleteCheckpoints())
    trainer.add_callback(StopAfter(2))
    trainer.train()

    assert trainer.state.global_step == 2
    assert newest_complete(out) == out / "checkpoint-2"
    steps = [r for r in records(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # each micro-batch is 2 rows of 8 ids, 3 of them padding: 10 real tokens of 16 per step
    assert [r["tokens_seen"] for r in steps] == [10, 20]
    assert [r["padding_fraction"] for r in steps] == [0.375, 0.375]
    # what metrics.jsonl holds, a wandb or tensorboard callback got too: the same values in the same logs
    assert [
        {k: logs[k] for k in ("tokens_seen", "step_time_s", "host_rss_gib", "max_grad_norm")} for logs in seen.logs
    ] == [{k: r[k] for k in ("tokens_seen", "step_time_s", "host_rss_gib", "max_grad_norm")} for r in steps]
    assert all(r["grad_norm"] > 0 and r["max_grad_norm"] == 1.0 for r in steps)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert printed[0].startswith("step 1/10  loss ") and printed[1].startswith("step 2/10  loss ")
