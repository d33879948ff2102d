"""untrained-tokens: the chat template's tokens whose embedding rows the base checkpoint never trained."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.embeddings import untrained


@check("untrained-tokens", "the chat template's tokens have trained embedding rows in the base checkpoint")
def untrained_tokens(token_rows: dict[str, Any], plan=None):
    if "error" in token_rows:
        return warning(f"the embedding rows could not be read ({token_rows['error']})",
                       fix="run `sftdoctor check --config RUN.toml --select untrained-tokens` where the checkpoint is",
                       evidence=token_rows)
    tables = {"input embedding": token_rows.get("input") or {}, "output head": token_rows.get("output") or {}}
    found = {where: untrained(table) for where, table in tables.items() if table}
    bad = {token: why for rows in found.values() for token, why in rows.items()}
    checked = sorted((tables["input embedding"].get("rows") or {}), key=lambda t: tables["input embedding"]["rows"][t]["id"])
    if not bad:
        return ok(f"{len(checked)} template token(s) have trained embedding rows: {', '.join(checked)}",
                  evidence=token_rows)
    listed = "; ".join(f"{token} ({why})" for token, why in bad.items())
    where = " and ".join(w for w, rows in found.items() if rows)
    if plan is not None and plan.repair_token_ids:
        return info(f"{len(bad)} template token(s) untrained in the base checkpoint, repaired at load: {listed}",
                    detail=f"Their rows in the {where} are set to the mean of the trained rows before training "
                           "([model] repair_untrained_tokens).", evidence=token_rows)
    return error(
        f"{len(bad)} template token(s) were never trained in the base checkpoint: {listed}",
        detail=f"Their rows in the {where} are empty, so every turn the model reads or writes starts from "
               "nothing: the loss on these tokens starts at noise and their first gradients can be large enough to "
               "blow up the run (base models released before their chat template).",
        fix="[model] repair_untrained_tokens = true sets them to the mean of the trained rows at load; or start from "
            "the model's instruct release, whose template tokens are trained", evidence=token_rows)
