"""token-ids, on the scan's answers (facts/token_ids.py) as recorded from the tiny example's tokenizer: grown by
added tokens, a config.json smaller than its vocabulary, a pad token added past the end."""

from types import SimpleNamespace

from sftdoctor.checks.token_ids import token_ids

BASE = {
    "vocab_size": 384,
    "tokenizer_size": 384,
    "mode": "none",
    "rows": None,
    "rows_out_of_range": 0,
    "largest_id": None,
    "largest_token": None,
    "out_of_range_tokens": {},
    "tokens_past_vocab": 0,
    "vocabulary_past_vocab": 0,
    "found": {},
    "around_content": {},
    "examples": [],
    "refused": [],
    "refused_rows": 0,
    "specials": {"pad": 0, "eos": 2},
    "specials_out_of_range": {},
    "seconds": 0.0,
}
GROWN = {
    **BASE,
    "tokenizer_size": 386,
    "mode": "added",
    "rows": 4,
    "rows_out_of_range": 2,
    "largest_id": 385,
    "largest_token": "</tool>",
    "out_of_range_tokens": {"<tool>": 384, "</tool>": 385},
    "tokens_past_vocab": 2,
    "found": {"<tool>": 2, "</tool>": 1},
    "examples": [
        {"where": "train.jsonl line 2", "ids": [384], "tokens": ["<tool>"], "confirmed": True},
        {"where": "train.jsonl line 3", "ids": [384, 385], "tokens": ["<tool>", "</tool>"], "confirmed": True},
    ],
}
SMALL = {
    **BASE,
    "vocab_size": 300,
    "mode": "full",
    "rows": 1200,
    "rows_out_of_range": 1200,
    "largest_id": 383,
    "largest_token": "pear",
    "out_of_range_tokens": {"ssag": 300},
    "tokens_past_vocab": 84,
    "vocabulary_past_vocab": 84,
    "found": {"Ġdate": 461},
    "examples": [{"where": "train.jsonl line 1", "ids": [317], "tokens": ["cat"]}],
}
PLAN = SimpleNamespace(packing=False, model_path="model", tokenizer_path="model")


def verdicts(facts, plan=PLAN):
    return [(f.severity.value, f.title) for f in token_ids(facts, plan)]


def test_a_tokenizer_that_fits_the_embedding_is_ok_without_reading_a_row():
    assert verdicts(BASE) == [
        ("ok", "the tokenizer's 384 ids all have a row in the model's embedding (384): no row can index outside it")
    ]


def test_rows_holding_added_tokens_past_the_embedding_are_an_error_naming_them_and_the_resize():
    [finding] = token_ids(GROWN, PLAN)
    assert (finding.severity.value, finding.title) == (
        "error",
        "2 of 4 rows hold token ids past the embedding's 384 rows (largest 385, </tool>), e.g. train.jsonl "
        "line 2, train.jsonl line 3",
    )
    assert "<tool> in 2 rows, </tool> in 1 row" in finding.detail and "index out of range in self" in finding.detail
    assert "resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)" in finding.fix
    assert "never adds tokens nor resizes" in finding.fix


def test_a_vocabulary_larger_than_the_embedding_points_at_the_tokenizer():
    [finding] = token_ids(SMALL, PLAN)
    assert finding.severity.value == "error" and finding.title.startswith("1,200 of 1,200 rows")
    assert finding.fix.startswith(
        "the tokenizer files next to the model are not its own (384 ids for an embedding of 300 rows)"
    )
    other = SimpleNamespace(packing=False, model_path="model", tokenizer_path="org/other-tokenizer")
    assert token_ids(SMALL, other)[0].fix.startswith("use the model's own tokenizer: unset [model] tokenizer")


def test_tokens_written_around_the_text_say_that_every_row_of_that_shape_holds_them():
    found = {**GROWN, "around_content": {"<|sys|>": 2}}
    assert (
        "Written around the rows' text (by the chat template or as the tokenizer's BOS)"
        in token_ids(found, PLAN)[0].detail
    )


def test_a_pad_token_past_the_embedding_is_an_error_unless_packing_feeds_no_padding():
    pad = {
        **BASE,
        "tokenizer_size": 385,
        "mode": "added",
        "rows": 10,
        "tokens_past_vocab": 1,
        "out_of_range_tokens": {"[PAD]": 384},
        "specials_out_of_range": {"pad": 384},
    }
    assert verdicts(pad) == [
        (
            "error",
            "the pad token is id 384, past the embedding's 384 rows: every padded batch feeds it to the embedding",
        )
    ]
    packed = SimpleNamespace(packing=True, model_path="model", tokenizer_path="model")
    [finding] = token_ids(pad, packed)
    assert finding.severity.value == "warning" and "Padding-free packing feeds no pad token" in finding.detail


def test_rows_that_avoid_the_tokens_past_the_end_are_ok_unless_the_vocabulary_itself_is_larger():
    clean = {**GROWN, "rows_out_of_range": 0, "largest_id": None, "found": {}, "examples": []}
    assert verdicts(clean) == [
        ("ok", "none of the 4 rows holds any of the 2 tokens past the embedding's 384 rows (<tool>, </tool>)")
    ]
    assert verdicts({**SMALL, "rows_out_of_range": 0, "found": {}, "examples": []})[0][0] == "warning"


def test_rows_the_chat_template_refuses_are_an_error():
    refused = [{"where": "train.jsonl line 9", "error": "TemplateError: no tools"}]
    found = {**GROWN, "refused_rows": 3, "refused": refused}
    assert ("error", "the chat template refuses 3 rows, e.g. train.jsonl line 9: TemplateError: no tools") in verdicts(
        found
    )


def test_a_scan_that_failed_is_a_warning_never_ok():
    finding = token_ids({"error": "the token-id scan took over 3600 s"}, PLAN)
    assert finding.severity.value == "warning" and "could not be compared" in finding.title
