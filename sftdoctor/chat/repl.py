"""`sftdoctor chat TARGET` on a terminal: a conversation, each answer streamed as it comes, with its stop report.
/reset forgets the conversation, /exit or Ctrl-D leaves; Ctrl-C stops the answer being written, not the chat
(an interrupted exchange is left out of the conversation)."""

from __future__ import annotations

import contextlib
import sys

from sftdoctor.chat import show
from sftdoctor.chat.generate import INTERRUPTED, Refused, prompt_ids
from sftdoctor.errors import Interrupted

COMMANDS = {"/reset": "forgets the conversation", "/exit": "leaves (or Ctrl-D)"}
HELP = "type a message; " + ", ".join(f"{c} {what}" for c, what in COMMANDS.items()) + "; Ctrl-C stops an answer"


def run(chatters) -> int:
    with_labels = len(chatters) > 1
    histories: dict[str, list[dict[str, str]]] = {c.label: [] for c in chatters}
    _readline()
    print(f"sftdoctor chat: {HELP}", flush=True)
    while True:
        text = _read()
        if text is None or text == "/exit":
            return 0
        if text == "/reset":
            histories = {label: [] for label in histories}
            print("(the conversation is forgotten)", flush=True)
        elif text.startswith("/") and " " not in text:
            print(f"unknown command {text}: {HELP}", flush=True)
        elif text:
            for chatter in chatters:
                histories[chatter.label] = _exchange(chatter, histories[chatter.label], text, with_labels)


def _read() -> str | None:
    """The next line typed (stripped), or None at Ctrl-D; Ctrl-C at the prompt only reminds how to leave."""
    while True:
        try:
            return input("you> ").strip()
        except EOFError:
            print(flush=True)
            return None
        except KeyboardInterrupt as exc:
            if isinstance(exc, Interrupted):  # SIGTERM
                raise
            print(f"\n({HELP})", flush=True)


def _exchange(chatter, history: list[dict[str, str]], text: str, with_labels: bool) -> list[dict[str, str]]:
    """One answer streamed to the terminal; the history with this exchange, or without it if interrupted."""
    messages = [*history, {"role": "user", "content": text}]
    try:
        prompt_ids(chatter.tokenizer, messages)
    except Refused as exc:
        print(f"sftdoctor: {chatter.label} {chatter.target.given}: {exc}; try /reset", flush=True)
        return history
    if with_labels:
        print(f"[{chatter.label}] ", end="", flush=True)
    answer = chatter.ask(messages, on_text=lambda piece: print(piece, end="", flush=True), stoppable=True)
    print(flush=True)
    print(show.stop_report(chatter, answer), flush=True)
    if answer.stop == INTERRUPTED:
        return history
    return [*messages, {"role": "assistant", "content": answer.text}]


def _readline() -> None:
    """Line editing and history at the prompt, where Python has GNU readline."""
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401 - importing it is what turns it on for input()
