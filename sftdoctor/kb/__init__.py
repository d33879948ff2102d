"""The knowledge base: one Markdown file per topic under topics/, with TOML front matter
between `+++` lines (`summary`, and the `checks` that point to the topic).

A topic may hold sections for the messages of its check: a level-3 heading `### slug` or `### slug: title`
(slug kebab-case) opens one, which runs to the next heading of level 1 to 3. A finding points to one with
`explain="TOPIC#slug"`, and `sftdoctor explain TOPIC/slug` prints the topic's title and that section alone."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
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
    if FACTS in body:
        body = body.replace(FACTS, facts_by_phase())
    return Topic(name, meta["summary"], body.strip() + "\n", meta)


FACTS = "{facts by phase}"  # in a topic's text: the facts a check can ask for, from their declarations


def facts_by_phase() -> str:
    """A Markdown list: each phase, what hands its checks their facts, and the facts, as the catalogue has them."""
    from sftdoctor.facts.catalogue import PHASES, RUN_BY, fact_names

    return "\n".join(
        f"- a `{phase}` check ({RUN_BY[phase]}): " + ", ".join(f"`{name}`" for name in fact_names(phase))
        for phase in PHASES
    )


@cache
def topics() -> tuple[Topic, ...]:
    folder = resources.files(__package__) / "topics"
    found = [_parse(f.name[:-3], f.read_text(encoding="utf-8")) for f in folder.iterdir() if f.name.endswith(".md")]
    return tuple(sorted(found, key=lambda t: t.name))


_SECTION = re.compile(r"### ([a-z0-9]+(?:-[a-z0-9]+)*)(?::.*)?")
_HEADING = re.compile(r"#{1,3} ")


def sections(body: str) -> dict[str, str]:
    """A topic's sections by slug, each its text from its heading on (headings inside code blocks are not)."""
    found: dict[str, list[str]] = {}
    current, fenced = None, False
    for line in body.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and _HEADING.match(line):
            match = _SECTION.fullmatch(line.rstrip())
            current = match.group(1) if match else None
            if current is not None:
                found.setdefault(current, [])
        if current is not None:
            found[current].append(line)
    return {slug: "".join(lines).strip() + "\n" for slug, lines in found.items()}


def topic(name: str) -> Topic:
    """A topic by name; TOPIC/slug (or TOPIC#slug, as a finding's `explain` says it) is that section alone."""
    name, _, slug = name.replace("#", "/", 1).partition("/")
    by_name = {t.name: t for t in topics()}
    if name not in by_name:
        raise InputError("explain", f"no topic {name!r}{did_you_mean(name, by_name)}; see `sftdoctor explain --list`")
    if not slug:
        return by_name[name]
    found = sections(by_name[name].body)
    if slug not in found:
        known = f"its sections: {', '.join(found)}" if found else "it has no sections"
        raise InputError("explain", f"topic {name!r} has no section {slug!r}{did_you_mean(slug, found)}; {known}")
    return replace(by_name[name], name=f"{name}/{slug}", body=found[slug])


def render(entry: Topic) -> None:
    text = f"# {entry.name}\n\n{entry.summary}\n\n{entry.body}"
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text))
    else:
        sys.stdout.write(text)
