"""The knowledge base: every finding's topic exists and reads as a topic."""

import re

import pytest

from sftdoctor import kb
from sftdoctor.checks import load_checks
from sftdoctor.errors import InputError


def test_every_check_has_a_topic_of_its_own_name_and_plugin_problems_have_one_too():
    names = {t.name for t in kb.topics()}
    checks = load_checks(plugins=False).checks.values()
    assert {spec.explain for spec in checks} <= names
    assert {spec.id for spec in checks} <= names
    assert "plugins" in names


@pytest.mark.parametrize("topic", kb.topics(), ids=lambda t: t.name)
def test_topics_have_a_summary_and_the_sections_a_reader_needs(topic):
    assert 0 < len(topic.summary) <= 100
    for section in ("## Symptoms", "## Causes", "## How to tell them apart", "## Fix", "## Caught in advance by"):
        assert section in topic.body, (topic.name, section)


def test_a_misspelt_topic_suggests_the_right_one():
    with pytest.raises(InputError, match="did you mean 'gpu-topology'"):
        kb.topic("gpu-topolgy")


def test_the_topics_a_dead_run_needs_exist_beyond_the_checks():
    names = {t.name for t in kb.topics()}
    assert {
        "nan-loss",
        "nccl-timeout",
        "nccl-error",
        "cuda-oom",
        "host-oom",
        "torch-cuda-match",
        "bf16-support",
        "flash-attn",
        "gpu-topology",
        "model-dtype",
        "deepspeed-precision",
        "fp16-loss-scale",
        "zero-stage",
        "batch-size",
        "lr-scheduler",
        "gradient-checkpointing",
        "packing",
        "master-port",
        "crash-log",
    } <= names


def test_log_signatures_are_valid_and_point_to_summaries_that_exist():
    from sftdoctor.triage.registry import SUMMARIES
    from sftdoctor.triage.signatures import signatures

    found = signatures()
    assert len(found) >= 30
    assert all(s.summariser in SUMMARIES for s in found if s.summariser)
    assert all(s.fix for s in found if s.role in ("root", "symptom"))


@pytest.mark.parametrize(
    "entry, says",
    [
        (
            {"id": "x", "needle": "NCCL WARN", "regex": "NCCL\\s+WARN", "role": "context"},
            "must contain 'NCCL WARN' literally",
        ),
        ({"id": "x", "needle": ["a", "b"], "role": "root"}, "several needles need a regex"),
        ({"id": "x", "needle": "a", "role": "fatal"}, "role must be one of"),
        ({"id": "x", "needle": "a", "role": "root", "wrap": 1}, "unknown keys ['wrap']"),
    ],
)
def test_a_signature_whose_needle_could_miss_its_regex_is_refused(entry, says):
    """The needle is the prefilter: a regex that could match a line without it would silently never fire."""
    from sftdoctor.triage.signatures import _signature

    with pytest.raises(ValueError, match=re.escape(says)):
        _signature("topic", entry)


BODY = """## Causes
### port-busy: a previous run holds the port
1. A crashed torchrun.

```bash
### not-a-section
```
### Which rank, and why
Prose under a heading that is not a slug: not a section, and it ends the one above.
### deprecated
2. Old names.
## Fix
"""


def test_a_section_is_a_level_3_slug_heading_up_to_the_next_heading_outside_code():
    assert kb.sections(BODY) == {
        "port-busy": "### port-busy: a previous run holds the port\n1. A crashed torchrun.\n\n```bash\n"
        "### not-a-section\n```\n",
        "deprecated": "### deprecated\n2. Old names.\n",
    }


@pytest.mark.parametrize("name", ["nccl-env/port-busy", "nccl-env#port-busy"])
def test_topic_slash_section_is_that_section_alone_with_the_topics_title(name):
    whole, part = kb.topic("nccl-env"), kb.topic(name)
    assert part.name == "nccl-env/port-busy" and part.summary == whole.summary
    assert part.body.startswith("### port-busy") and "## Fix" not in part.body and part.body.strip() in whole.body


def test_an_unknown_section_is_bad_input_with_the_sections_there():
    with pytest.raises(
        InputError,
        match="topic 'nccl-env' has no section 'port-bsy' \\(did you mean 'port-busy'\\?\\); its sections: port-busy, ",
    ):
        kb.topic("nccl-env/port-bsy")
    with pytest.raises(InputError, match="topic 'cuda-oom' has no section 'x'; it has no sections"):
        kb.topic("cuda-oom/x")
    with pytest.raises(InputError, match="no topic 'ncc-env'"):
        kb.topic("ncc-env/port-busy")


def test_explain_prints_a_section_alone_and_the_topic_whole(capsys):
    from sftdoctor.triage.command import main

    assert main("nccl-env/port-busy") == 0
    out = capsys.readouterr().out
    assert out.startswith("# nccl-env/port-busy\n\n" + kb.topic("nccl-env").summary + "\n\n### port-busy\n")
    assert "## Symptoms" not in out and "### deprecated" not in out
    assert main("nccl-env") == 0 and "## Symptoms" in capsys.readouterr().out


def test_every_section_slug_of_a_topic_is_unique():
    import re

    for topic in kb.topics():
        heads = re.findall(r"^### ([a-z0-9]+(?:-[a-z0-9]+)*)(?::.*)?$", topic.body, re.MULTILINE)
        assert len(heads) == len(set(heads)), topic.name
