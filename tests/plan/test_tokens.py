"""The dataset's token count and the run's steps (plan/tokens.py): rows rendered as the trainer renders them,
tokenized with the run's tokenizer on the tiny example, and steps for packed, unpacked and uncounted data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import make_run, plan_of

from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.trainer_inputs import row_text
from sftdoctor.plan.tokens import SAMPLE, dataset_tokens, steps_and_tokens

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "examples" / "tiny" / "model"
TINY_TRAIN = ROOT / "examples" / "tiny" / "data" / "train.jsonl"
CHAT = [{"role": "user", "content": "sort: b a"}, {"role": "assistant", "content": "a b"}]


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(TINY_MODEL)


@pytest.fixture
def plain_tokenizer(tokenizer):
    """The tiny tokenizer without its chat template."""
    saved, tokenizer.chat_template = tokenizer.chat_template, None
    yield tokenizer
    tokenizer.chat_template = saved


def tiny_plan(tmp_path, max_length=256, model=TINY_MODEL, train=(TINY_TRAIN,), tokenizer=None, **training):
    """The Plan of a run on the tiny example's data (packing off: no probe in a child process)."""
    lines = ["[model]", f'path = "{model}"', 'weights = "random"'] + (
        [f'tokenizer = "{tokenizer}"'] if tokenizer else []
    )
    lines += [
        "[data]",
        "train = [" + ", ".join(f'"{t}"' for t in train) + "]",
        f"max_length = {max_length}",
        "[training]",
        "packing = false",
        "global_batch_size = 16",
        "per_device_batch_size = 8",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in training.items()]
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    facts = Facts(Inputs(config=path))
    plan = facts.get("plan")
    assert plan is not None, facts.why_missing("plan")
    return plan


def tiny_rows(n=None):
    rows = [json.loads(line) for line in TINY_TRAIN.read_text().splitlines() if line.strip()]
    return rows[:n] if n else rows


# ---------------------------------------------------------------- row_text


def test_messages_are_rendered_with_the_chat_template(tokenizer):
    assert (
        row_text({"messages": CHAT}, tokenizer, "messages")
        == "<|im_start|>user\nsort: b a<|im_end|>\n<|im_start|>assistant\na b<|im_end|>\n"
    )


def test_messages_without_a_chat_template_are_their_contents_a_line_each(plain_tokenizer):
    assert row_text({"messages": CHAT}, plain_tokenizer, "messages") == "sort: b a\na b"


def test_prompt_and_completion_are_joined_as_the_trainer_joins_them(tokenizer):
    assert row_text({"prompt": "2+2=", "completion": "4"}, tokenizer, "prompt_completion") == "2+2=4"
    assert row_text({"prompt": "only a prompt"}, tokenizer, "prompt_completion") == "only a prompt"


def test_text_rows_are_their_text(tokenizer):
    assert row_text({"text": "hello world"}, tokenizer, "text") == "hello world"
    # a text row's other keys are not trained, whatever they look like
    assert row_text({"text": "a", "messages": 5, "prompt": [1]}, tokenizer, "text") == "a"


def test_conversational_prompt_and_completion_are_rendered_with_the_chat_template(tokenizer):
    row = {"prompt": CHAT[:1], "completion": CHAT[1:]}
    assert row_text(row, tokenizer, "prompt_completion") == tokenizer.apply_chat_template(CHAT, tokenize=False)


# ---------------------------------------------------------------- dataset_tokens on the tiny example


def test_the_tiny_example_is_counted_with_its_tokenizer(tmp_path, tokenizer):
    plan = tiny_plan(tmp_path, max_length=256)
    counted = dataset_tokens(plan)
    rows = tiny_rows()
    assert counted["rows"] == len(rows) == 1200
    assert counted["sampled_rows"] == SAMPLE
    # the trainer's own tokenization of the same rows: the chat template, tokenized
    lengths = [
        len(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=False)) for r in rows[:SAMPLE]
    ]
    assert counted["mean_tokens"] == pytest.approx(sum(lengths) / SAMPLE)
    assert 15 <= counted["mean_tokens"] <= 60  # short string tasks: tens of tokens a row
    assert counted["tokens"] == int(counted["mean_tokens"] * 1200)


def test_row_lengths_are_capped_at_max_length(tmp_path):
    long = dataset_tokens(tiny_plan(tmp_path, max_length=256))
    short = dataset_tokens(tiny_plan(tmp_path, max_length=16))
    assert short["mean_tokens"] <= 16 < long["mean_tokens"]
    assert short["mean_tokens"] > 15  # nearly every row is longer than 16 tokens: each counts as 16
    assert short["rows"] == long["rows"]


def test_rows_of_every_train_file_are_counted(tmp_path):
    head = tmp_path / "head.jsonl"
    head.write_text("\n".join(json.dumps(r) for r in tiny_rows(10)) + "\n")
    counted = dataset_tokens(tiny_plan(tmp_path, train=(TINY_TRAIN, head)))
    assert counted["rows"] == 1210
    assert counted["sampled_rows"] == SAMPLE + 10


