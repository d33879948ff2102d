"""training-targets: what the trainer will really optimise, read back from the installed stack's own
tokenization, masks, packing and collator on a sample of the run's rows (facts/targets_probe.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import Finding, error, info, ok, warning

KEEP_WHOLE = 0.99


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _length_keeping(lengths: list[int], share: float = KEEP_WHOLE) -> int:
    ordered = sorted(lengths)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass(frozen=True)
class Read:
    """The probe's reading, with what every rule quotes."""

    probe: dict[str, Any]
    drop_in: bool  # the template is sftdoctor's choice (a drop-in), not the user's

    @property
    def samples(self) -> list[dict[str, Any]]:
        return self.probe["samples"]

    @property
    def stop(self) -> str:
        return self.probe["end_of_turn"] or self.probe["eos_token"]

    @property
    def evidence(self) -> dict[str, Any]:
        return {k: v for k, v in self.probe.items() if k != "samples"}

    @property
    def shown(self) -> str:
        return f"The first sample as the trainer sees it, targets in [[ ]]:\n{self.probe['first_sample']}"

    @property
    def cut(self) -> int:
        return sum(1 for n in self.probe["full_lengths"] if n > self.probe["max_length"])

    @property
    def missing(self) -> list[dict[str, Any]]:
        return [s for s in self.samples if not s["last_target_is_stop"] and not s["stop_masked"]]

    @property
    def share(self) -> float:
        tokens = sum(s["tokens"] for s in self.samples)
        return sum(s["targets"] for s in self.samples) / tokens if tokens else 0.0


def stop_masked(r: Read) -> Finding | None:
    masked = [s for s in r.samples if s["stop_masked"] and not s["last_target_is_stop"]]
    if not masked:
        return None
    same_pad = r.probe["pad_token_id"] is not None and r.probe["pad_token_id"] == r.probe["eos_token_id"]
    return error(
        f"{r.stop} ends {len(masked)} of {len(r.samples)} samples but is never a target: "
        "the model will not learn to stop",
        detail=(
            "The pad token is the EOS token, and the labels mask every pad id, EOS included. "
            if same_pad
            else "The labels mask the end-of-turn token. "
        )
        + r.shown,
        fix="give the tokenizer a pad token of its own (tokenizer.pad_token = a reserved token), or a collator that "
        "masks padding by position, not by id",
        evidence=r.evidence,
        id="training-targets/stop-masked",
    )


def stop_missing(r: Read) -> Finding | None:
    if len(r.missing) <= r.cut:
        return None
    return error(
        f"{len(r.missing) - r.cut} of {len(r.samples)} samples end their targets without {r.stop}, and not because "
        "max_length cut them: the model never sees where an answer stops",
        detail="The chat template (or the text) does not close the assistant turn with the end-of-sequence or "
        "end-of-turn token. " + r.shown,
        fix="use a chat template that ends each assistant turn with its end-of-turn token (the model family's own), "
        "or end each text row with the tokenizer's eos_token",
        evidence=r.evidence,
        id="training-targets/stop-missing",
    )


def bos_doubled(r: Read) -> Finding | None:
    doubled = [s for s in r.samples if s["leading_bos"] > 1]
    if not doubled:
        return None
    return error(
        f"{len(doubled)} of {len(r.samples)} samples start with {doubled[0]['leading_bos']} BOS tokens",
        detail="The tokenizer adds a BOS and the chat template (or the text) already starts with one: every sample "
        "trains on a sequence the model never sees at inference. " + r.shown,
        fix="remove the BOS from the template or text (or load the tokenizer with add_bos_token=False)",
        evidence=r.evidence,
        id="training-targets/bos-doubled",
    )


def every_turn_trained(r: Read) -> Finding | None:
    if r.probe["shape"] != "messages" or (r.probe["assistant_only_loss"] and r.share < 0.999):
        return None
    return warning(
        f"the loss covers every turn ({r.share:.0%} of the tokens are targets), not only the assistant's",
        detail="The chat template has no {% generation %} markers and TRL cannot patch it, so user and system "
        "turns are trained as if the model should write them. " + r.shown,
        fix="[model] chat_template = a .jinja copy of the template with {% generation %} ... {% endgeneration %} "
        "around the assistant's content and its end-of-turn token (none of sftdoctor's or TRL's bundled "
        "templates renders this one's text)",
        evidence=r.evidence,
        id="training-targets/every-turn-trained",
    )


def saved_template_differs(r: Read) -> Finding | None:
    if not r.probe.get("saved_template_differs"):
        return None
    trained = r.probe.get("trained_template")
    return warning(
        f"the chat template saved with the model renders {r.probe['saved_template_differs']} of {r.probe['rows']} "
        "sampled rows differently from how they were trained",
        detail="generate() and serving stacks format prompts with the saved template, so the model would be "
        "prompted in a format it was not trained on. TRL tokenizes with its own training template when "
        "the tokenizer's has no {% generation %} markers, but saves the tokenizer's. " + r.shown,
        fix="train and save with one template: [model] chat_template = "
        + (
            f'"{trained}"'
            if trained
            else "a template with {% generation %} markers that formats every turn as inference will"
        ),
        evidence=r.evidence,
        id="training-targets/saved-template-differs",
    )


