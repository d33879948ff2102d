"""training-targets on the installed stack: the tiny example's rows through a real SFTTrainer, and tokenizers
built to reproduce each trap (a template without EOS, no generation markers, two BOS, pad = eos, rows cut at
max_length). Each probe is a child process of seconds: end-to-end, so slow."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLES
from trainrun import tiny_qwen2, write_config

from sftdoctor.checks import load_checks, run_checks
from sftdoctor.facts import Facts, Inputs

pytestmark = pytest.mark.slow

GENERATION = "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"


def example(
    tmp_path,
    template=None,
    tokenizer_changes=None,
    text=None,
    max_length=256,
    packing=False,
    post_processor=None,
    conversations=None,
    model_keys=None,
    training_keys=None,
):
    """A copy of the tiny example with its tokenizer changed; the run's findings of training-targets."""
    model = tmp_path / "model"
    shutil.copytree(EXAMPLES / "tiny" / "model", model)
    if post_processor is not None:
        fast = json.loads((model / "tokenizer.json").read_text())
        fast["post_processor"] = post_processor
        (model / "tokenizer.json").write_text(json.dumps(fast))
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if template is not None:
        config["chat_template"] = template(config["chat_template"])
    config.update(tokenizer_changes or {})
    config_path.write_text(json.dumps(config))
    data = EXAMPLES / "tiny" / "data" / "train.jsonl"
    if text is not None:
        data = tmp_path / "text.jsonl"
        rows = [
            json.loads(line)["messages"]
            for line in (EXAMPLES / "tiny" / "data" / "train.jsonl").read_text().splitlines()
        ]
        data.write_text("".join(json.dumps({"text": text(m)}) + "\n" for m in rows[:40]))
    if conversations is not None:
        data = tmp_path / "chats.jsonl"
        rows = [
            json.loads(line)["messages"]
            for line in (EXAMPLES / "tiny" / "data" / "train.jsonl").read_text().splitlines()
        ]
        data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations(rows)))
    cfg = write_config(
        tmp_path,
        {
            "model": {"path": str(model), "weights": "random", **(model_keys or {})},
            "data": {"train": str(data), "max_length": max_length},
            "training": {"packing": packing, "max_steps": 4, "output_dir": "out", **(training_keys or {})},
        },
    )
    registry = load_checks(plugins=False)
    findings, _ = run_checks(registry.select(["training-targets"]), Facts(Inputs(config=cfg)))
    return findings


def by_severity(findings):
    return {f.severity.value: [x.title for x in findings if x.severity == f.severity] for f in findings}


@pytest.mark.parametrize("packing", [False, True])
def test_the_tiny_example_trains_its_end_of_turn_token_packed_or_not(tmp_path, packing):
    [finding] = example(tmp_path, packing=packing)
    assert finding.severity.value == "ok", finding.title
    assert finding.title.startswith("<|im_end|> is the last target of ")
    assert "(assistant turns only)" in finding.title and "0 of " in finding.title
    assert "[[" in finding.evidence["first_sample"] and "<|im_end|>]]" in finding.evidence["first_sample"]


def test_a_template_that_never_closes_the_answer_is_an_error(tmp_path):
    findings = example(
        tmp_path,
        template=lambda t: t.replace(GENERATION, "{% generation %}{{ message['content'] }}{% endgeneration %}"),
    )
    errors = by_severity(findings).get("error", [])
    assert any("end their targets without <|im_end|>" in t for t in errors), [f.title for f in findings]


def unmarked(template):
    return template.replace("{% generation %}", "").replace("{% endgeneration %}", "")


def test_a_template_without_generation_markers_trains_with_sftdoctors_drop_in(tmp_path):
    """The tiny ChatML template stripped of its markers: sftdoctor's chatml.jinja renders it exactly, so the
    loss still covers the assistant turns only, and the finding names the template."""
    [finding] = example(tmp_path, template=unmarked)
    assert finding.severity.value == "ok" and "(assistant turns only)" in finding.title, finding.title
    assert "Chat template: sftdoctor's chatml.jinja" in finding.detail
    assert finding.evidence["own_template_differs"] == 0 == finding.evidence["saved_template_differs"]


def test_a_template_without_markers_and_no_drop_in_trains_every_turn(tmp_path):
    """No newline after the last turn (a real Qwen1.5 fine-tuning template): no bundled template renders it."""

    def no_last_newline(template):
        return unmarked(template).replace(
            "'<|im_end|>' }}{{ '\\n' }}", "'<|im_end|>' }}{% if not loop.last %}{{ '\\n' }}{% endif %}"
        )

    findings = example(tmp_path, template=no_last_newline)
    warnings = [f for f in findings if f.severity.value == "warning"]
    assert any(
        "the loss covers every turn" in f.title
        and "100% of the tokens are targets" in f.title
        and f.fix.startswith("[model] chat_template = ")
        for f in warnings
    ), [f.title for f in findings]


