"""untrained-tokens on the token_rows fact as the child reports it: only a row read whole and finite is called
trained; a NaN/inf row, a token id beyond the table and a checkpoint whose rows cannot be read are findings of
their own, and a repair asked of rows that cannot be read stops the run."""

import math

import pytest
from conftest import make_run, severities


def table(vocab=384, **rows):
    """{"rows"} as read_rows gives them: (id, max_abs, norm), or "nan" (a row holding NaN/inf), or "outside"."""
    made = {}
    for token, row in rows.items():
        if row == "outside":
            made[token] = {"id": vocab + 7, "outside": vocab}
        elif isinstance(row, tuple) and row[1] == "nan":
            made[token] = {"id": row[0], "non_finite": 64}
        else:
            made[token] = {"id": row[0], "max_abs": row[1], "norm": row[2]}
    return {
        "rows": made,
        "median_norm": 8.0,
        "vocab": vocab,
        "non_finite_rows": [],
        "tensor": "model.embed_tokens.weight",
        "file": "m/model.safetensors",
    }


def test_trained_rows_pass_and_name_each_token(run):
    [finding] = run(
        "untrained-tokens", token_rows={"input": table(**{"<|im_start|>": (1, 0.9, 7.0), "<|im_end|>": (2, 0.8, 7.5)})}
    )
    assert finding.severity.value == "ok"
    assert finding.title == "2 template token(s) have trained embedding rows: <|im_start|>, <|im_end|>"


def test_a_row_holding_nan_or_inf_is_a_broken_checkpoint_not_a_trained_row(run):
    findings = run(
        "untrained-tokens", token_rows={"input": table(**{"<|im_start|>": (1, "nan"), "<|im_end|>": (2, 0.8, 7.5)})}
    )
    assert severities(findings) == ["error"]
    assert findings[0].title == "input embedding row 1 (token '<|im_start|>') holds NaN/inf: the checkpoint is broken"
    assert "re-download" in findings[0].fix and "m/model.safetensors" in findings[0].detail


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_statistics_from_an_older_fact_are_never_trained(run, value):
    rows = table(**{"<|im_end|>": (2, value, value)})
    findings = run("untrained-tokens", token_rows={"input": rows})
    assert severities(findings) == ["error"] and "holds NaN/inf" in findings[0].title


def test_ordinary_rows_holding_nan_break_the_checkpoint_too(run):
    rows = table(**{"<|im_end|>": (2, 0.8, 7.5)})
    rows["non_finite_rows"] = [17, 300]
    findings = run("untrained-tokens", token_rows={"input": rows})
    assert [f.title for f in findings] == ["input embedding rows 17, 300 hold NaN/inf: the checkpoint is broken"]


def test_a_token_id_beyond_the_table_is_a_disagreement_not_a_trained_row(run):
    findings = run(
        "untrained-tokens", token_rows={"input": table(**{"<|im_start|>": "outside", "<|im_end|>": (2, 0.8, 7.5)})}
    )
    assert severities(findings) == ["error"]
    assert findings[0].title == (
        "1 template token(s) have no row in the input embedding, which has 384 rows: '<|im_start|>' (id 391)"
    )
    assert "resize_token_embeddings" in findings[0].fix and "[model] tokenizer" in findings[0].fix


def test_an_untied_head_is_judged_the_same_way(run):
    findings = run(
        "untrained-tokens",
        token_rows={"input": table(**{"<|im_end|>": (2, 0.8, 7.5)}), "output": table(**{"<|im_end|>": (2, "nan")})},
    )
    assert [f.title for f in findings] == [
        "output head row 2 (token '<|im_end|>') holds NaN/inf: the checkpoint is broken"
    ]


def test_rows_that_were_not_read_are_not_judged(run):
    rows = table(**{"<|im_end|>": (2, 0.8, 7.5)})
    rows["rows"]["<|im_start|>"] = {"id": 1}
    findings = run("untrained-tokens", token_rows={"input": rows})
    assert severities(findings) == ["warning"] and findings[0].title.startswith("not judged: '<|im_start|>'")
    [empty] = run("untrained-tokens", token_rows={"input": {"rows": {}}})
    assert empty.severity.value == "warning" and empty.title.startswith("not judged")


UNREADABLE = {
    "error": "SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered",
    "file": "m/model.safetensors",
}


def test_a_checkpoint_whose_rows_cannot_be_read_is_not_judged(run):
    [finding] = run("untrained-tokens", token_rows=UNREADABLE)
    assert finding.severity.value == "warning"
    assert finding.title == (
        "not judged: the embedding rows could not be read (m/model.safetensors: SafetensorError: "
        "Error while deserializing header: incomplete metadata, file not fully covered)"
    )


def test_a_repair_of_rows_that_cannot_be_read_stops_the_run(run, tmp_path):
    config = make_run(tmp_path, model={"weights": "pretrained", "repair_untrained_tokens": True})
    [finding] = run("untrained-tokens", token_rows=UNREADABLE, run=config)
    assert finding.severity.value == "error"
    assert finding.title.startswith(
        "[model] repair_untrained_tokens cannot repair the embedding rows: they cannot be "
        "read (m/model.safetensors: SafetensorError"
    )
    assert "repair_untrained_tokens = false" in finding.fix and "m/model.safetensors" in finding.fix
