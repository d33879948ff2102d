"""contamination: the run trains on the documents it is evaluated on (facts/contamination.py)."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import info, ok, warning

# A dirty document lifts a score by at most 1/docs; 1% of them moves accuracy by at most one point, about the
# standard error lm-eval gives a 1,000-document task (sqrt(0.25/1000) = 1.6 points). Above it the numbers lie.
WARN_SHARE = 0.01


@check(
    "contamination",
    "the training rows do not contain the eval tasks' documents (13-word n-grams; n-grams of "
    "characters in scripts without spaces)",
    messages={
        "not-compared": "the training rows could not be compared with the eval documents",
        "source-unreadable": "an eval source could not be read",
        "no-documents": "an eval source has no documents",
        "documents-too-short": "an eval source's documents are all too short to judge",
        "no-training-rows": "no training row was read",
        "overlap": "eval documents occur in the training rows",
    },
)
def contamination(contamination: dict[str, Any]):
    if "error" in contamination:
        return warning(
            f"the training rows could not be compared with the eval documents ({contamination['error']})",
            fix="run `sftdoctor check --config RUN.toml --select contamination` where lm-eval and the task data are",
            evidence=contamination,
            id="contamination/not-compared",
        )
    return [_verdict(source, found, contamination["train_rows"]) for source, found in contamination["sources"].items()]


def _rules(found: dict[str, Any]) -> str:
    """Which rule judged the source's documents: "word 13-grams", or each with its count when they were several."""
    rules = found.get("rules") or {"word 13-grams": found["docs"] - found["too_short"]}
    if len(rules) == 1:
        return next(iter(rules))
    return ", ".join(f"{label} for {count}" for label, count in rules.items())


def _verdict(source: str, found: dict[str, Any], train_rows: int):
    if "error" in found:
        return warning(
            f"{source}: not judged: {found['error']}",
            fix="make the file readable, then check again",
            evidence=found,
            id="contamination/source-unreadable",
        )
    docs, touched, short = found["docs"], found["touched"], found["too_short"]
    judged, below = docs - short, found.get("too_short_below") or "8 words"
    unjudged = f"; {short} of its documents are too short to judge (under {below})" if short else ""
    if docs == 0:
        return info(f"{source}: not judged: it has no documents", evidence=found, id="contamination/no-documents")
    if judged == 0:
        return info(
            f"{source}: not judged: its {docs} documents are too short (under {below})",
            evidence=found,
            id="contamination/documents-too-short",
        )
    if train_rows == 0:
        return info(
            f"{source}: not judged: no training row was read", evidence=found, id="contamination/no-training-rows"
        )
    if touched == 0:
        rows = f"{train_rows:,} training row{'' if train_rows == 1 else 's'}"
        return ok(
            f"{source}: none of {judged} documents occurs in the {rows} ({_rules(found)}){unjudged}", evidence=found
        )
    share, first = touched / judged, found["examples"][0]
    return (warning if share >= WARN_SHARE else info)(
        f"{source}: {touched} of {judged} documents ({share:.1%}) occur in the training rows ({_rules(found)}), e.g. "
        f"{first['eval']} in {first['train']}",
        detail=f'Shared {first.get("shared", "13 words")}: "{first["overlap"]}". The model will have seen the '
        f"answers it is scored on: the score overstates it{unjudged}.",
        fix="drop the training rows that contain them (decontaminate), or evaluate on tasks the data never saw",
        evidence=found,
        id="contamination/overlap",
    )
