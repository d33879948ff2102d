"""The reference pages under docs/reference/, rendered from the code so they cannot drift from it: the checks
(the registry), the run config's keys (the run model's dataclass fields), the kb topics, the commands (the
click tree) and the facts (the catalogue).

    python -m sftdoctor.reference           # write docs/reference/*.md
    python -m sftdoctor.reference --check   # exit 1 naming the stale pages, write nothing

The output is deterministic (sorted where the code's order is not meaningful, no timestamps, no paths of this
machine), so a test compares it with the committed pages (tests/test_reference.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference"
COMMAND = "python -m sftdoctor.reference"
TOPICS = "../../sftdoctor/kb/topics"  # the kb's files, relative to docs/reference/
_TAG = re.compile(r"<(?=[A-Za-z/!?])(?!br>)")  # what a markdown reader would take for a tag


def _header(title: str, source: str) -> list[str]:
    return [
        f"# {title}",
        "",
        f"<!-- Generated from {source} by `{COMMAND}`: do not edit by hand. -->",
        "",
    ]


def _cell(text: Any) -> str:
    """One markdown table cell: a single line, its pipes escaped, no `<` read as an HTML tag (but our `<br>`)."""
    return _TAG.sub("&lt;", " ".join(str(text).split()).replace("|", "\\|"))


def _row(*cells: Any) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    head = list(head)
    return [_row(*head), "| " + " | ".join("---" for _ in head) + " |", *(_row(*r) for r in rows)]


def _topic_link(name: str) -> str:
    return f"[{name}]({TOPICS}/{name}.md)"


# ---- checks


def checks_page(registry=None) -> str:
    """Every check of the registry, by phase: its id, summary, kb topic and the ids of its messages."""
    from sftdoctor.checks import load_checks
    from sftdoctor.facts.catalogue import PHASES

    registry = registry if registry is not None else load_checks(plugins=False)
    specs = sorted(registry.checks.values(), key=lambda s: s.id)
    lines = _header("Checks", "the check registry (`sftdoctor.checks`)")
    lines += [
        f"{len(specs)} built-in checks. `sftdoctor check --list` lists them; `--select ID` runs only some; a message",
        "id (`check/message`) names one thing a check says. `sftdoctor explain TOPIC` tells the whole story.",
        "",
    ]
    for phase in PHASES:
        of_phase = [s for s in specs if s.phase == phase]
        if not of_phase:
            continue
        lines += [f"## {phase}", ""]
        rows = [(f"`{s.id}`", s.summary, _topic_link(s.explain), _messages(s)) for s in of_phase]
        lines += _table(("id", "what it checks", "topic", "messages"), rows) + [""]
    return "\n".join(lines)


def _messages(spec) -> str:
    messages = getattr(spec, "messages", None) or {}  # CheckSpec.messages: sub-id -> what that message says
    return "<br>".join(f"`{spec.id}/{slug}`: {text}" for slug, text in sorted(messages.items()))  # one cell


# ---- the run config


def _default(f: dataclasses.Field, spec) -> str:
    if spec.required:
        return "required"
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    if value is None or value == "" or value == ():
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (tuple, list)):
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]`"
    return f"`{value}`"


def _type(f: dataclasses.Field) -> str:
    """The field's annotation as written (a string under `from __future__ import annotations`)."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _own_doc(kind: type) -> str:
    """The first sentence of a section's own docstring (the rest may speak to developers); not the one dataclass
    writes ("Model(given=...)")."""
    doc = kind.__dict__.get("__doc__") or ""
    if doc.startswith(f"{kind.__name__}("):
        return ""
    text = " ".join(doc.split())
    return text.split(". ", 1)[0].rstrip(".") + "." if text else ""


def section_lines(name: str, kind: type) -> list[str]:
    """One section of a TOML file: each key's type, default, accepted values and documentation."""
    lines = [f"## [{name}]", ""]
    if _own_doc(kind):
        lines += [_cell(_own_doc(kind)), ""]
    rows = []
    for f in dataclasses.fields(kind):
        spec = f.metadata.get("key")
        if spec is not None:
            rows.append((f"`{f.name}`", f"`{_type(f)}`", _default(f, spec), spec.expected, spec.doc))
    return lines + _table(("key", "type", "default", "accepts", "what it does"), rows) + [""]


def config_page(sections: dict[str, type] | None = None, sweep: dict[str, type] | None = None) -> str:
    """Every section and key of the run config (and of a sweep file), from the dataclass declarations."""
    from sftdoctor.run import config

    sections = sections if sections is not None else config.SECTIONS
    if sweep is None:
        from sftdoctor.sweep.config import SweepSection

        sweep = {"sweep": SweepSection}
    lines = _header("The run config (`RUN.toml`)", "the run model's key declarations (`sftdoctor/run/config.py`)")
    lines += [
        "Paths are relative to the TOML file. An unknown section or key is an error with a did-you-mean, and every",
        "problem is reported at once. `examples/tiny.toml` is a commented example.",
        "",
    ]
    optional = getattr(config, "OPTIONAL", set())
    if optional:
        names = " and ".join(f"`[{n}]`" for n in sorted(optional))
        lines += [f"{names}: absent, off; present (even empty), on.", ""]
    exclusive = getattr(config, "EXCLUSIVE", ())
    if exclusive:
        pairs = "; ".join(f"`[{s}] {a}` or `{b}`" for s, a, b in exclusive)
        lines += [f"Give at most one of: {pairs}.", ""]
    for name, kind in sections.items():
        lines += section_lines(name, kind)
    lines += [
        "# The sweep file (`SWEEP.toml`)",
        "",
        "Its `[space]` keys are run-config keys (`training.learning_rate`).",
        "",
    ]
    for name, kind in sweep.items():
        lines += section_lines(name, kind)
    return "\n".join(lines)


