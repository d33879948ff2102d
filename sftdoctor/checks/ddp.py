"""ddp-unused-parameters: will torch's DDP reducer wait for a gradient that a step never produces?

Under DDP (several processes, no DeepSpeed) every trainable parameter's gradient is all-reduced in buckets as
backward produces it. A trainable parameter that a step never reaches keeps its bucket from finishing, and the
next step fails with "Expected to have finished reduction in the prior iteration before starting a new one"
unless find_unused_parameters is on (torch reducer.cpp, 1.x-2.13). With it on, reentrant activation
checkpointing fails the other way ("Expected to mark a variable ready only once"): the reducer marks the
checkpointed layers' parameters unused after the forward, then their gradients arrive in the recompute.
The plan (run.resolve.find_unused_parameters) decides find_unused_parameters from the unused_parameters probe;
this check says what it saw and why the decision holds.
"""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, info, ok

SHOWN = 3  # name patterns quoted in a finding


@check(
    "ddp-unused-parameters",
    "DDP: every trainable parameter gets a gradient, or the reducer is told it may not",
    messages={
        "not-probed": "not proven that every trainable parameter gets a gradient",
        "unused-tensors": "trainable tensors get no gradient and DDP is not told: its second step fails",
        "reentrant-checkpointing": "reentrant checkpointing with find_unused_parameters=True under DDP",
    },
)
def ddp_unused_parameters(plan, unused_parameters: dict[str, Any] | None = None):
    if plan.world_size <= 1:
        raise NotApplicable("one process: no DDP reducer")
    if plan.deepspeed is not None:
        raise NotApplicable("DeepSpeed's engine reduces the gradients, not DDP's reducer")
    if plan.fsdp is not None:
        raise NotApplicable("FSDP reduce-scatters the gradients of what each step computed, not DDP's reducer")
    findings = [_unused(plan, unused_parameters)]
    if plan.checkpointing:
        findings.append(_checkpointing(plan))
    return findings


def _unused(plan, probe: dict[str, Any] | None):
    on = plan.ddp_find_unused_parameters
    setting = f"find_unused_parameters={on}"
    evidence = {"ddp_find_unused_parameters": on, "moe": plan.moe, "world_size": plan.world_size, "probe": probe}
    if probe is None or "error" in probe:
        why = (probe or {}).get("error") or "the unused_parameters probe did not run (no model config.json here)"
        if on:
            return ok(
                f"{setting} ({plan.reasons.get('ddp_find_unused_parameters')}): the reducer tolerates parameters "
                f"a step leaves without a gradient",
                detail=f"Not probed: {why}.",
                evidence=evidence,
            )
        return info(
            f"not proven that every trainable parameter gets a gradient ({why}); {setting}",
            detail='If one does not, the second step fails with "Expected to have finished reduction in the '
            'prior iteration". The rehearsal (real DDP on the shrunk model, before the launch) would '
            "fail the same way.",
            fix="run `sftdoctor check --config RUN.toml` where the model's "
            "config.json is, or `sftdoctor train RUN.toml --smoke`",
            evidence=evidence,
            id="ddp-unused-parameters/not-probed",
        )
    count, total = probe.get("unused_tensors", 0), probe.get("trainable_tensors", 0)
    if not count:
        moe = " (a mixture-of-experts model: on in case a step routes no token to an expert)" if on and plan.moe else ""
        return ok(
            f"every trainable tensor ({total}) of {probe.get('model_class')} gets a gradient on a text-only "
            f"step; {setting}{moe}",
            evidence=evidence,
        )
    what = _what(probe)
    if on:
        return ok(
            f"{count} of {total} trainable tensors get no gradient on a text-only step ({what}): "
            f"the plan sets {setting}, so the reducer does not wait for them",
            detail=f"Seen on one step of the shrunk {probe.get('model_class')}: {_patterns(probe)}. They are "
            "never updated; freezing them would spare DDP its search of the graph at every step.",
            evidence=evidence,
        )
    return error(
        f"{count} of {total} trainable tensors get no gradient on a text-only step ({what}), and "
        f"{setting}: DDP's second step will fail",
        detail=f"{_patterns(probe)}. torch's reducer waits for "
        'their gradients: "Expected to have finished reduction in the prior iteration before starting a '
        'new one".',
        fix="resolve the plan again with this sftdoctor (it sets find_unused_parameters where "
        "the probe finds such tensors), or freeze them",
        evidence=evidence,
        id="ddp-unused-parameters/unused-tensors",
    )


def _checkpointing(plan):
    evidence = {
        "use_reentrant": plan.checkpointing_reentrant,
        "ddp_find_unused_parameters": plan.ddp_find_unused_parameters,
    }
    if plan.checkpointing_reentrant and plan.ddp_find_unused_parameters:
        return error(
            "reentrant activation checkpointing with find_unused_parameters=True under DDP",
            detail="The reducer marks the checkpointed layers' parameters unused after the forward; their "
            'gradients then arrive in the recompute: "Expected to mark a variable ready only once".',
            fix="use_reentrant=False (the default sftdoctor passes), or static_graph=True if the same "
            "parameters go unused at every step",
            explain="gradient-checkpointing",
            evidence=evidence,
            id="ddp-unused-parameters/reentrant-checkpointing",
        )
    return ok(
        f"activation checkpointing is {'reentrant' if plan.checkpointing_reentrant else 'non-reentrant'} with "
        f"find_unused_parameters={plan.ddp_find_unused_parameters}: DDP marks each parameter ready once",
        detail='Reentrant checkpointing together with find_unused_parameters=True fails under DDP ("Expected to '
        'mark a variable ready only once"); sftdoctor asks for reentrant checkpointing only for LoRA '
        "under ZeRO-3, where DeepSpeed, not DDP, reduces the gradients.",
        explain="gradient-checkpointing",
        evidence=evidence,
    )


def _what(probe: dict[str, Any]) -> str:
    roots = probe.get("roots") or []
    kinds = ", ".join(probe.get("kinds") or ["parameters"])
    return f"{kinds}: {', '.join(roots[:SHOWN])}{', …' if len(roots) > SHOWN else ''}" if roots else kinds


def _patterns(probe: dict[str, Any]) -> str:
    shown = [
        f"{e['pattern']} (x{e['count']})" if e.get("count", 1) > 1 else e["pattern"]
        for e in (probe.get("unused") or [])[:SHOWN]
    ]
    more = probe.get("unused_tensors", 0) - sum(e.get("count", 1) for e in (probe.get("unused") or [])[:SHOWN])
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")
