"""The conversations of `sftdoctor chat --prompts FILE.jsonl` (one JSON object a line: "prompt", a string, or
"messages", a list of chat turns ending with one the model answers) and of `--prompt TEXT`, each checked before
any model loads: a bad line is one InputError naming the file and the line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sftdoctor.errors import InputError, read_text
from sftdoctor.facts.data import row_problem
from sftdoctor.facts.json_lines import json_line

MAX_FILE = 64 << 20  # questions for a model: kilobytes, never a gigabyte
EXPECTED = 'expected one JSON object a line with "prompt" (a string) or "messages" (a list of chat turns)'


@dataclass(frozen=True)
class Question:
    messages: tuple[dict[str, str], ...]  # the conversation sent, ending with the turn to answer
    line: int | None = None  # its line in the --prompts file
    source: str | None = None  # that file

    @property
    def prompt(self) -> str:
        return self.messages[-1]["content"]


def one(text: str) -> Question:
    """--prompt TEXT: one user turn."""
    _utf8(text, "--prompt", None, "the prompt")
    return Question(({"role": "user", "content": text},))


def read_prompts(path: Path) -> list[Question]:
    """Every question of the file, or one InputError naming the file and the first bad line."""
    text = read_text(path, "prompts file (JSON Lines)", limit=MAX_FILE)
    questions = [
        _question(json_line(line, path, lambda why: f"not valid JSON ({why}); {EXPECTED}", key=f"line {n}"), path, n)
        for n, line in enumerate(text.split("\n"), start=1)
        if line.strip()
    ]
    if not questions:
        raise InputError(path, f"no prompts in it; {EXPECTED}", key="--prompts")
    return questions


def _question(record, path: Path, number: int) -> Question:
    where = f"line {number}"
    if not isinstance(record, dict):
        raise InputError(path, f"a JSON {type(record).__name__}; {EXPECTED}", key=where)
    if ("prompt" in record) == ("messages" in record):
        raise InputError(
            path, f"{'both' if 'prompt' in record else 'neither'} of prompt and messages; {EXPECTED}", where
        )
    if "prompt" in record:
        if not isinstance(record["prompt"], str):
            raise InputError(path, f"prompt is a JSON {type(record['prompt']).__name__}; expected a string", where)
        _utf8(record["prompt"], path, where, "prompt")
        return Question(({"role": "user", "content": record["prompt"]},), number, str(path))
    problem = row_problem({"messages": record["messages"]}, "messages")
    if problem:
        raise InputError(path, f"messages: {problem}", key=where)
    turns = tuple({"role": t["role"], "content": t["content"]} for t in record["messages"])
    if turns[-1]["role"] == "assistant":
        raise InputError(
            path, "messages end with an assistant turn; expected the last turn to be one the model answers", where
        )
    for i, turn in enumerate(turns):
        _utf8(turn["content"], path, where, f"messages turn {i}")
    return Question(turns, number, str(path))


def _utf8(text: str, source, where: str | None, what: str) -> None:
    """A lone surrogate ("\\ud800" in JSON) is no text a tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            source, f"{what} holds {text[exc.start]!r}, half of a surrogate pair; expected valid UTF-8 text", where
        ) from None
