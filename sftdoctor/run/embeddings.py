"""Which embedding rows were never trained (the `token_rows` fact: sftdoctor/facts/token_rows.py), decided once:
the untrained-tokens check reports them and the plan repairs them when asked (`[model] repair_untrained_tokens`).

A row is untrained when its largest absolute value is at most `ZERO` (never updated from a zero init: the
reserved and chat tokens of base models released before their chat template), or when its norm is under
`FAINT` of the ordinary rows' median norm (decayed towards zero by weight decay without a gradient). A row left
at a random init cannot be told from a trained one by its values alone: not judged.
"""

from __future__ import annotations

import math
from typing import Any

ZERO = 1e-12
FAINT = 0.05


def untrained(table: dict[str, Any]) -> dict[str, str]:
    """{token: why} for the rows of one table (a fact's "input" or "output") that were never trained."""
    median = table.get("median_norm") or 0.0
    found = {}
    for token, row in (table.get("rows") or {}).items():
        if "outside" in row:
            continue
        if row["max_abs"] <= ZERO:
            found[token] = "all zeros"
        elif median > 0 and math.isfinite(row["norm"]) and row["norm"] < FAINT * median:
            found[token] = f"norm {row['norm']:.3g}, {row['norm'] / median:.1%} of an ordinary row's {median:.3g}"
    return found


def repair_ids(token_rows: dict[str, Any] | None) -> tuple[int, ...]:
    """The ids whose rows, input or output, are untrained: what the repair sets to the mean of trained rows."""
    if not token_rows or "error" in token_rows:
        return ()
    ids = set()
    for table in (token_rows.get("input"), token_rows.get("output")):
        for token in untrained(table or {}):
            ids.add(table["rows"][token]["id"])
    return tuple(sorted(ids))
