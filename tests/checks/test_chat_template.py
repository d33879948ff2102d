"""chat-template, on the data and chat_template facts as recorded from the tiny example (its tokenizer with and
without a template) and the installed stack's versions; and the training-targets check that defers to it."""

import pytest

from sftdoctor.checks import NotApplicable
from sftdoctor.checks.chat_template import chat_template
from sftdoctor.checks.targets import training_targets

NONE = {"folder": "models/Llama-3.1-8B", "has_template": False, "generation_markers": False, "trl_patchable": False}
SOME = {"folder": "models/Qwen2.5-1.5B", "has_template": True, "generation_markers": False, "trl_patchable": False}
CHAT = {"train": {"files": ["train.jsonl"], "rows": 50000, "format": "messages", "shape": "messages"}}
STACK = {"transformers": "5.25.0", "trl": "1.16.0"}


def test_chat_rows_and_no_template_is_an_error_saying_what_the_installed_stack_does():
    finding = chat_template(CHAT, NONE, STACK)
    assert (finding.severity.value, finding.title) == (
        "error",
        "the tokenizer (models/Llama-3.1-8B) has no chat template, and 50,000 of the 50,000 rows are chat (messages)",
    )
    assert (
        "TRL 1.16.0's SFTTrainer renders each conversation with tokenizer.apply_chat_template and adds no "
        "template of its own" in finding.detail
    )
    assert "transformers 5.25.0 raises `ValueError: Cannot use chat template functions" in finding.detail
    assert finding.fix.startswith("[model] chat_template = a .jinja file")


def test_transformers_before_4_43_falls_back_to_a_class_default_a_warning():
    finding = chat_template(CHAT, NONE, {"transformers": "4.41.2", "trl": "0.9.6"})
    assert finding.severity.value == "warning"
    assert "falls back to the tokenizer class's default template" in finding.detail
    assert finding.evidence["falls_back"] is True


def test_sharegpt_and_alpaca_rows_are_chat_rows_too_and_conversational_prompts():
    sharegpt = {"train": {"rows": 10, "format": "sharegpt", "shape": "messages"}}
    assert chat_template(sharegpt, NONE, STACK).title.endswith("10 of the 10 rows are chat (sharegpt)")
    mixed = {
        "train": {"rows": 10, "format": "prompt_completion", "shape": "prompt_completion", "conversational_rows": 4}
    }
    assert chat_template(mixed, NONE, STACK).title.endswith("4 of the 10 rows are chat (prompt_completion)")


def test_text_rows_need_no_template():
    text = {"train": {"rows": 10, "format": "text", "shape": "text"}}
    with pytest.raises(NotApplicable, match="the rows are text"):
        chat_template(text, NONE, STACK)
    plain = {
        "train": {"rows": 10, "format": "prompt_completion", "shape": "prompt_completion", "conversational_rows": 0}
    }
    with pytest.raises(NotApplicable):
        chat_template(plain, NONE, STACK)


def test_a_template_present_or_given_is_ok_naming_it():
    assert (
        chat_template(CHAT, SOME, STACK).title == "the 50,000 chat rows are rendered with the chat template of "
        "models/Qwen2.5-1.5B"
    )
    given = {**NONE, "has_template": True, "given": "templates/llama3.jinja"}
    assert chat_template(CHAT, given, STACK).title.endswith("of templates/llama3.jinja")


def test_training_targets_leaves_the_missing_template_to_this_check():
    """The training-targets probe cannot build the trainer without a template: one finding, not two."""
    from types import SimpleNamespace

    from sftdoctor.facts.targets_probe import NO_TEMPLATE

    plan = SimpleNamespace(data_shape="messages", chat_template=None)
    with pytest.raises(NotApplicable, match="the chat-template check reports it"):
        training_targets(plan, {"error": NO_TEMPLATE}, NONE)
    other = training_targets(plan, {"error": "the training-targets probe took over 600 s"}, SOME)
    assert other.severity.value == "warning"


def test_the_training_targets_probe_does_not_build_a_trainer_that_cannot_be_built(tmp_path):
    """The tiny example with its template removed: the probe answers at once, without a child process."""
    import json
    import shutil

    from conftest import EXAMPLES

    from sftdoctor.facts import Facts, Inputs
    from sftdoctor.facts.targets_probe import NO_TEMPLATE, probe_training_targets

    shutil.copytree(EXAMPLES / "tiny" / "model", tmp_path / "model")
    config = json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())
    (tmp_path / "model" / "tokenizer_config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "chat_template"})
    )
    shutil.copy(EXAMPLES / "tiny" / "data" / "eval.jsonl", tmp_path / "train.jsonl")
    (tmp_path / "run.toml").write_text(
        '[model]\npath = "model"\nweights = "random"\n[data]\ntrain = "train.jsonl"\n[training]\npacking = false\n'
    )  # "auto" would probe packing
    facts = Facts(Inputs(config=tmp_path / "run.toml"))
    assert facts.get("chat_template")["has_template"] is False
    assert probe_training_targets(facts) == {"error": NO_TEMPLATE}


def test_the_data_fact_counts_prompt_completion_rows_whose_prompt_is_a_conversation(tmp_path):
    import json

    from sftdoctor.facts.data import describe

    rows = [
        {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]},
        {"prompt": "q", "completion": "a"},
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert describe([str(tmp_path / "d.jsonl")])["conversational_rows"] == 1
