"""Which embedding rows were never trained (the `token_rows` fact: sftdoctor/facts/token_rows.py), decided once:
the untrained-tokens check reports them and the plan repairs them when asked (`[model] repair_untrained_tokens`).

A row is untrained when its largest absolute value is at most `ZERO` (never updated from a zero init: the
reserved and chat tokens of base models released before their chat template), or when its norm is under
`FAINT` of the ordinary rows' median norm (decayed towards zero by weight decay without a gradient). A row left
at a random init cannot be told from a trained one by its values alone: not judged.

Every row gets one verdict, and only a row read whole and finite can be called trained: a row holding NaN or
inf is a broken checkpoint, a token id beyond the table's rows has no row at all (the tokenizer and the model
disagree), and a row the fact does not hold was not read.
"""

from __future__ import annotations

import math
from typing import Any

ZERO = 1e-12
FAINT = 0.05
TRAINED, UNTRAINED, NON_FINITE, OUTSIDE, UNREAD = "trained", "untrained", "non-finite", "outside", "unread"


def verdicts(table: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """{token: (verdict, why)} for every row of one table (a fact's "input" or "output")."""
    median = table.get("median_norm")
    median = median if _finite(median) and median > 0 else 0.0
    return {token: _verdict(row, median) for token, row in (table.get("rows") or {}).items()}


def _verdict(row: Any, median: float) -> tuple[str, str]:
    if not isinstance(row, dict):
        return UNREAD, "no row in the fact"
    if "outside" in row:
        return OUTSIDE, f"id {row.get('id')}, the table has {row['outside']} rows"
    if row.get("non_finite"):
        return NON_FINITE, f"{row['non_finite']} NaN/inf value(s)"
    if not isinstance(row.get("id"), int) or "max_abs" not in row or "norm" not in row:
        return UNREAD, "its values were not read"
    if not (_finite(row["max_abs"]) and _finite(row["norm"])):
        return NON_FINITE, "NaN/inf values"
    if row["max_abs"] <= ZERO:
        return UNTRAINED, "all zeros"
    if median > 0 and row["norm"] < FAINT * median:
        return UNTRAINED, f"norm {row['norm']:.3g}, {row['norm'] / median:.1%} of an ordinary row's {median:.3g}"
    return TRAINED, ""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def untrained(table: dict[str, Any]) -> dict[str, str]:
    """{token: why} for the rows of one table that were never trained."""
    return {token: why for token, (verdict, why) in verdicts(table).items() if verdict == UNTRAINED}


def repair_ids(token_rows: dict[str, Any] | None) -> tuple[int, ...]:
    """The ids whose rows, input or output, are untrained: what the repair sets to the mean of trained rows."""
    if not token_rows or "error" in token_rows:
        return ()
    ids = set()
    for table in (token_rows.get("input"), token_rows.get("output")):
        for token in untrained(table or {}):
            ids.add(table["rows"][token]["id"])
    return tuple(sorted(ids))