def test_a_small_sample_is_what_gets_tokenized(tmp_path):
    counted = dataset_tokens(tiny_plan(tmp_path), sample=8)
    assert (counted["rows"], counted["sampled_rows"]) == (1200, 8)


@pytest.mark.parametrize("files", ["none", "a broken tokenizer.json"])
def test_no_token_count_when_the_tokenizer_cannot_load(tmp_path, files):
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    if files != "none":
        (tokenizer / "tokenizer_config.json").write_text((TINY_MODEL / "tokenizer_config.json").read_text())
        (tokenizer / "tokenizer.json").write_text('{"version": "1.0", "model": ')  # a download cut short
    plan = tiny_plan(tmp_path, tokenizer=str(tokenizer))
    assert plan.tokenizer_path == str(tokenizer)
    assert dataset_tokens(plan) is None
    assert "upper bound" in steps_and_tokens(dataset_tokens(plan), plan)["token_basis"]


def test_a_model_folder_without_tokenizer_files_gives_no_token_count(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((TINY_MODEL / "config.json").read_text())  # weights = "random": no files
    plan = tiny_plan(tmp_path, model=model)
    assert dataset_tokens(plan) is None


# ---------------------------------------------------------------- steps_and_tokens


def plan_for(tmp_path, rows=1000, **training):
    return plan_of(
        make_run(
            tmp_path,
            data={"max_length": 1024},
            training={"global_batch_size": 8, "per_device_batch_size": 8, **training},
        ),
        data={"train": {"rows": rows, "shape": "text", "files": ["d.jsonl"]}},
    )


COUNTED = {"rows": 1000, "sampled_rows": 256, "mean_tokens": 100.0, "tokens": 100_000}


def test_without_a_token_count_every_row_is_a_full_row(tmp_path):
    plan = plan_for(tmp_path, packing=False)
    got = steps_and_tokens(None, plan)
    assert got["tokens_per_step"] == 8 * 1024
    assert got["steps"] == math.ceil(1000 / 8) == 125
    assert "upper bound" in got["token_basis"]


def test_unpacked_rows_keep_their_length(tmp_path):
    got = steps_and_tokens(COUNTED, plan_for(tmp_path, packing=False))
    assert got["tokens_per_step"] == 8 * 100
    assert got["steps"] == 125  # one row per sample: as many steps as the upper bound
    assert got["token_basis"] == "100 tokens per row on average (from 256 rows tokenized)"


def test_packed_rows_are_full_rows_of_max_length_and_fewer_steps(tmp_path):
    got = steps_and_tokens(COUNTED, plan_for(tmp_path, packing=True))
    assert got["tokens_per_step"] == 8 * 1024
    assert got["steps"] == math.ceil(math.ceil(100_000 / 1024) / 8) == 13
    assert got["token_basis"].startswith("100,000 tokens packed into rows of 1024")


def test_the_upper_bound_is_never_below_the_counted_tokens_per_step(tmp_path):
    (tmp_path / "u").mkdir(), (tmp_path / "p").mkdir()
    unpacked, packed = plan_for(tmp_path / "u", packing=False), plan_for(tmp_path / "p", packing=True)
    bound = steps_and_tokens(None, unpacked)
    assert bound["tokens_per_step"] >= steps_and_tokens(COUNTED, unpacked)["tokens_per_step"]
    assert bound["steps"] >= steps_and_tokens(COUNTED, packed)["steps"]


def test_epochs_and_a_held_out_fraction_scale_the_steps(tmp_path):
    plan = plan_of(
        make_run(
            tmp_path,
            data={"max_length": 1024, "eval_fraction": 0.2},
            training={"global_batch_size": 8, "per_device_batch_size": 8, "epochs": 3, "packing": False},
        ),
        data={"train": {"rows": 1000, "shape": "text", "files": ["d.jsonl"]}},
    )
    assert steps_and_tokens(COUNTED, plan)["steps"] == math.ceil(3 * 1000 * 0.8 / 8) == 300


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("counted", [None, COUNTED])
def test_max_steps_wins(tmp_path, packing, counted):
    assert steps_and_tokens(counted, plan_for(tmp_path, packing=packing, max_steps=7))["steps"] == 7


def test_no_rows_known_and_no_count_means_no_step_count(tmp_path):
    plan = plan_of(make_run(tmp_path, training={"packing": False}))
    assert plan.data_rows is None
    assert steps_and_tokens(None, plan)["steps"] is None


def test_the_tiny_examples_steps_from_its_own_token_count(tmp_path):
    plan = tiny_plan(tmp_path, max_length=256, epochs=2)
    got = steps_and_tokens(dataset_tokens(plan), plan)
    assert got["steps"] == math.ceil(2 * 1200 / 16) == 150
    assert 16 * 15 <= got["tokens_per_step"] <= 16 * 60