def test_trls_training_template_saved_as_the_tokenizers_own_is_named_and_its_fix_is_quiet(tmp_path):
    """Qwen3's template (TRL's bundled copy) drops <think> from earlier turns, TRL's training copy keeps it:
    multi-turn rows train in one format and the saved model is prompted in another."""
    import trl

    folder = Path(trl.__file__).parent / "chat_templates"

    def pairs(rows):
        return [a + b for a, b in zip(rows[::2], rows[1::2])]

    findings = example(
        tmp_path / "a", template=lambda _: (folder / "qwen3.jinja").read_text(), conversations=pairs, max_length=1024
    )
    [saved] = [f for f in findings if "saved with the model renders" in f.title]
    assert saved.severity.value == "warning" and str(folder / "qwen3_training.jinja") in saved.fix
    fixed = example(
        tmp_path / "b",
        template=lambda _: (folder / "qwen3.jinja").read_text(),
        conversations=pairs,
        max_length=1024,
        model_keys={"chat_template": str(folder / "qwen3_training.jinja")},
    )
    assert [f.severity.value for f in fixed] == ["ok"], [f.title for f in fixed]


def test_pad_equal_to_eos_still_trains_eos_with_trls_collator(tmp_path):
    """TRL 1.16 pads labels by position, so pad = eos (what sftdoctor sets without a pad token) keeps EOS a target."""
    [finding] = example(tmp_path, tokenizer_changes={"pad_token": None})
    assert finding.severity.value == "ok", finding.title
    assert finding.evidence["pad_token_id"] == finding.evidence["eos_token_id"] == 2


def test_a_bos_the_text_already_has_is_doubled_by_the_tokenizer(tmp_path):
    """Text rows rendered with a BOS, and a tokenizer that adds one: every sample starts with two."""

    def text(messages):
        return "<|im_start|>" + messages[0]["content"] + " " + messages[1]["content"] + "<|im_end|>"

    adds_bos = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
    }
    findings = example(tmp_path, text=text, tokenizer_changes={"bos_token": "<|im_start|>"}, post_processor=adds_bos)
    errors = by_severity(findings).get("error", [])
    assert any("start with 2 BOS tokens" in t for t in errors), [f.title for f in findings]


def test_rows_longer_than_max_length_lose_their_end_and_the_length_that_keeps_them_is_named(tmp_path):
    findings = example(tmp_path, max_length=24)
    [cut] = [f for f in findings if "longer than max_length 24" in f.title]
    assert cut.severity.value == "warning" and "[data] max_length = " in cut.fix
    keep = int(cut.fix.split("= ")[1].split()[0])
    lengths = sorted(cut.evidence["full_lengths"])
    assert sum(n <= keep for n in lengths) >= 0.99 * len(lengths) and keep > 24


def test_the_end_of_turn_token_joins_what_generate_stops_at():
    """A base model's generation_config stops at <|endoftext|>; its chat turns end with <|im_end|>."""
    from transformers import AutoTokenizer

    from sftdoctor.facts.trainer_inputs import end_of_turn
    from sftdoctor.train.sft import stop_at_end_of_turn

    tokenizer = AutoTokenizer.from_pretrained(EXAMPLES / "tiny" / "model")
    model = tiny_qwen2()
    model.generation_config.eos_token_id = 0  # <|endoftext|>
    assert end_of_turn(tokenizer) == 2
    stop_at_end_of_turn(model, tokenizer)
    assert model.generation_config.eos_token_id == [0, 2]
    stop_at_end_of_turn(model, tokenizer)  # once
    assert model.generation_config.eos_token_id == [0, 2]


def test_generation_markers_around_the_user_turn_too_train_text_outside_the_answers(tmp_path):
    """A template that marks every turn for the loss: the check names a target span that is in no answer."""

    def every_turn(template):
        user = "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        assert user in template
        return template.replace(user, "{% generation %}" + user + "{% endgeneration %}")

    findings = example(tmp_path, template=every_turn)
    errors = [f for f in findings if "train on text outside the answers" in f.title]
    assert errors and errors[0].severity.value == "error", [f.title for f in findings]


def test_a_copy_of_the_same_run_reads_the_probe_back_and_a_changed_template_probes_again(tmp_path, monkeypatch):
    """What `train`'s gate and `check` ask again and again: answered from the cache when the files are the same."""
    monkeypatch.setenv("SFTDOCTOR_CACHE", str(tmp_path / "cache"))
    first = example(tmp_path / "a")
    # another folder, the same files; another batch and optimizer, which the collated rows do not depend on
    again = example(
        tmp_path / "b", training_keys={"per_device_batch_size": 2, "global_batch_size": 8, "learning_rate": 1e-5}
    )
    assert [f.title for f in again] == [f.title for f in first]
    assert len(list((tmp_path / "cache" / "probes").glob("targets-*.json"))) == 1
    changed = example(tmp_path / "c", max_length=24)
    assert [f.title for f in changed] != [f.title for f in first]
    assert len(list((tmp_path / "cache" / "probes").glob("targets-*.json"))) == 2


def test_the_fields_the_probe_is_not_keyed_by_are_the_plans_own():
    """A learning-rate sweep's trials differ only in fields the collated rows do not depend on: one answer
    serves them all, and a misspelt field here would quietly key every trial apart."""
    import dataclasses

    from sftdoctor.facts.targets_probe import UNSEEN
    from sftdoctor.run import Plan

    assert {f.name for f in dataclasses.fields(Plan)} >= UNSEEN
