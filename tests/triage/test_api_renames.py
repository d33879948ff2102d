"""api-renames in real logs: a `got an unexpected keyword argument`, `cannot import name` or `has no attribute` whose
name is in the rename table (sftdoctor/facts/renames.py) names the rename, its releases and the versions the log
shows, however the log was pasted; a name that is not in the table is left to the crash verdict
(tests/fixtures/logs/index.json cites each log)."""

import io
import re
import traceback
import warnings

import pytest
from triage.helpers import LOGS, PASTES, by_file, diagnosis_of, log_bytes, problems, wrapped

from sftdoctor.facts.distributions import version
from sftdoctor.facts.renames import ATTRIBUTE, IMPORT, RENAMES
from sftdoctor.run.gpus import version_tuple
from sftdoctor.triage import diagnose
from sftdoctor.triage.renamed import versions_in

RENAME_LOGS = [e for e in LOGS if e["file"].startswith("api-renames-")]


def renames_in(text: str) -> dict:
    return problems(diagnose(io.BytesIO(text.encode())))


def test_the_class_has_real_logs_from_several_projects_and_renames_of_each_library():
    assert len(RENAME_LOGS) >= 3 and len({e["project"] for e in RENAME_LOGS}) >= 6
    assert {e["evidence"]["api-renames"]["library"] for e in RENAME_LOGS} == {"trl", "transformers", "accelerate"}


@pytest.mark.parametrize("form", PASTES)
@pytest.mark.parametrize("entry", RENAME_LOGS, ids=by_file(RENAME_LOGS))
def test_each_log_names_its_rename_as_the_root_however_it_was_pasted(entry, form):
    text = PASTES[form](log_bytes(entry["file"]).decode("utf-8"))
    diagnosis = diagnose(io.BytesIO(text.encode()))
    found = problems(diagnosis)
    assert sorted(found) == sorted(entry["expect"]), entry["what"]
    assert diagnosis.root.finding.id == "api-renames"
    expected = entry["evidence"]["api-renames"]
    assert {k: found["api-renames"].get(k) for k in ("library", "old")} == {k: expected[k] for k in ("library", "old")}


@pytest.mark.parametrize("entry", RENAME_LOGS, ids=by_file(RENAME_LOGS))
def test_the_finding_carries_the_releases_and_versions_the_log_gives(entry):
    diagnosis = diagnosis_of(entry["file"])
    found = problems(diagnosis)
    for topic, specifics in entry["evidence"].items():
        assert {k: found[topic].get(k) for k in specifics} == specifics
    finding = diagnosis.root.finding
    library = found["api-renames"]["library"]
    assert f"installed here: {library} {version(library)}" in finding.detail  # marked: the log may be from elsewhere
    assert found["api-renames"]["removed_in"] in finding.title


def test_a_library_that_uses_the_old_name_itself_is_named_with_the_release_to_move_to():
    """QwenLM/Qwen#1326: the last frame is transformers/trainer.py and the log prints transformers 4.32.0."""
    finding = diagnosis_of("api-renames-accelerator-dispatch-batches-old-transformers-qwen.log").root.finding
    assert finding.detail.startswith(
        "the call is inside transformers (transformers/trainer.py): transformers before "
        "4.40.0 uses it itself (the log shows transformers 4.32.0)"
    )
    assert finding.fix == "pip install 'transformers>=4.40.0', or pin accelerate<1.0.0"
    own = diagnosis_of("api-renames-accelerator-dispatch-batches-llava-next.log").root.finding  # LLaVA's own trainer
    assert own.fix.startswith("Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=...))")


@pytest.mark.parametrize(
    "text",
    [
        # lavis-nlp/jerex#19: Lightning's Trainer, an argument no HF library renamed
        "TypeError: Trainer.__init__() got an unexpected keyword argument 'gpus'\n",
        # argilla-io/argilla#4510: a class of another library with its own __init__
        "ArgillaTrainer.__init__() got an unexpected keyword argument 'tokenizer'\n",
        # huggingface/peft#2474: the example's own dataclass, not a TRL config
        "AttributeError: 'DataTrainingArguments' object has no attribute 'max_seq_length'\n",
        # huggingface/trl#3132: SFTTrainer never took model_init
        "TypeError: SFTTrainer.__init__() got an unexpected keyword argument 'model_init'\n",
        # huggingface/setfit#574: setfit's own CallbackHandler
        "AttributeError: 'CallbackHandler' object has no attribute 'tokenizer'\n",
        # mzbac/mlx-lora#3: another library's import
        "ImportError: cannot import name 'LoRALinear' from 'mlx_lm.lora' "
        "(/opt/homebrew/lib/python3.11/site-packages/mlx_lm/lora.py)\n",
    ],
)
def test_a_name_that_is_not_in_the_table_is_not_claimed(text):
    assert "api-renames" not in renames_in(text)


