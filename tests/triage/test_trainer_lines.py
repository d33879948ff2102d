"""sftdoctor.triage.trainer_lines: the loss, gradient norm and step of a line in any trainer's format, written
from each trainer's logging code (the format strings are quoted in the module's docstring)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sftdoctor.triage import trainer_lines


@pytest.mark.parametrize(
    "line, expected",
    [
        # Megatron-LM training_log: ' {}: {:.6E} |' for losses, ' grad norm: {:.3f} |'
        (
            " iteration      100/    1000 | lm loss: NAN | loss scale: 1.0 | grad norm: nan |",
            {"loss": "NAN", "loss_key": "lm loss", "grad_norm": "nan", "grad_norm_key": "grad norm"},
        ),
        # nanoGPT train.py: f"iter {iter_num}: loss {lossf:.4f}, time ...";
        # estimate_loss: "step N: train loss X, val loss Y"
        ("iter 3010: loss nan, time 1099.34ms, mfu 15.34%", {"loss": "nan", "loss_key": "loss"}),
        ("step 1000: train loss 2.3, val loss nan", {"loss": "nan", "loss_key": "val loss"}),
        # litgpt finetune: f"iter {i} step {s}: loss {loss:.4f}"; later "loss train: {:.3f}, val: {}"
        (
            "Epoch 1 | iter 46 step 1 | loss train: inf, val: n/a | iter time: 45.73 ms",
            {"loss": "inf", "loss_key": "loss train"},
        ),
        # Lightning / tqdm postfix
        (
            "Epoch 0:  19%|█▉  | 2013/10572 [3:51:13<16:23:08,  6.89s/it, loss=nan, v_num=11]",
            {"loss": "nan", "loss_key": "loss"},
        ),
        # Lightning 2.x's TQDMProgressBar.format_num pads a float to five characters
        (
            "Epoch 0:  12%|█▏  | 60/500 [00:10<01:15, 5.80it/s, v_num=0, train_loss=nan.0]",
            {"loss": "nan.0", "loss_key": "train_loss"},
        ),
        (
            "{'loss': np.float64(nan), 'grad_norm': np.float64(inf)}",
            {"loss": "nan", "loss_key": "loss", "grad_norm": "inf", "grad_norm_key": "grad_norm"},
        ),
        # torchtune: the bar's description f"{epoch}|{step}|Loss: {loss}";
        # its metric logger "loss:nan grad_norm:tensor(nan, ...)"
        ("1|25|Loss: nan:  12%|█▏ | 25/200", {"loss": "nan", "loss_key": "Loss"}),
        (
            "Step 25 | loss:1.25 lr:2e-05 grad_norm:tensor(nan, device='cuda:0')",
            {"loss": "1.25", "loss_key": "loss", "grad_norm": "nan", "grad_norm_key": "grad_norm"},
        ),
        # mmengine (xtuner): two spaces between "key: value" pairs
        (
            "Epoch(train) [1][240/735]  lr: 1.9813e-04  loss: 2.5128  grad_norm: nan",
            {"loss": "2.5128", "loss_key": "loss", "grad_norm": "nan", "grad_norm_key": "grad_norm"},
        ),
        # fairseq's JSON stats: values as strings, gnorm for the gradient norm
        (
            '{"epoch": 73, "train_loss": "nan", "train_gnorm": "inf", "train_loss_scale": null}',
            {"loss": "nan", "loss_key": "train_loss", "grad_norm": "inf", "grad_norm_key": "train_gnorm"},
        ),
        # verl, DeepSpeed-Chat: "key:value" joined by " - " or "|"
        (
            "step:2 - train/loss:nan - train/grad_norm:0.0",
            {"loss": "nan", "loss_key": "train/loss", "grad_norm": "0.0", "grad_norm_key": "train/grad_norm"},
        ),
        ("epoch: 0|step: 3184|ppo_ep: 1|act_loss: inf|cri_loss: inf", {"loss": "inf", "loss_key": "act_loss"}),
        # plain prints: "loss = nan", "loss is nan", a tensor, JSON's NaN/Infinity
        ("ERROR:tensorflow:Model diverged with loss = NaN.", {"loss": "NaN", "loss_key": "loss"}),
        ("the loss is nan, stopping", {"loss": "nan", "loss_key": "loss"}),
        ("loss: tensor(-inf, device='cuda:0', grad_fn=<NllLossBackward0>)", {"loss": "-inf", "loss_key": "loss"}),
        ('{"loss": Infinity}', {"loss": "Infinity", "loss_key": "loss"}),
    ],
)
def test_each_trainers_loss_line_gives_its_key_and_value(line, expected):
    assert trainer_lines.fields(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        " iteration 5 | lm loss: 2.504220E+00 | loss scale: inf | grad norm: 0.231 |",  # the fp16 scale, not a loss
        "epoch 001:      2 / 78 loss_scale=inf, train_wall=0",
        "iter 0: loss 4.2627, ppl 71.0037, time 3286.79ms",
        "Epoch 1 | iter 46 step 1 | loss train: 3.724, val: n/a",
        "NCCL INFO loss of connection to nanode7: retrying with infiniband",
        "nanoGPT: loss 2.1 on finance data",
    ],
)
def test_a_finite_line_or_a_nan_word_that_is_no_value_is_not_non_finite(line):
    found = trainer_lines.fields(line)
    assert not any(trainer_lines.non_finite(found.get(kind)) for kind in ("loss", "grad_norm")), found


def test_the_fp16_loss_scale_is_no_loss():
    """fairseq's warm-up lines carry only `loss_scale=32`: no loss to trend, whatever its value."""
    assert trainer_lines.fields("epoch 001:      2 / 78 loss_scale=32, train_wall=0, wall=6") == {}


