"""How `chat` says what it did: a line about each model's settings, the stop report after each answer, and the
JSON Lines record of an answer for scripts."""

from __future__ import annotations

from typing import Any

from sftdoctor.chat.generate import END_OF_TURN, INTERRUPTED, MAX_NEW_TOKENS, Answer


def header(chatter, device: str) -> str:
    """One line of the settings; a warning (a note that starts with "!") on a line of its own."""
    target = chatter.target
    what = (
        f"the adapter {target.path} on {target.base}" if target.kind == "adapter" else f"{target.path} ({target.kind})"
    )
    notes = chatter.settings.notes + chatter.notes
    said = "; ".join(n for n in notes if not n.startswith("!"))
    warnings = [n for n in notes if n.startswith("!")]
    return "\n".join([f"sftdoctor: {chatter.label}: {what}, on {device}; {said}", *warnings])


def stop_report(chatter, answer: Answer) -> str:
    """After each answer: why it stopped, how many tokens, how fast; where a run to max_new_tokens may point."""
    speed = f"{answer.new_tokens} tokens, {answer.tokens_per_second:.1f} tokens/s"
    if answer.stop == END_OF_TURN:
        return f"✓ ended its turn at {answer.stop_token}: {speed}"
    if answer.stop == INTERRUPTED:
        return f"~ interrupted (Ctrl-C) after {speed}"
    if answer.stop == MAX_NEW_TOKENS:
        eot = chatter.end_of_turn or "its end-of-turn token"
        if chatter.end_of_turn_id in answer.ids:  # it ended its turn; the generation config did not stop there
            return (
                f"! ran to max_new_tokens ({chatter.settings.max_new_tokens}): {speed}\n"
                f"  it ended its turn at {eot} after {answer.ids.index(chatter.end_of_turn_id)} tokens, but "
                f"eos_token_id {chatter.settings.eos_ids} does not stop there: add {chatter.end_of_turn_id} to "
                "eos_token_id in its generation_config.json (sftdoctor explain training-targets)"
            )
        return (
            f"! ran to max_new_tokens ({chatter.settings.max_new_tokens}) without {eot}: {speed}\n"
            f"  cut off, or it never learned to stop: a model trained without {eot} among its targets never emits "
            "it (sftdoctor explain training-targets)"
        )
    return f"i stopped early without an end-of-turn token (the generation config's stop_strings or max_time): {speed}"


def record(chatter, question, answer: Answer) -> dict[str, Any]:
    """One JSON Lines record of `chat --json`."""
    config = chatter.settings.config
    return {
        "line": question.line,
        "role": chatter.label,
        "model": chatter.target.given,
        "prompt": question.prompt,
        "messages": list(question.messages),
        "answer": answer.text,
        "stop": answer.stop,
        "stop_token": answer.stop_token,
        # where it ended its turn when the generation config did not stop there (None: it never did)
        "end_of_turn_at": _first(answer.ids, chatter.end_of_turn_id) if answer.stop != END_OF_TURN else None,
        "new_tokens": answer.new_tokens,
        "max_new_tokens": chatter.settings.max_new_tokens,
        "seconds": round(answer.seconds, 4),
        "tokens_per_second": round(answer.tokens_per_second, 2),
        "generation": {
            "do_sample": bool(config.do_sample),
            "temperature": config.temperature if config.do_sample else None,
            "eos_token_id": chatter.settings.eos_ids,
            "end_of_turn": chatter.end_of_turn,
            "settings": list(chatter.settings.notes),
        },
    }


def _first(ids: tuple[int, ...], token: int | None) -> int | None:
    return ids.index(token) if token is not None and token in ids else None
