"""Tracing a non-finite step to its rows: a batch's sequences found among the tokenized rows, and the verdict
over the ranks' fp32 re-runs. The end-to-end drill is in test_watch.py (nan-row, on 2 ranks)."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from trainrun import tiny_qwen2

from sftdoctor.checks.runtime import rows_said
from sftdoctor.train.rows import RowIndex, rerun, sequences, verdict


def test_a_padded_batch_is_cut_by_its_attention_mask_and_a_packed_one_where_positions_restart():
    padded = {
        "input_ids": torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
        "labels": torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]]),
    }
    assert [(b, t.tolist(), labels.tolist()) for b, t, labels in sequences(padded)] == [
        (0, [1, 2, 3], [1, 2, 3]),
        (1, [4, 5], [4, 5]),
    ]
    packed = {
        "input_ids": torch.tensor([[1, 2, 3, 4, 5, 6]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0]]),
        "labels": torch.tensor([[-100, 2, 3, -100, 5, -100]]),
    }
    assert [t.tolist() for _, t, _ in sequences(packed)] == [[1, 2, 3], [4, 5], [6]]


def index(rows_ids, numbers, max_length=None, chunks=2):
    half = len(rows_ids) // chunks
    column = pa.chunked_array(
        [pa.array(rows_ids[:half], pa.list_(pa.int64())), pa.array(rows_ids[half:], pa.list_(pa.int64()))]
    )
    return RowIndex(column, np.asarray(numbers), max_length)


def test_a_sequence_is_found_by_its_tokens_across_chunks_cut_at_max_length():
    rows = index([[1, 2, 3], [1, 2, 4], [7, 8, 9, 10, 11], [1, 2, 3]], [40, 41, 42, 43], max_length=4)
    assert rows.find(torch.tensor([1, 2, 4])) == [41]
    assert rows.find(torch.tensor([7, 8, 9, 10])) == [42]  # TRL's packing keeps a long row's first max_length
    assert rows.find(torch.tensor([1, 2, 3])) == [40, 43]  # the same tokens twice: both rows named
    assert rows.find(torch.tensor([9, 9])) == []


def batch(rows, fp32, targets=10, alone=None):
    return {"rows": rows, "targets": targets, "fp32": fp32, **({"alone": alone} if alone is not None else {})}


FINE = {"targets": 10, "loss": 2.0, "finite": True}
BAD = {"targets": 10, "loss": float("nan"), "finite": False}


def test_the_verdict_names_the_rows_non_finite_alone_in_fp32():
    ranks = {
        "0": {"fp32": True, "micro_batches": [batch(["a line 1", "a line 2"], FINE)]},
        "1": {"fp32": True, "micro_batches": [batch(["a line 3", "a line 4"], BAD, alone=[FINE, BAD])]},
    }
    v = verdict(ranks, "bf16")
    assert v == {"verdict": "rows", "again": ["rank 1 micro-batch 1"], "culprits": ["a line 4"]}
    said = rows_said({"ranks": ranks, **v})
    assert said[0] == "traced to a line 4"
    assert "Rank 0 micro-batch 1: a line 1; a line 2 (finite in fp32)." in said


def test_all_finite_in_fp32_is_numerics_for_a_bf16_run_and_not_reproduced_for_an_fp32_one():
    ranks = {"0": {"fp32": True, "micro_batches": [batch(["a line 1"], FINE)]}}
    assert verdict(ranks, "bf16")["verdict"] == "numerics"
    assert rows_said({"ranks": ranks, **verdict(ranks, "bf16")})[0] == "finite in fp32: numerics, not the rows"
    assert verdict(ranks, "fp32")["verdict"] == "not-reproduced"


def test_no_fp32_re_run_is_unknown_never_numerics():
    ranks = {
        "0": {
            "fp32": False,
            "why_not_fp32": "an fp32 copy needs 28.0 GiB, 3.1 GiB free",
            "micro_batches": [batch(["a line 1"], None)],
        }
    }
    v = verdict(ranks, "bf16")
    assert v["verdict"] == "unknown" and "28.0 GiB" in rows_said({"ranks": ranks, **v})[-1]
    failed = {"0": {"fp32": True, "micro_batches": [batch(["a line 1"], {"error": "RuntimeError: boom"})]}}
    assert verdict(failed, "bf16")["verdict"] == "unknown"


def test_a_step_with_no_target_token_anywhere_is_its_rows():
    empty = {"targets": 0}
    ranks = {
        "0": {"fp32": True, "micro_batches": [batch(["a line 1", "a line 2"], empty, targets=0)]},
        "1": {"fp32": True, "micro_batches": [batch(["a line 3"], empty, targets=0)]},
    }
    v = verdict(ranks, "bf16")
    assert v["verdict"] == "rows" and v["empty"] and v["culprits"] == ["a line 1", "a line 2", "a line 3"]
    assert rows_said({"ranks": ranks, **v})[0] == "no target token in the step's 3 rows"
    # one rank's empty micro-batch in an otherwise fine step is not the cause (the others' tokens count)
    ranks["1"]["micro_batches"] = [batch(["a line 3"], FINE)]
    assert verdict(ranks, "bf16")["verdict"] == "numerics"


@pytest.fixture(scope="module")
def model():
    return tiny_qwen2()


def test_rerun_says_whether_the_loss_and_gradients_are_finite_and_leaves_no_gradient(model):
    ids = torch.randint(0, 64, (1, 10))
    fine = rerun(model, {"input_ids": ids, "labels": ids}, backward=True)
    assert fine["finite"] and 0 < fine["grad_norm"] < float("inf") and fine["targets"] == 9
    assert all(p.grad is None for p in model.parameters())
    embed = model.get_input_embeddings()
    handle = embed.register_forward_hook(
        lambda m, a, out: out.masked_fill((a[0] == ids[0, 3])[..., None], float("inf"))
    )
    try:
        assert rerun(model, {"input_ids": ids, "labels": ids}, backward=False)["finite"] is False
    finally:
        handle.remove()
    assert rerun(model, {"input_ids": ids, "labels": torch.full_like(ids, -100)}, backward=True) == {"targets": 0}
