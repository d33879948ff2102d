"""untrained-tokens: the chat template's tokens whose embedding rows the base checkpoint never trained.

Only a row read whole and finite is called trained: a row holding NaN/inf, a token id beyond the table's rows
and a checkpoint whose rows cannot be read are findings of their own, never a ✓."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.embeddings import NON_FINITE, OUTSIDE, TRAINED, UNREAD, UNTRAINED, verdicts

WHERE = {"input": "input embedding", "output": "output head"}


@check(
    "untrained-tokens",
    "the chat template's tokens have trained embedding rows in the base checkpoint",
    messages={
        "cannot-repair": "repair_untrained_tokens cannot repair rows it cannot read",
        "unread": "the checkpoint's embedding rows could not be read",
        "non-finite": "embedding rows hold NaN/inf: the checkpoint is broken",
        "outside-table": "template tokens have no row in the embedding table",
        "token-unread": "a template token's row was not read",
        "no-template-rows": "the fact holds no template token's embedding row",
        "repaired": "untrained template tokens, repaired at load",
        "untrained": "template tokens never trained in the base checkpoint",
    },
)
def untrained_tokens(token_rows: dict[str, Any], plan=None, run=None):
    repair = bool(run is not None and run.model.repair_untrained_tokens)
    if "error" in token_rows:
        return _not_read(token_rows, repair)
    tables = {kind: token_rows[kind] for kind in WHERE if isinstance(token_rows.get(kind), dict)}
    judged = {kind: verdicts(table) for kind, table in tables.items()}
    findings = [*_broken(tables, judged), *_outside(tables, judged), *_unread(judged)]
    bad = {token: why for rows in judged.values() for token, (verdict, why) in rows.items() if verdict == UNTRAINED}
    if bad:
        findings.append(_untrained(bad, judged, plan, token_rows))
    if findings:
        return findings
    trained = sorted(
        (t for t, (v, _) in judged.get("input", {}).items() if v == TRAINED),
        key=lambda t: tables["input"]["rows"][t]["id"],
    )
    if not trained:
        return warning(
            "not judged: the fact holds no template token's embedding row",
            evidence=token_rows,
            id="untrained-tokens/no-template-rows",
        )
    return ok(
        f"{len(trained)} template token(s) have trained embedding rows: {', '.join(trained)}", evidence=token_rows
    )


def _not_read(token_rows: dict[str, Any], repair: bool):
    """The checkpoint's rows could not be read: not judged, and a repair that needs them is refused."""
    file = token_rows.get("file") or "the checkpoint"
    why = f"{file}: {token_rows['error']}"
    if repair:
        return error(
            f"[model] repair_untrained_tokens cannot repair the embedding rows: they cannot be read ({why})",
            detail="The repair sets the rows it read as untrained; with none read it would set nothing, and "
            "the run would start from the rows it was asked to repair, or die loading this checkpoint.",
            fix=f"fix or re-download {file} (e.g. `huggingface-cli download MODEL`), or set [model] "
            "repair_untrained_tokens = false",
            evidence=token_rows,
            id="untrained-tokens/cannot-repair",
        )
    return warning(
        f"not judged: the embedding rows could not be read ({why})",
        fix=f"fix or re-download {file}; then `sftdoctor check --config RUN.toml --select untrained-tokens`",
        evidence=token_rows,
        id="untrained-tokens/unread",
    )


def _broken(tables: dict[str, Any], judged: dict[str, Any]) -> list:
    """Rows holding NaN/inf, the template's and the ordinary ones read for reference: the checkpoint is broken."""
    found = []
    for kind, table in tables.items():
        named = [
            f"{table['rows'][t].get('id', '?')} (token {t!r})" for t, (v, _) in judged[kind].items() if v == NON_FINITE
        ]
        rows = named + [str(i) for i in table.get("non_finite_rows") or ()]
        if rows:
            found.append(
                error(
                    f"{WHERE[kind]} row{'s' if len(rows) > 1 else ''} {', '.join(rows)} "
                    f"hold{'' if len(rows) > 1 else 's'} NaN/inf: the checkpoint is broken",
                    detail=f"{table.get('tensor', WHERE[kind])} in {table.get('file', 'the checkpoint')}: "
                    "a NaN or inf in "
                    "a row the model reads turns every activation after it into NaN from the first step.",
                    fix="re-download or re-convert the checkpoint (compare its files' sha256 with the hub's); "
                    "the repair "
                    "([model] repair_untrained_tokens) only sets untrained rows",
                    evidence={kind: table},
                    id="untrained-tokens/non-finite",
                )
            )
    return found


def _outside(tables: dict[str, Any], judged: dict[str, Any]) -> list:
    """Token ids with no row in the table: the tokenizer and the model disagree."""
    found = []
    for kind, table in tables.items():
        gone = {t: table["rows"][t].get("id") for t, (v, _) in judged[kind].items() if v == OUTSIDE}
        if gone:
            listed = ", ".join(f"{t!r} (id {i})" for t, i in gone.items())
            found.append(
                error(
                    f"{len(gone)} template token(s) have no row in the {WHERE[kind]}, which has {table.get('vocab')} "
                    f"rows: {listed}",
                    detail="The tokenizer and the model disagree: the embedding lookup of these ids indexes past the "
                    "table (an IndexError on CPU, a device-side assert on CUDA).",
                    fix="use the tokenizer that ships with this checkpoint ([model] tokenizer), or grow the tables to "
                    "the tokenizer with model.resize_token_embeddings(len(tokenizer)) and save the checkpoint",
                    evidence={kind: table},
                    id="untrained-tokens/outside-table",
                )
            )
    return found


def _unread(judged: dict[str, Any]) -> list:
    gaps = {t: why for rows in judged.values() for t, (v, why) in rows.items() if v == UNREAD}
    if not gaps:
        return []
    return [
        warning(
            f"not judged: {', '.join(map(repr, gaps))}: the row was not read ({'; '.join(gaps.values())})",
            id="untrained-tokens/token-unread",
        )
    ]


def _untrained(bad: dict[str, str], judged: dict[str, Any], plan, token_rows: dict[str, Any]):
    listed = "; ".join(f"{token} ({why})" for token, why in bad.items())
    where = " and ".join(WHERE[k] for k, rows in judged.items() if any(v == UNTRAINED for v, _ in rows.values()))
    if plan is not None and plan.repair_token_ids:
        return info(
            f"{len(bad)} template token(s) untrained in the base checkpoint, repaired at load: {listed}",
            detail=f"Their rows in the {where} are set to the mean of the trained rows before training "
            "([model] repair_untrained_tokens).",
            evidence=token_rows,
            id="untrained-tokens/repaired",
        )
    return error(
        f"{len(bad)} template token(s) were never trained in the base checkpoint: {listed}",
        detail=f"Their rows in the {where} are empty, so every turn the model reads or writes starts from "
        "nothing: the loss on these tokens starts at noise and their first gradients can be large enough to "
        "blow up the run (base models released before their chat template).",
        fix="[model] repair_untrained_tokens = true sets them to the mean of the trained rows at load; or start from "
        "the model's instruct release, whose template tokens are trained",
        evidence=token_rows,
        id="untrained-tokens/untrained",
    )
