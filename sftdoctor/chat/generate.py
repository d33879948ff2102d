"""One answer of a loaded model to a conversation: the prompt formatted by the chat template saved with the model,
generate() under the generation settings decided once (`settings`), the text streamed as it comes, and why it
stopped: at an end-of-turn token (generation_config's eos_token_id, an int or a list) or at max_new_tokens. It
imports transformers: `chat` imports it only after its input is checked.

Checked against transformers 5.25: generate() stops a sequence at any id of eos_token_id (a list becomes one
EosTokenCriteria over all of them, generation/utils.py _prepare_special_tokens) and keeps that id as the last new
token; a streamer's put() gets the prompt first, then each new token, and end() once (generation/streamers.py)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

from transformers import TextStreamer

from sftdoctor.errors import Interrupted

DEFAULT_MAX_NEW_TOKENS = 256
END_OF_TURN, MAX_NEW_TOKENS, INTERRUPTED, OTHER = "end_of_turn", "max_new_tokens", "interrupted", "other"


@dataclass(frozen=True)
class Answer:
    text: str
    stop: str  # END_OF_TURN | MAX_NEW_TOKENS | INTERRUPTED | OTHER (a stop string or max_time of the config)
    stop_token: str | None  # the end-of-turn token it stopped at
    new_tokens: int
    seconds: float
    ids: tuple[int, ...] = ()  # the new tokens (none kept for an interrupted answer)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Settings:
    """What generate() is given, and where each choice came from (said to the user once)."""

    config: object  # transformers.GenerationConfig
    notes: tuple[str, ...]

    @property
    def max_new_tokens(self) -> int:
        return self.config.max_new_tokens

    @property
    def eos_ids(self) -> list[int]:
        return eos_ids(self.config.eos_token_id)


def eos_ids(value) -> list[int]:
    """generation_config's eos_token_id as a list: it may be None, an int or a list of ints."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def settings(
    saved, source: str, tokenizer, *, max_new_tokens: int | None, temperature: float | None, scripted: bool
) -> Settings:
    """The generation config saved with the model (`source` says which file, or that there was none), with the
    command's choices over it: --max-new-tokens (else the file's, else DEFAULT_MAX_NEW_TOKENS), --temperature
    (0: greedy; else the file's sampling settings, greedy for scripts so their answers repeat), the KV cache on
    (a training run saves use_cache false, which only slows generation down)."""
    config = copy.deepcopy(saved)
    notes = [f"generation settings from {source}"]
    if max_new_tokens is None:
        max_new_tokens = config.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
        notes.append(f"max_new_tokens {max_new_tokens}{' (its own)' if config.max_new_tokens else ' (default)'}")
    else:
        notes.append(f"max_new_tokens {max_new_tokens} (--max-new-tokens)")
    config.max_new_tokens, config.max_length, config.use_cache = max_new_tokens, None, True
    if temperature is not None:
        config.do_sample = temperature > 0
        config.temperature = temperature if temperature > 0 else None
        notes.append(f"temperature {temperature:g} (--temperature)" if temperature > 0 else "greedy (--temperature 0)")
    elif scripted:
        config.do_sample = False
        notes.append("greedy (--json; give --temperature to sample)")
    else:
        notes.append(_sampling(config))
    if config.pad_token_id is None:  # else generate() warns that it borrowed an eos id
        config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else _first(config)
    return Settings(config, tuple(notes))


def _sampling(config) -> str:
    if not config.do_sample:
        return "greedy (its do_sample is off)"
    shown = [f"{key} {getattr(config, key):g}" for key in ("temperature", "top_p", "top_k") if getattr(config, key)]
    return "sampling (its do_sample): " + ", ".join(shown) if shown else "sampling (its do_sample)"


def _first(config) -> int | None:
    ids = eos_ids(config.eos_token_id)
    return ids[0] if ids else None


class Refused(Exception):
    """The chat template cannot render the conversation (a template that raises on a system turn, say)."""


def prompt_ids(tokenizer, messages):
    """The conversation as the model saw it in training: its chat template with the assistant's opening added,
    as input_ids and attention_mask; Refused when the template raises (jinja2's TemplateError, or the
    exception a template's raise_exception() throws)."""
    import jinja2

    try:
        return tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as exc:
        said = (str(exc).strip().splitlines() or [""])[0][:300]
        raise Refused(f"its chat template refuses the conversation ({type(exc).__name__}: {said})") from None


def answer(
    model, tokenizer, inputs, chosen: Settings, on_text: Callable[[str], None] | None = None, stoppable: bool = False
) -> Answer:
    """generate() in this thread, streaming decoded text to `on_text`. Ctrl-C lands here, between two tokens, with
    no thread left generating: `stoppable` (a conversation), it ends the answer (INTERRUPTED); else the command."""
    import torch

    streamer = _Streamer(tokenizer, on_text or (lambda text: None))
    inputs = inputs.to(model.device)
    began = time.perf_counter()
    try:
        with torch.no_grad():
            output = model.generate(**inputs, generation_config=chosen.config, streamer=streamer)
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted) or not stoppable:  # SIGTERM, or a script's Ctrl-C: the command ends
            raise
        seconds = time.perf_counter() - began
        streamer.end()
        return Answer(streamer.text, INTERRUPTED, None, streamer.count, seconds)
    seconds = time.perf_counter() - began
    new = output[0, inputs["input_ids"].shape[1] :].tolist()
    stop, token = _why_stopped(new, chosen, tokenizer)
    return Answer(tokenizer.decode(new, skip_special_tokens=True), stop, token, len(new), seconds, tuple(new))


def _why_stopped(new: list[int], chosen: Settings, tokenizer) -> tuple[str, str | None]:
    if new and new[-1] in chosen.eos_ids:
        return END_OF_TURN, tokenizer.convert_ids_to_tokens(new[-1])
    return (MAX_NEW_TOKENS if len(new) >= chosen.max_new_tokens else OTHER), None


class _Streamer(TextStreamer):
    """transformers' TextStreamer with its documented hook, on_finalized_text, sending the text to a callback
    instead of print(), and counting the new tokens (for an interrupted answer's tokens/s)."""

    def __init__(self, tokenizer, on_text: Callable[[str], None]):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.text, self.count, self.on_text = "", 0, on_text

    def put(self, value):
        if not self.next_tokens_are_prompt:  # the first put() is the prompt, which skip_prompt drops
            self.count += int(value.numel())
        super().put(value)

    def on_finalized_text(self, text: str, stream_end: bool = False):
        self.text += text
        if text:
            self.on_text(text)
