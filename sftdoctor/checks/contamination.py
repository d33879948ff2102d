"""contamination: the run trains on the documents it is evaluated on (facts/contamination.py)."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import info, ok, warning

# A dirty document lifts a score by at most 1/docs; 1% of them moves accuracy by at most one point, about the
# standard error lm-eval gives a 1,000-document task (sqrt(0.25/1000) = 1.6 points). Above it the numbers lie.
WARN_SHARE = 0.01


@check("contamination", "the training rows do not contain the eval tasks' documents (13-gram overlap)")
def contamination(contamination: dict[str, Any]):
    if "error" in contamination:
        return warning(f"the training rows could not be compared with the eval documents ({contamination['error']})",
                       fix="run `sftdoctor check --config RUN.toml --select contamination` where lm-eval and the "
                           "task data are", evidence=contamination)
    findings = []
    for source, found in contamination["sources"].items():
        docs, touched, short = found["docs"], found["touched"], found["too_short"]
        judged = docs - short
        unjudged = f"; {short} of its documents are too short to judge (under 8 words)" if short else ""
        if judged == 0:
            findings.append(info(f"{source}: not judged: its {docs} documents are too short (under 8 words)",
                                 evidence=found))
        elif touched == 0:
            findings.append(ok(f"{source}: none of {judged} documents occurs in the {contamination['train_rows']:,} "
                               f"training rows{unjudged}", evidence=found))
        else:
            share = touched / judged
            first = found["examples"][0]
            findings.append((warning if share >= WARN_SHARE else info)(
                f"{source}: {touched} of {judged} documents ({share:.1%}) occur in the training rows, e.g. "
                f"{first['eval']} in {first['train']}",
                detail=f"Shared 13 words: \"{first['overlap']}\". The model will have seen the answers it is scored "
                       f"on: the score overstates it{unjudged}.",
                fix="drop the training rows that contain them (decontaminate), or evaluate on tasks the data never saw",
                evidence=found))
    return findings
