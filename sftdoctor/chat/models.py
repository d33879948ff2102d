"""The models `chat` talks to: TARGET (and --base) resolved and loaded as `sftdoctor eval` does it
(eval/target.py: a run directory's final model, a checkpoint, a model folder, an adapter merged onto its base, a
cached hub id), with the generation config and the chat template saved with each, and what would keep
generate() from stopping at the end of a turn said before the first answer.

A hub id is used only when it is in the local cache (resolve_target refuses another, naming it); with
HF_HUB_OFFLINE set, transformers 5.25 loads it with local_files_only (utils/hub.py: `local_files_only or
is_offline_mode()`), so nothing is asked of the network."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from sftdoctor.chat import generate
from sftdoctor.errors import InputError
from sftdoctor.eval.target import Target, load
from sftdoctor.facts.configs import hub_cache_config
from sftdoctor.facts.trainer_inputs import end_of_turn

GENERATION_FILE = "generation_config.json"


@dataclass(frozen=True)
class Chatter:
    label: str  # "model" (TARGET) or "base" (--base)
    target: Target
    model: object
    tokenizer: object
    settings: generate.Settings
    end_of_turn: str | None  # the token the chat template closes an assistant turn with
    end_of_turn_id: int | None
    notes: tuple[str, ...]  # about its template and stop tokens, said once

    def ask(self, messages, on_text=None, stoppable: bool = False) -> generate.Answer:
        inputs = generate.prompt_ids(self.tokenizer, messages)
        return generate.answer(self.model, self.tokenizer, inputs, self.settings, on_text, stoppable)


def generation_file(target: Target) -> Path | None:
    """generation_config.json saved with the model: in its folder (sftdoctor writes one beside an adapter too,
    since peft saves none), or in a cached hub snapshot."""
    folder = hub_cache_config(target.path).parent if target.kind == "hub" else Path(target.path)
    path = folder / GENERATION_FILE
    return path if path.is_file() else None


def load_chatter(label: str, target: Target, device: str, options: dict, template: str | None = None) -> Chatter:
    """`template`: the chat template to use when this model's tokenizer has none (--base: TARGET's)."""
    with _quiet():
        model, tokenizer = load(target, device)
        path = generation_file(target)
        saved = model.generation_config
        if path is not None and target.kind == "adapter":  # merge_and_unload() kept the base's own
            from transformers import GenerationConfig

            saved = GenerationConfig.from_pretrained(str(path.parent))
    notes = []
    if not getattr(tokenizer, "chat_template", None):
        if template is None:
            raise InputError(target.given, f"its tokenizer ({target.tokenizer}) has no chat template to format turns")
        tokenizer.chat_template = template
        notes.append("its tokenizer has no chat template: TARGET's formats its turns")
    source = str(path) if path else f"transformers' defaults ({target.given} has no {GENERATION_FILE})"
    chosen = generate.settings(saved, source, tokenizer, **options)
    eot_id = end_of_turn(tokenizer)
    eot = tokenizer.convert_ids_to_tokens(eot_id) if eot_id is not None else None
    notes += _stop_notes(chosen, tokenizer, eot_id, eot, source)
    return Chatter(label, target, model, tokenizer, chosen, eot, eot_id, tuple(notes))


def _stop_notes(chosen: generate.Settings, tokenizer, eot_id: int | None, eot: str | None, source: str) -> list[str]:
    ids = chosen.eos_ids
    names = ", ".join(tokenizer.convert_ids_to_tokens(ids)) if ids else "none"
    if not ids:
        return [f"! {source}: no eos_token_id, so every answer runs to max_new_tokens"]
    if eot_id is not None and eot_id not in ids:
        return [
            f"! {source}: eos_token_id {ids} ({names}) leaves out {eot}, which ends the chat template's turns: "
            "generate() will run past the end of each answer (sftdoctor explain training-targets)"
        ]
    return [f"stops at {names} (eos_token_id {ids})"]


@contextlib.contextmanager
def _quiet():
    """transformers' "Loading weights" bar and notices off while loading, put back after."""
    import transformers

    logging = transformers.utils.logging
    level, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bar:
            logging.enable_progress_bar()