@pytest.mark.parametrize(
    "line, expected",
    [
        (" iteration     5426/  250000 | consumed samples:  43408 |", ("iteration", 5426)),
        ("iter 2920: loss 3.9883", ("iter", 2920)),
        ("Epoch 1 | iter 16 step 1 | loss train: nan", ("step", 1)),  # litgpt's optimizer step
        ("step:2 - train/loss:nan", ("step", 2)),
        ("Step: 20, Loss: nan, Val Loss: nan", ("step", 20)),
        ("{'loss': nan, 'step': 10}", ("step", 10)),
        ('"train_num_updates": "9291"', ("update", 9291)),
        ("Epoch(train) [1][240/735]  lr: 1.9813e-04", ("step", 240)),
        ("1|25|Loss: nan:  12%", ("step", 25)),
        ("Epoch 0:  19%|█▉  | 2013/10572 [3:51:13<16:23:08, loss=nan]", ("step", 2013)),
        ("2025-02-20 00:46:13 DEBUG TRAIN Batch 7/100 loss nan", None),  # CosyVoice: epoch 7, batch 100
        ("max_steps=1000 total_steps 5", None),
    ],
)
def test_the_step_is_read_where_each_trainer_prints_it(line, expected):
    assert trainer_lines.step(line) == expected


def test_a_megatron_line_gives_its_fields_and_its_losses_without_the_loss_scale():
    line = (
        " iteration      122/  250000 | consumed samples:       124928 | learning rate: 9.150E-06 | lm loss: "
        "2.504220E+00 | loss scale: 1.0 | grad norm: 0.231 | number of skipped iterations:   0 | number of nan "
        "iterations:   0 |"
    )
    fields = trainer_lines.megatron(line)
    assert fields["iteration"] == "122" and fields["lm loss"] == "2.504220E+00"
    assert trainer_lines.megatron_losses(fields) == ["lm loss"]
    assert trainer_lines.count(fields, "number of skipped iterations") == 0
    assert trainer_lines.megatron("iter 5: loss 2.0") is None


@pytest.mark.parametrize("width", [50, 80])
def test_a_megatron_entry_wrapped_at_a_space_or_mid_word_is_read_whole(width):
    line = (
        " iteration        9/      10 | consumed samples:          108 | loss scale: 1.0 | number of skipped "
        "iterations:   0 | number of nan iterations:   0 |"
    )
    hard = [line[i : i + width] for i in range(0, len(line), width)]
    for lines in (hard, line.replace(" | ", " |\n").split("\n")):
        fields = trainer_lines.megatron_entry(
            trainer_lines.entry(lines[0], lines[1:] + [" iteration       10/      10 |"])
        )
        assert trainer_lines.count(fields, "number of skipped iterations") == 0, lines
        assert trainer_lines.count(fields, "number of nan iterations") == 0


@pytest.mark.parametrize(
    "line, starts",
    [
        ("2020-10-01 10:25:50 | INFO | train | {", True),
        ("10/30 22:19:57 - mmengine - INFO", True),
        ("[INFO|trainer.py:2134] >> Saving", True),
        ("INFO:root:step", True),
        (" iteration 5/ 10 |", True),
        ("[00:15<4:04:50,  4.79s/it]", False),
        ('rain_nll_loss": "nan"', False),
        ("grad_norm: nan", False),
    ],
)
def test_a_line_that_starts_its_own_record_is_told_from_a_wrapped_continuation(line, starts):
    assert trainer_lines.starts_entry(line) is starts


@given(st.text(max_size=400))
@settings(max_examples=300, deadline=None)
def test_any_text_gives_values_taken_from_it(text):
    for found in trainer_lines.values(text):
        assert found.value in text and found.key.strip() and text.find(found.key, found.start) >= 0
    trainer_lines.step(text)
    trainer_lines.megatron(text)


@pytest.mark.parametrize(
    "value, bad",
    [
        ("nan", True),
        ("NAN", True),
        ("-inf", True),
        ("Infinity", True),
        ("nan.0", True),
        ("-inf.", True),
        ("2.5128", False),
        ("0.0", False),
        ("n/a", False),
        (None, False),
    ],
)
def test_non_finite_values_as_each_printer_renders_them(value, bad):
    assert trainer_lines.non_finite(value) is bad
