"""docs/reference/ is rendered from the code (sftdoctor/reference.py): the committed pages must be what the code
renders now, and each page must follow the code it is rendered from (a check, a key, a topic, an option, a fact
added there shows up here)."""

import dataclasses
import re
from pathlib import Path

import click

from sftdoctor import reference
from sftdoctor.checks import Registry, check, load_checks
from sftdoctor.findings import ok
from sftdoctor.kb import Topic
from sftdoctor.run.config import Section, key

REGENERATE = "python -m sftdoctor.reference"


def test_the_committed_reference_pages_are_the_ones_the_code_renders():
    pages = reference.render_all()
    stale = reference.stale(reference.OUT, pages)
    assert not stale, f"docs/reference/ is stale: {', '.join(stale)}; regenerate with `{REGENERATE}`"


def test_check_mode_names_the_stale_pages_and_writes_nothing(tmp_path, capsys):
    assert reference.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(reference.PAGES)
    assert reference.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "config.md").write_text("edited by hand\n")
    (tmp_path / "facts.md").unlink()
    capsys.readouterr()
    assert reference.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "config.md: stale" in err and "facts.md: stale" in err and "checks.md" not in err, err
    assert REGENERATE in err
    assert (tmp_path / "config.md").read_text() == "edited by hand\n" and not (tmp_path / "facts.md").exists()


def test_the_output_does_not_depend_on_this_machine():
    pages = reference.render_all()
    assert pages == reference.render_all()
    for name, text in pages.items():
        assert str(reference.ROOT) not in text and str(Path.home()) not in text, name


@check("zz-new-check", "a check added in a test", phase="postrun", messages={"too-high": "the value | is too high"})
def zz_new_check(curves):
    return ok("fine")


def test_a_new_check_and_its_messages_appear_in_checks_md():
    registry = Registry()
    registry.scan(zz_new_check, "sftdoctor")
    page = reference.checks_page(registry)
    assert "## postrun" in page and "## preflight" not in page
    assert (
        "| `zz-new-check` | a check added in a test | [zz-new-check](../../sftdoctor/kb/topics/zz-new-check.md) |"
        in page
    )
    assert "`zz-new-check/too-high`: the value \\| is too high |" in page  # escaped once, in the one cell


def test_every_built_in_check_is_in_checks_md():
    page = reference.checks_page()
    registry = load_checks(plugins=False)
    assert registry.checks and all(f"| `{i}` |" in page for i in registry.checks)
    for spec in registry.checks.values():
        for slug in getattr(spec, "messages", {}):
            assert f"`{spec.id}/{slug}`" in page


@dataclasses.dataclass(frozen=True)
class Extra(Section):
    """[extra]: a section added in a test."""

    colour: str = key("one of red, blue", lambda v: v in ("red", "blue"), "red", doc="the colour | of it")
    size: int = key("an integer", lambda v: isinstance(v, int), required=True)


def test_a_new_section_and_its_keys_appear_in_config_md():
    page = reference.config_page({"extra": Extra}, sweep={})
    assert "## [extra]\n\n[extra]: a section added in a test." in page
    assert '| `colour` | `str` | `"red"` | one of red, blue | the colour \\| of it |' in page
    assert "| `size` | `int` | required | an integer |  |" in page


def test_every_key_of_the_run_config_is_in_config_md():
    from sftdoctor.run.config import SECTIONS, keys

    page = reference.config_page()
    for name, kind in SECTIONS.items():
        section = page.split(f"## [{name}]\n", 1)[1].split("\n## ", 1)[0]
        assert all(f"| `{k}` |" in section for k in keys(kind)), name


def test_topics_md_lists_each_topic_with_the_checks_pointing_to_it():
    registry = Registry()
    registry.scan(zz_new_check, "sftdoctor")
    topics = [Topic("zz-new-check", "what it is about", "body", {"checks": ["other"], "signatures": [{}, {}]})]
    page = reference.topics_page(topics, registry)
    link = "[zz-new-check](../../sftdoctor/kb/topics/zz-new-check.md)"
    assert f"| {link} | what it is about | `other`, `zz-new-check` | 2 |" in page
    from sftdoctor import kb

    full = reference.topics_page()
    assert all(f"[{t.name}](" in full for t in kb.topics())


def test_commands_md_has_every_command_and_option():
    @click.group()
    def group():
        """A group."""

    @group.command()
    @click.option("--speed", type=int, default=3, show_default=True, help="How fast.")
    @click.argument("target")
    def go(speed, target):
        """Go somewhere.

        Exit 0: arrived."""

    page = reference.commands_page(group)
    assert (
        "## sftdoctor go\n\n```\nUsage: sftdoctor go [OPTIONS] TARGET\n```\n\nGo somewhere.\n\nExit 0: arrived." in page
    )
    assert "| `--speed INTEGER` | How fast. [default: 3] |" in page
    from sftdoctor.cli import main

    full = reference.commands_page()
    for name, command in main.commands.items():
        assert f"## sftdoctor {name}\n" in full
        assert all(opt in full for p in command.params if isinstance(p, click.Option) for opt in p.opts)


def test_facts_md_has_every_fact_with_its_phase():
    from sftdoctor.facts.catalogue import CATALOGUE

    @dataclasses.dataclass(frozen=True)
    class Fact:
        doc: str
        phase: str = "preflight"
        inputs: tuple = ()
        why_missing: str = "not here"

    page = reference.facts_page({"zz_fact": Fact("a fact of a test", "runtime", ("config",))})
    assert "## runtime\n\n| fact | what it is | derived from | when it is missing |" in page
    assert "| `zz_fact` | a fact of a test | `config` | not here |" in page
    full = reference.facts_page()
    assert all(f"| `{name}` |" in full for name in CATALOGUE)


def test_every_relative_link_of_the_readme_and_docs_names_a_file():
    """The README points into docs/ and docs/reference/ into the kb: a page moved or renamed breaks no link."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    pages = [reference.ROOT / "README.md", *sorted((reference.ROOT / "docs").rglob("*.md"))]
    broken = [
        f"{page.relative_to(reference.ROOT)}: {target}"
        for page in pages
        for target in link.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()
    ]
    assert len(pages) > 5 and not broken, broken