# ---- kb topics


def topics_page(topics: Iterable | None = None, registry=None) -> str:
    """Every kb topic with its summary and the checks it explains (its front matter's and those naming it)."""
    from sftdoctor import kb
    from sftdoctor.checks import load_checks

    topics = sorted(topics if topics is not None else kb.topics(), key=lambda t: t.name)
    registry = registry if registry is not None else load_checks(plugins=False)
    pointing: dict[str, set[str]] = {}
    for spec in registry.checks.values():
        pointing.setdefault(spec.explain, set()).add(spec.id)
    lines = _header("Knowledge-base topics", "the kb (`sftdoctor/kb/topics/*.md`)")
    lines += [
        f"{len(topics)} topics. `sftdoctor explain TOPIC` prints one; `sftdoctor explain --log FILE` recognises the",
        "failures they describe in a log.",
        "",
    ]
    rows = []
    for t in topics:
        checks = sorted(set(t.meta.get("checks", ())) | pointing.get(t.name, set()))
        signatures = len(t.meta.get("signatures", ()))
        rows.append((_topic_link(t.name), t.summary, ", ".join(f"`{c}`" for c in checks), signatures or ""))
    return "\n".join(lines + _table(("topic", "summary", "checks", "log signatures"), rows) + [""])


# ---- commands


def commands_page(group: click.Group | None = None) -> str:
    """Every command of the click tree with its usage, help and options (click's own help records)."""
    if group is None:
        from sftdoctor.cli import main as group
    settings = {**group.context_settings, "terminal_width": 100, "max_content_width": 100}
    root = click.Context(group, info_name="sftdoctor", **settings)
    lines = _header("Commands", "the click command tree (`sftdoctor/cli.py`)")
    lines += ["`sftdoctor COMMAND --help` prints the same.", ""]
    lines += _options(group, root)
    for name in sorted(group.list_commands(root)):
        command = group.get_command(root, name)
        ctx = click.Context(command, info_name=name, parent=root, terminal_width=100, max_content_width=100)
        lines += [f"## sftdoctor {name}", "", "```", command.get_usage(ctx), "```", ""]
        help_text = inspect.cleandoc((command.help or "").split("\f")[0]).replace("\b\n", "")
        lines += [help_text, ""] if help_text else []
        lines += _options(command, ctx)
    return "\n".join(lines)


def _options(command: click.Command, ctx: click.Context) -> list[str]:
    records = [p.get_help_record(ctx) for p in command.get_params(ctx) if isinstance(p, click.Option)]
    rows = [(f"`{names}`", text) for names, text in (r for r in records if r)]
    return _table(("option", "what it does"), rows) + [""] if rows else []


# ---- facts


def facts_page(catalogue: dict | None = None) -> str:
    """Every fact of the catalogue, by phase: what it is, what it is derived from, why it can be missing."""
    from sftdoctor.facts.catalogue import CATALOGUE, PHASES

    catalogue = catalogue if catalogue is not None else CATALOGUE
    lines = _header("Facts", "the fact catalogue (`sftdoctor.facts.catalogue.CATALOGUE`)")
    lines += [
        f"{len(catalogue)} facts. A check asks for facts by naming them as its parameters; `sftdoctor facts` prints",
        "the preflight ones this machine has. A fact derived from inputs (`--config`, `--model-config`, ...) is",
        "computed from them even when a snapshot is replayed (`check --facts`).",
        "",
    ]
    for phase in PHASES:
        names = sorted(n for n, f in catalogue.items() if getattr(f, "phase", "preflight") == phase)
        if not names:
            continue
        rows = [_fact_row(n, catalogue[n]) for n in names]
        lines += [f"## {phase}", ""] + _table(("fact", "what it is", "derived from", "when it is missing"), rows) + [""]
    return "\n".join(lines)


def _fact_row(name: str, fact: Any) -> tuple[str, ...]:
    inputs = ", ".join(f"`{i}`" for i in getattr(fact, "inputs", ()) or ())
    return (f"`{name}`", getattr(fact, "doc", ""), inputs, getattr(fact, "why_missing", ""))


# ---- the pages


PAGES: dict[str, Callable[[], str]] = {
    "checks.md": checks_page,
    "commands.md": commands_page,
    "config.md": config_page,
    "facts.md": facts_page,
    "topics.md": topics_page,
}


def render_all() -> dict[str, str]:
    return {name: render().rstrip("\n") + "\n" for name, render in PAGES.items()}


def stale(out: Path, pages: dict[str, str]) -> list[str]:
    """The pages under `out` that differ from `pages` or are missing."""
    return [name for name, text in pages.items() if not (out / name).is_file() or (out / name).read_text() != text]


def _shown(path: Path) -> Path:
    """The path relative to the current folder where it is below it (docs/reference/checks.md)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 naming the stale pages; write nothing")
    parser.add_argument("--out", type=Path, default=OUT, help="the folder of the pages (default: docs/reference)")
    args = parser.parse_args(argv)
    pages = render_all()
    old = stale(args.out, pages)
    if args.check:
        for name in old:
            print(f"{_shown(args.out / name)}: stale; regenerate with `{COMMAND}`", file=sys.stderr)
        return 1 if old else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name in old:
        (args.out / name).write_text(pages[name])
        print(f"wrote {_shown(args.out / name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
