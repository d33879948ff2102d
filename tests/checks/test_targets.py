"""training-targets, rule by rule, on the probe's real reading of the bundled example (tests/fixtures/
training_targets), one field changed at a time. The probe itself runs end to end in
tests/facts/test_targets_probe.py."""

import copy
import json
from types import SimpleNamespace

import pytest
from conftest import FIXTURES

from sftdoctor.checks.targets import training_targets
from sftdoctor.findings import Finding

READ = json.loads((FIXTURES / "training_targets" / "tiny_qwen2_messages_packed.json").read_text())
PLAN = SimpleNamespace(chat_template=None, reasons={"chat_template": "the tokenizer's own"})


def judged(change=None, plan=PLAN, chat_template=None):
    probe = copy.deepcopy(READ)
    if change:
        change(probe)
    found = training_targets(plan, probe, chat_template)
    return {(f.severity.value, f.title) for f in ([found] if isinstance(found, Finding) else found)}


def titles(found, severity):
    return [t for s, t in found if s == severity]


def test_the_bundled_example_learns_its_answers_and_where_they_stop():
    [(severity, title)] = judged()
    assert severity == "ok"
    assert title == (
        "<|im_end|> is the last target of 8 of 8 samples (packed); 36% of tokens are targets "
        "(assistant turns only); 0 of 8 rows cut at max_length 256"
    )


def first(field, value):
    def change(probe):
        probe["samples"][0][field] = value

    return change


def both(*changes):
    def change(probe):
        for c in changes:
            c(probe)

    return change


@pytest.mark.parametrize(
    "change, severity, says",
    [
        (
            both(
                first("stop_masked", True),
                first("last_target_is_stop", False),
                lambda p: p.update(pad_token_id=p["eos_token_id"]),
            ),
            "error",
            "<|im_end|> ends 1 of 8 samples but is never a target: the model will not learn to stop",
        ),
        (
            first("last_target_is_stop", False),
            "error",
            "1 of 8 samples end their targets without <|im_end|>, and not because max_length cut them",
        ),
        (first("leading_bos", 2), "error", "1 of 8 samples start with 2 BOS tokens"),
        (
            lambda p: p.update(assistant_only_loss=False),
            "warning",
            "the loss covers every turn (36% of the tokens are targets), not only the assistant's",
        ),
        (
            lambda p: p.update(saved_template_differs=3),
            "warning",
            "the chat template saved with the model renders 3 of 8 sampled rows differently from how they were trained",
        ),
        (first("stray_targets", ["user:"]), "error", "1 of 8 samples train on text outside the answers, e.g. 'user:'"),
        (
            lambda p: p.update(max_length=60),
            "warning",
            "1 of 8 sampled rows are longer than max_length 60 and lose their end (their <|im_end|> with it)",
        ),
        (
            lambda p: p.update(generation_eos=[151643]),
            "info",
            "the model's generation_config.json stops at [151643] but its turns end with <|im_end|> (2)",
        ),
    ],
)
def test_each_rule_fires_on_its_own_problem(change, severity, says):
    found = judged(change)
    assert says in " | ".join(titles(found, severity)), found
    assert bool(titles(found, "ok")) == (severity == "info")  # the ok line only when nothing is wrong


def test_a_drop_in_template_is_only_questioned_when_sftdoctor_chose_it():
    differs = lambda p: p.update(own_template_differs=2, chat_template="chatml")  # noqa: E731
    chosen = SimpleNamespace(chat_template="chatml", reasons={})
    assert titles(judged(differs, plan=chosen), "warning") == [
        "the drop-in template chatml renders 2 of 8 sampled rows differently from the tokenizer's own"
    ]
    assert titles(judged(differs, plan=chosen, chat_template={"given": True}), "warning") == []


def test_a_probe_that_could_not_read_the_trainer_back_is_a_warning_never_ok():
    [(severity, title)] = judged(lambda p: p.clear() or p.update(error="the probe took over 600 s"))
    assert severity == "warning" and title.startswith("what the trainer will optimise could not be read back")
