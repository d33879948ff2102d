"""The knowledge base: one Markdown file per topic under topics/, with TOML front matter
between `+++` lines (`summary`, and the `checks` that point to the topic)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from sftdoctor.errors import InputError, did_you_mean


@dataclass(frozen=True)
class Topic:
    name: str
    summary: str
    body: str
    meta: dict = field(default_factory=dict)


def _parse(name: str, text: str) -> Topic:
    if not text.startswith("+++\n"):
        raise ValueError(f"kb topic {name}: missing +++ front matter")
    front, body = text[4:].split("\n+++\n", 1)
    meta = tomllib.loads(front)
    return Topic(name, meta["summary"], body.strip() + "\n", meta)


@cache
def topics() -> tuple[Topic, ...]:
    folder = resources.files(__package__) / "topics"
    found = [_parse(f.name[:-3], f.read_text(encoding="utf-8")) for f in folder.iterdir() if f.name.endswith(".md")]
    return tuple(sorted(found, key=lambda t: t.name))


def topic(name: str) -> Topic:
    by_name = {t.name: t for t in topics()}
    if name not in by_name:
        raise InputError("explain", f"no topic {name!r}{did_you_mean(name, by_name)}; see `sftdoctor explain --list`")
    return by_name[name]


def render(entry: Topic) -> None:
    text = f"# {entry.name}\n\n{entry.summary}\n\n{entry.body}"
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text))
    else:
        sys.stdout.write(text)
