"""token-ids: no row holds a token id the model's embedding has no row for (facts/token_ids.py)."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import Finding, error, info, ok, warning

# What the trainer does with such a row, so the finding says what the log would show.
FAILS = (
    "the first batch holding one fails: on a GPU `indexSelectLargeIndex ... Assertion srcIndex < "
    "srcSelectDimSize failed` then `CUDA error: device-side assert triggered`, on a CPU `IndexError: index out "
    "of range in self`"
)
RECIPE = "sftdoctor's recipe never adds tokens nor resizes the embedding: it trains the vocab_size config.json declares"


def _resize_fix(v: dict[str, Any]) -> str:
    return (
        f"resize the embedding to the tokenizer's {v['tokenizer_size']} ids and start from that model: "
        "model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64); model.save_pretrained(DIR); "
        f"tokenizer.save_pretrained(DIR); [model] path = DIR ({RECIPE}); or keep those tokens out of the data"
    )


def _tokenizer_fix(v: dict[str, Any], plan) -> str:
    sizes = f"{v['tokenizer_size']:,} ids for an embedding of {v['vocab_size']:,} rows"
    if plan is not None and plan.tokenizer_path != plan.model_path:
        return f"use the model's own tokenizer: unset [model] tokenizer ({plan.tokenizer_path} has {sizes})"
    return (
        f"the tokenizer files next to the model are not its own ({sizes}): copy in the tokenizer the weights were "
        "trained with, or give it as [model] tokenizer"
    )


def _tokens(counts: dict[str, int]) -> str:
    return ", ".join(f"{token} in {n:,} row{'s' if n != 1 else ''}" for token, n in list(counts.items())[:6])


def rows_out_of_range(v: dict[str, Any], plan) -> Finding | None:
    n = v["rows_out_of_range"]
    if not n:
        return None
    where = ", ".join(e["where"] for e in v["examples"][:3])
    largest = v["largest_id"]
    token = v.get("largest_token")
    around = v.get("around_content") or {}
    notes = [f"Tokens past the end: {_tokens(v['found'])}."]
    if around:
        notes.append(
            f"Written around the rows' text (by the chat template or as the tokenizer's BOS), so every row "
            f"of that shape holds it: {_tokens(around)}."
        )
    notes.append(
        f"The tokenizer has {v['tokenizer_size']:,} ids, the model's embedding {v['vocab_size']:,} rows: {FAILS}."
    )
    own_vocabulary = v["vocabulary_past_vocab"] > 0
    return error(
        f"{n:,} of {v['rows']:,} rows hold token ids past the embedding's {v['vocab_size']:,} rows (largest {largest}"
        f"{f', {token}' if token else ''}), e.g. {where}",
        detail=" ".join(notes),
        fix=_tokenizer_fix(v, plan) if own_vocabulary else _resize_fix(v),
        evidence=v,
        id="token-ids/rows-out-of-range",
    )


def pad_out_of_range(v: dict[str, Any], packed: bool) -> Finding | None:
    pad = v["specials_out_of_range"].get("pad")
    if pad is None:
        return None
    title = f"the pad token is id {pad}, past the embedding's {v['vocab_size']:,} rows"
    fix = (
        "make the pad token one the model has (sftdoctor sets pad = EOS when the tokenizer has none: remove the "
        f"added pad token from the tokenizer), or {_resize_fix(v)}"
    )
    if packed:
        return warning(
            title,
            detail="Padding-free packing feeds no pad token while training, but any padded batch "
            f"(evaluation, generate() with a batch) does: {FAILS}.",
            fix=fix,
            evidence=v,
            id="token-ids/pad-out-of-range",
        )
    return error(
        title + ": every padded batch feeds it to the embedding",
        detail=f"The loss masks padding, the embedding still looks it up: {FAILS}.",
        fix=fix,
        evidence=v,
        id="token-ids/pad-out-of-range",
    )


def refused(v: dict[str, Any]) -> Finding | None:
    if not v["refused_rows"]:
        return None
    first = v["refused"][0]
    return error(
        f"the chat template refuses {v['refused_rows']:,} rows, e.g. {first['where']}: {first['error']}",
        detail="TRL renders every row with the template while building the trainer: the run would stop there.",
        fix="fix those rows (roles, order, keys the template expects), or use a template that accepts them "
        "([model] chat_template)",
        evidence=v,
        id="token-ids/refused-rows",
    )


def clean(v: dict[str, Any], plan) -> Finding:
    if v["mode"] == "none":
        return ok(
            f"the tokenizer's {v['tokenizer_size']:,} ids all have a row in the model's embedding "
            f"({v['vocab_size']:,}): no row can index outside it",
            evidence=v,
        )
    listed = ", ".join(list(v["out_of_range_tokens"])[:6])
    scanned = (
        f"none of the {v['rows']:,} rows holds any of the {v['tokens_past_vocab']:,} tokens past the "
        f"embedding's {v['vocab_size']:,} rows ({listed})"
    )
    if v["vocabulary_past_vocab"]:
        return warning(
            scanned + f", but the tokenizer's own vocabulary has {v['tokenizer_size']:,} ids",
            detail="The rows happen to avoid them; new data or generated text will not. " + FAILS + ".",
            fix=_tokenizer_fix(v, plan),
            evidence=v,
            id="token-ids/vocabulary-past-embedding",
        )
    return ok(scanned, evidence=v)


@check(
    "token-ids",
    "every row's token ids have a row in the model's embedding (config.json vocab_size)",
    messages={
        "not-compared": "the rows' token ids could not be compared with vocab_size",
        "rows-out-of-range": "rows hold token ids past the embedding's rows",
        "pad-out-of-range": "the pad token id is past the embedding's rows",
        "refused-rows": "the chat template refuses rows",
        "vocabulary-past-embedding": "the tokenizer has more ids than the embedding has rows; no row uses them",
        "special-out-of-range": "a special token id past the embedding's rows that no row holds",
    },
)
def token_ids(token_ids: dict[str, Any], plan=None):
    v = token_ids
    if "error" in v:
        return warning(
            f"the rows' token ids could not be compared with the model's vocab_size ({v['error']})",
            fix="run `sftdoctor check --config RUN.toml --select token-ids` where the tokenizer and data are",
            evidence=v,
            id="token-ids/not-compared",
        )
    packed = bool(plan is not None and plan.packing)
    found = [f for f in (rows_out_of_range(v, plan), pad_out_of_range(v, packed), refused(v)) if f is not None]
    if not [f for f in found if f.severity.rank >= 2]:
        found.insert(0, clean(v, plan))
    others = {k: i for k, i in v["specials_out_of_range"].items() if k != "pad"}
    if others and not v["rows_out_of_range"]:
        found.append(
            info(
                f"the tokenizer's {', '.join(f'{k} token (id {i})' for k, i in others.items())} is past the "
                f"embedding's {v['vocab_size']:,} rows; no row holds it",
                evidence=v,
                id="token-ids/special-out-of-range",
            )
        )
    return found