def test_the_new_name_on_an_old_library_says_which_release_introduced_it():
    """huggingface/trl#2226 (trl 0.11.3) and huggingface/setfit#528 (transformers before 4.41)."""
    dpo = renames_in("TypeError: DPOTrainer.__init__() got an unexpected keyword argument 'processing_class'\n")
    assert dpo["api-renames"]["side"] == "new" and dpo["api-renames"]["library"] == "trl"
    diagnosis = diagnose(io.BytesIO(b"AttributeError: 'TrainingArguments' object has no attribute 'eval_strategy'\n"))
    title = diagnosis.root.finding.title
    assert title.startswith("`eval_strategy` is newer than this transformers: transformers 4.41.0")
    assert diagnosis.root.finding.fix.startswith("pip install 'transformers>=4.41.0'")


@pytest.mark.parametrize(
    "message, row",
    [
        (
            "TypeError: SFTTrainer.__init__() got an unexpected keyword argument 'tokenizer'",
            ("trl", "SFTTrainer", "0.16.0"),
        ),
        (
            "TypeError: Accelerator.__init__() got an unexpected keyword argument 'dispatch_batches'",
            ("accelerate", "Accelerator", "1.0.0"),
        ),  # not TrainingArguments' dispatch_batches, the table's first
        ("AttributeError: 'SFTConfig' object has no attribute 'max_seq_length'", ("trl", "SFTConfig", "0.20.0")),
    ],
)
def test_a_class_cut_off_by_a_narrow_wrap_is_read_from_the_line_before(message, row):
    """Wrapped at 40 columns the class ends a line and the needle starts the next: the row is the class's."""
    text = wrapped(message, 40)
    assert len(text.splitlines()) >= 2 and not any(n in text.splitlines()[0] for n in ("unexpected", "has no"))
    found = renames_in(text)["api-renames"]
    assert (found["library"], found["owner"], found["removed_in"]) == row


def test_versions_are_read_in_the_forms_logs_print_them():
    """trl's issue template (huggingface/trl#4009), the Qwen template (QwenLM/Qwen#1326), pip pins."""
    assert versions_in("- TRL version: 0.22.2") == [("trl", "0.22.2")]
    assert versions_in("- Transformers version: 4.56.0") == [("transformers", "4.56.0")]
    assert versions_in("- Transformers: 4.32.0") == [("transformers", "4.32.0")]
    assert versions_in("accelerate==0.27.2") == [("accelerate", "0.27.2")]
    assert versions_in("peft: 0.15.2.dev0") == [("peft", "0.15.2.dev0")]
    assert versions_in('File "/x/site-packages/transformers/trainer.py", line 376') == []


def _calls(model_dir, out_dir):
    """Each row's old name, used on the installed stack: (row, the traceback it raised, or None)."""
    import trl
    from accelerate import Accelerator
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    def used(row):
        kw = {row.old: 1}
        if row.kind == IMPORT:
            return lambda: exec(f"from {row.owner} import {row.old}", {})
        if row.kind == ATTRIBUTE and row.owner == "Trainer":
            args = TrainingArguments(output_dir=out_dir, use_cpu=True, report_to=[])
            return lambda: getattr(Trainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=args), row.old)
        if row.kind == ATTRIBUTE:
            return lambda: getattr(AutoConfig.from_pretrained(model_dir), row.old)
        return {
            "TrainingArguments": lambda: TrainingArguments(output_dir=out_dir, use_cpu=True, **kw),
            "SFTConfig": lambda: trl.SFTConfig(output_dir=out_dir, use_cpu=True, bf16=False, **kw),
            "GRPOConfig": lambda: trl.GRPOConfig(output_dir=out_dir, use_cpu=True, bf16=False, **kw),
            "SFTTrainer": lambda: trl.SFTTrainer(model=None, **kw),
            "Trainer": lambda: Trainer(model=None, **kw),
            "Accelerator": lambda: Accelerator(**kw),
            "from_pretrained": lambda: AutoModelForCausalLM.from_pretrained(model_dir, **kw),
        }[row.owner]

    for row in RENAMES:
        if row.removed is None or version_tuple(version(row.library)) < version_tuple(row.removed):
            continue
        try:
            used(row)()
            yield row, None
        except Exception:
            yield row, traceback.format_exc()


@pytest.mark.slow
def test_each_removed_name_raises_on_the_installed_stack_and_its_traceback_names_that_row(tmp_path):
    """The table against the stack installed here (transformers 5.25, trl 1.16, accelerate 1.16, peft 0.21.2): every
    row removed by the installed release raises when used, and the triage of that real traceback names the same row
    (same library, owner and old name), from the error text alone. The check catches it before launch only where a
    library uses another's old name; a user's script is not run by the rehearsal."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained("examples/tiny/model")
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    seen = 0
    with warnings.catch_warnings():  # the deprecation warnings of the calls that still work
        warnings.simplefilter("ignore")
        calls = list(_calls(str(tmp_path / "model"), str(tmp_path / "out")))
    for row, text in calls:
        assert text is not None, f"{row.library} {version(row.library)} accepts {row.owner} {row.old}"
        assert re.search(r"(TypeError|ImportError|AttributeError): ", text.splitlines()[-1]), text
        found = renames_in(text).get("api-renames")
        assert found and (found["library"], found["old"], found["side"]) == (row.library, row.old, "old"), text
        assert found["owner"] == row.owner or row.kind == IMPORT, (found, row)
        seen += 1
    assert seen >= 60
