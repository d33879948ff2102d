"""training-targets: what the trainer will really optimise, read back from the installed stack's own
tokenization, masks, packing and collator on a sample of the run's rows (facts/targets_probe.py)."""

from __future__ import annotations

import math
from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import error, info, ok, warning

KEEP_WHOLE = 0.99


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _length_keeping(lengths: list[int], share: float = KEEP_WHOLE) -> int:
    ordered = sorted(lengths)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@check("training-targets", "EOS trained, BOS once, loss only where intended, what generate() stops at: proven on the run's rows")
def training_targets(plan, training_targets: dict[str, Any], chat_template: dict[str, Any] | None = None):
    probe = training_targets
    if "error" in probe:
        return warning(f"what the trainer will optimise could not be read back ({probe['error']})",
                       fix="run `sftdoctor check --config RUN.toml --select training-targets -v` on the training machine",
                       evidence=probe)
    samples, lengths, max_length = probe["samples"], probe["full_lengths"], probe["max_length"]
    stop = probe["end_of_turn"] or probe["eos_token"]
    evidence = {k: v for k, v in probe.items() if k != "samples"}
    shown = f"The first sample as the trainer sees it, targets in [[ ]]:\n{probe['first_sample']}"
    findings = []

    masked = [s for s in samples if s["stop_masked"] and not s["last_target_is_stop"]]
    cut = sum(1 for n in lengths if n > max_length)
    missing = [s for s in samples if not s["last_target_is_stop"] and not s["stop_masked"]]
    same_pad = probe["pad_token_id"] is not None and probe["pad_token_id"] == probe["eos_token_id"]
    if masked:
        findings.append(error(
            f"{stop} ends {len(masked)} of {len(samples)} samples but is never a target: the model will not learn to stop",
            detail=("The pad token is the EOS token, and the labels mask every pad id, EOS included. " if same_pad else
                    "The labels mask the end-of-turn token. ") + shown,
            fix="give the tokenizer a pad token of its own (tokenizer.pad_token = a reserved token), or a collator that "
                "masks padding by position, not by id", evidence=evidence))
    if len(missing) > cut:
        findings.append(error(
            f"{len(missing) - cut} of {len(samples)} samples end their targets without {stop}, and not because "
            "max_length cut them: the model never sees where an answer stops",
            detail="The chat template (or the text) does not close the assistant turn with the end-of-sequence or "
                   "end-of-turn token. " + shown,
            fix="use a chat template that ends each assistant turn with its end-of-turn token (the model family's own), "
                "or end each text row with the tokenizer's eos_token", evidence=evidence))
    doubled = [s for s in samples if s["leading_bos"] > 1]
    if doubled:
        findings.append(error(
            f"{len(doubled)} of {len(samples)} samples start with {doubled[0]['leading_bos']} BOS tokens",
            detail="The tokenizer adds a BOS and the chat template (or the text) already starts with one: every sample "
                   "trains on a sequence the model never sees at inference. " + shown,
            fix="remove the BOS from the template or text (or load the tokenizer with add_bos_token=False)",
            evidence=evidence))

    targets, tokens = sum(s["targets"] for s in samples), sum(s["tokens"] for s in samples)
    share = targets / tokens if tokens else 0.0
    if probe["shape"] == "messages" and (not probe["assistant_only_loss"] or share >= 0.999):
        findings.append(warning(
            f"the loss covers every turn ({share:.0%} of the tokens are targets), not only the assistant's",
            detail="The chat template has no {% generation %} markers and TRL cannot patch it, so user and system "
                   "turns are trained as if the model should write them. " + shown,
            fix="[model] chat_template = a .jinja copy of the template with {% generation %} ... {% endgeneration %} "
                "around the assistant's content and its end-of-turn token (none of sftdoctor's or TRL's bundled "
                "templates renders this one's text)", evidence=evidence))
    rows = probe["rows"]
    if probe.get("saved_template_differs"):
        findings.append(warning(
            f"the chat template saved with the model renders {probe['saved_template_differs']} of {rows} sampled "
            "rows differently from how they were trained",
            detail="generate() and serving stacks format prompts with the saved template, so the model would be "
                   "prompted in a format it was not trained on. TRL tokenizes with its own training template when "
                   "the tokenizer's has no {% generation %} markers, but saves the tokenizer's. " + shown,
            fix="train and save with one template: [model] chat_template = "
                + (f'"{probe["trained_template"]}"' if probe.get("trained_template") else
                   "a template with {% generation %} markers that formats every turn as inference will"),
            evidence=evidence))
    drop_in = plan.chat_template and not (chat_template or {}).get("given")  # chosen by sftdoctor, not the user
    if probe.get("own_template_differs") and drop_in:
        findings.append(warning(
            f"the drop-in template {probe['chat_template']} renders {probe['own_template_differs']} of {rows} "
            "sampled rows differently from the tokenizer's own",
            detail="sftdoctor chose it because it renders its probe conversations the same; your rows use something "
                   "those lack (tools, other roles or keys).",
            fix="[model] chat_template = a copy of the tokenizer's template with {% generation %} markers added",
            evidence=evidence))
    stray = [s for s in samples if s.get("stray_targets")]
    if stray and share < 0.999 and (probe["assistant_only_loss"] or probe["shape"] == "prompt_completion"):
        findings.append(error(
            f"{len(stray)} of {len(samples)} samples train on text outside the answers, e.g. "
            f"{stray[0]['stray_targets'][0]!r}",
            detail="The loss mask should cover the assistant turns (or the completion) and nothing else; these target "
                   "spans appear in no answer of the sampled rows: the template's generation markers are misplaced. "
                   + shown,
            fix="put {% generation %} ... {% endgeneration %} around the assistant content and its end-of-turn token "
                "only", evidence=evidence))
    if cut:
        keep = _length_keeping(lengths)
        findings.append(warning(
            f"{cut} of {len(lengths)} sampled rows are longer than max_length {max_length} and lose their end "
            f"(their {stop} with it)",
            detail=f"The longest sampled row has {max(lengths):,} tokens; {KEEP_WHOLE:.0%} of them fit in {keep:,}.",
            fix=f"[data] max_length = {keep} keeps {KEEP_WHOLE:.0%} whole, or drop the longest rows", evidence=evidence))
    generation, eot = probe.get("generation_eos"), probe.get("end_of_turn_id")
    if generation is not None and eot is not None and eot not in generation:
        findings.append(info(
            f"the model's generation_config.json stops at {generation} but its turns end with {stop} ({eot})",
            detail="generate() would run past the end of each answer; sftdoctor adds the end-of-turn token to "
                   "final/generation_config.json.", evidence=evidence))
    if not [f for f in findings if f.severity.rank >= 2]:
        where = "assistant turns only" if probe["assistant_only_loss"] else (
            "completions only" if probe["shape"] == "prompt_completion" else "every token")
        template = plan.reasons.get("chat_template")
        findings.insert(0, ok(
            f"{stop} is the last target of {len(samples) - len(missing)} of {_plural(len(samples), 'sample')}"
            f"{' (packed)' if probe['packed'] else ''}; {share:.0%} of tokens are targets ({where}); "
            f"{cut} of {len(lengths)} rows cut at max_length {max_length}",
            detail=(f"Chat template: {template}.\n" if template else "") + shown, evidence=evidence))
    return findings