def drop_in_differs(r: Read) -> Finding | None:
    if not (r.probe.get("own_template_differs") and r.drop_in):
        return None
    return warning(
        f"the drop-in template {r.probe['chat_template']} renders {r.probe['own_template_differs']} of "
        f"{r.probe['rows']} sampled rows differently from the tokenizer's own",
        detail="sftdoctor chose it because it renders its probe conversations the same; your rows use something "
        "those lack (tools, other roles or keys).",
        fix="[model] chat_template = a copy of the tokenizer's template with {% generation %} markers added",
        evidence=r.evidence,
        id="training-targets/drop-in-differs",
    )


def stray_targets(r: Read) -> Finding | None:
    stray = [s for s in r.samples if s.get("stray_targets")]
    masking = r.probe["assistant_only_loss"] or r.probe["shape"] == "prompt_completion"
    if not stray or r.share >= 0.999 or not masking:
        return None
    return error(
        f"{len(stray)} of {len(r.samples)} samples train on text outside the answers, e.g. "
        f"{stray[0]['stray_targets'][0]!r}",
        detail="The loss mask should cover the assistant turns (or the completion) and nothing else; these target "
        "spans appear in no answer of the sampled rows: the template's generation markers are misplaced. " + r.shown,
        fix="put {% generation %} ... {% endgeneration %} around the assistant content and its end-of-turn token only",
        evidence=r.evidence,
        id="training-targets/stray-targets",
    )


def rows_cut(r: Read) -> Finding | None:
    if not r.cut:
        return None
    lengths = r.probe["full_lengths"]
    keep = _length_keeping(lengths)
    return warning(
        f"{r.cut} of {len(lengths)} sampled rows are longer than max_length {r.probe['max_length']} and lose their "
        f"end (their {r.stop} with it)",
        detail=f"The longest sampled row has {max(lengths):,} tokens; {KEEP_WHOLE:.0%} of them fit in {keep:,}.",
        fix=f"[data] max_length = {keep} keeps {KEEP_WHOLE:.0%} whole, or drop the longest rows",
        evidence=r.evidence,
        id="training-targets/rows-cut",
    )


def generation_stops_elsewhere(r: Read) -> Finding | None:
    generation, eot = r.probe.get("generation_eos"), r.probe.get("end_of_turn_id")
    if generation is None or eot is None or eot in generation:
        return None
    return info(
        f"the model's generation_config.json stops at {generation} but its turns end with {r.stop} ({eot})",
        detail="generate() would run past the end of each answer; sftdoctor adds the end-of-turn token to "
        "final/generation_config.json.",
        evidence=r.evidence,
        id="training-targets/generation-stops-elsewhere",
    )


RULES = (
    stop_masked,
    stop_missing,
    bos_doubled,
    every_turn_trained,
    saved_template_differs,
    drop_in_differs,
    stray_targets,
    rows_cut,
    generation_stops_elsewhere,
)


@check(
    "training-targets",
    "EOS trained, BOS once, loss only where intended, what generate() stops at: proven on the run's rows",
    messages={
        "unreadable": "what the trainer will optimise could not be read back",
        "stop-masked": "the EOS/end-of-turn token is never a target: the model will not learn to stop",
        "stop-missing": "samples end their targets without the EOS/end-of-turn token",
        "bos-doubled": "samples start with two BOS tokens",
        "every-turn-trained": "the loss covers every turn, not only the assistant's",
        "saved-template-differs": "the chat template saved with the model renders rows differently from training",
        "drop-in-differs": "the drop-in chat template renders rows differently from the tokenizer's own",
        "stray-targets": "samples train on text outside the answers",
        "rows-cut": "rows longer than max_length lose their end",
        "generation-stops-elsewhere": "generation_config.json stops at another token than the turns end with",
    },
)
def training_targets(plan, training_targets: dict[str, Any], chat_template: dict[str, Any] | None = None):
    probe = training_targets
    if (
        "error" in probe
        and not (chat_template or {"has_template": True})["has_template"]
        and (plan.data_shape == "messages" or "chat_template" in probe["error"])
    ):
        raise NotApplicable(
            "the chat rows have no chat template to be rendered with: the chat-template check reports it"
        )
    if "error" in probe:
        return warning(
            f"what the trainer will optimise could not be read back ({probe['error']})",
            fix="run `sftdoctor check --config RUN.toml --select training-targets -v` on the training machine",
            evidence=probe,
            id="training-targets/unreadable",
        )
    r = Read(probe, drop_in=bool(plan.chat_template) and not (chat_template or {}).get("given"))
    findings = [f for f in (rule(r) for rule in RULES) if f is not None]
    if not [f for f in findings if f.severity.rank >= 2]:
        findings.insert(0, learned(r, plan.reasons.get("chat_template")))
    return findings


def learned(r: Read, template: str | None) -> Finding:
    """The verdict when no rule found a problem: what the model learns, in numbers."""
    where = (
        "assistant turns only"
        if r.probe["assistant_only_loss"]
        else ("completions only" if r.probe["shape"] == "prompt_completion" else "every token")
    )
    lengths = r.probe["full_lengths"]
    return ok(
        f"{r.stop} is the last target of {len(r.samples) - len(r.missing)} of {_plural(len(r.samples), 'sample')}"
        f"{' (packed)' if r.probe['packed'] else ''}; {r.share:.0%} of tokens are targets ({where}); "
        f"{r.cut} of {len(lengths)} rows cut at max_length {r.probe['max_length']}",
        detail=(f"Chat template: {template}.\n" if template else "") + r.shown,
        evidence=r.evidence,
    )
