"""`sftdoctor chat TARGET`: a conversation on a terminal, or one answer per --prompt / --prompts line for scripts
(--json: one JSON object per answer), with TARGET's base beside it (--base: the same question to both, the
answers one after the other). Every input is checked before a model loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sftdoctor.chat.prompts import Question, one, read_prompts
from sftdoctor.errors import InputError, Interrupted, interruptible
from sftdoctor.eval.target import resolve_target


def main(
    target: str,
    *,
    prompt: str | None,
    prompts: Path | None,
    base: str | None,
    max_new_tokens: int | None,
    temperature: float | None,
    as_json: bool,
) -> int:
    for name, value in (("TARGET", target), ("--base", base)):
        if value is not None and not value.strip():  # "" is the current folder to pathlib: an unset variable
            raise InputError(
                "chat", "an empty name (an unset shell variable?); expected a model folder, run or hub id", key=name
            )
    questions = _questions(prompt, prompts, as_json)
    targets = [("model", resolve_target(target))] + ([("base", resolve_target(base, "--base"))] if base else [])
    options = {"max_new_tokens": max_new_tokens, "temperature": temperature, "scripted": as_json}
    try:
        with interruptible():
            return _chat(targets, questions, options, as_json)
    except Interrupted as exc:
        print("\nsftdoctor: interrupted", file=sys.stderr, flush=True)
        return 128 + exc.signum


def _questions(prompt: str | None, prompts: Path | None, as_json: bool) -> list[Question] | None:
    """The questions of --prompt or --prompts, or None for a conversation on the terminal."""
    if prompt is not None and prompts is not None:
        raise InputError("--prompt", "give --prompt TEXT or --prompts FILE.jsonl, not both")
    if prompt is not None:
        return [one(prompt)]
    if prompts is not None:
        return read_prompts(prompts)
    if as_json:
        raise InputError("--json", "goes with --prompt TEXT or --prompts FILE.jsonl (a conversation prints text)")
    if not sys.stdin.isatty():
        raise InputError(
            "chat", "stdin is not a terminal, so there is no one to talk to: give --prompt TEXT or --prompts FILE.jsonl"
        )
    return None


def _chat(targets, questions: list[Question] | None, options: dict, as_json: bool) -> int:
    from sftdoctor.chat import repl
    from sftdoctor.chat.models import load_chatter
    from sftdoctor.chat.show import header
    from sftdoctor.eval.command import device

    where = device()
    chatters = []
    for label, target in targets:
        template = chatters[0].tokenizer.chat_template if chatters else None
        chatters.append(load_chatter(label, target, where, options, template))
    for question in questions or []:  # every conversation rendered by every template before the first answer
        for chatter in chatters:
            _render(chatter, question)
    for chatter in chatters:
        print(header(chatter, where), file=sys.stderr if as_json else sys.stdout, flush=True)
    if questions is None:
        return repl.run(chatters)
    for question in questions:
        _answer_all(chatters, question, as_json)
    return 0


def _render(chatter, question: Question) -> None:
    from sftdoctor.chat.generate import Refused, prompt_ids

    try:
        prompt_ids(chatter.tokenizer, question.messages)
    except Refused as exc:
        source, key = (question.source, f"line {question.line}") if question.line else ("--prompt", None)
        raise InputError(source, f"{chatter.label} {chatter.target.given}: {exc}", key=key) from None


def _answer_all(chatters, question: Question, as_json: bool) -> None:
    """Each model's answer to one question: a JSON line each, or the text (streamed) and its stop report."""
    from sftdoctor.chat.show import record, stop_report

    if not as_json and question.line is not None:
        print(f"> {question.prompt}  (line {question.line})", flush=True)
    for chatter in chatters:
        if as_json:
            print(json.dumps(record(chatter, question, chatter.ask(question.messages))), flush=True)
            continue
        if len(chatters) > 1:
            print(f"[{chatter.label}] ", end="", flush=True)
        answer = chatter.ask(question.messages, on_text=lambda piece: print(piece, end="", flush=True))
        print(flush=True)
        print(stop_report(chatter, answer), flush=True)
