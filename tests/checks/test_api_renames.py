"""api-renames: the installed trl/transformers/peft/accelerate against the rename table's broken pairs, and each
library's declared requirements on the others; on package sets recorded from real reports and wheels."""

import pytest
from conftest import severities

from sftdoctor.checks.api_renames import api_renames, raises
from sftdoctor.facts.renames import PAIRS

# Requires-Dist lines as the released metadata has them: trl v0.7.11 and v0.11.4 setup.py (git tags of
# huggingface/trl), the transformers 4.39.0 wheel's METADATA.
TRL_0_7_11 = ["torch>=1.4.0", "transformers>=4.31.0", "numpy>=1.18.2", "accelerate", "datasets"]
TRL_0_11_4 = ["torch>=1.4.0", "transformers>=4.40.0", "numpy<2.0.0,>=1.18.2", "accelerate", "datasets"]
TRANSFORMERS_4_39 = [
    "filelock",
    "accelerate (>=0.21.0) ; extra == 'accelerate'",
    "accelerate (>=0.21.0) ; extra == 'torch'",
]

# Stacks people reported working: little51/llm-dev#4 (the versions it tells ChatGLM3 fine-tuning to pin), and the
# System Info of huggingface/trl#4009 and huggingface/peft#2663.
WORKING = {
    "llm-dev#4": {"accelerate": "0.27.2", "transformers": "4.38.1", "trl": "0.7.11", "peft": "0.8.2"},
    "trl#4009": {"trl": "0.22.2", "transformers": "4.56.0", "accelerate": "1.10.1", "peft": "0.17.1"},
    "peft#2663": {"peft": "0.15.2.dev0", "trl": "0.19.1", "accelerate": "1.9.0", "transformers": "4.53.2"},
}


@pytest.mark.parametrize("report", WORKING)
def test_stacks_that_worked_in_real_reports_are_ok(run, report):
    [finding] = run("api-renames", packages=WORKING[report])
    assert finding.severity.value == "ok" and "none of the 3 known broken pairs" in finding.title


def test_old_trl_on_transformers_5_is_an_error_naming_both_versions_and_the_range_that_works(run):
    """huggingface/trl#6168: trl's own SFTTrainer passed tokenizer= to transformers' Trainer (the trl is older
    than 0.12; the thread prints neither version, 0.11.4 is the last trl before the switch)."""
    [finding] = run(
        "api-renames",
        packages={"trl": "0.11.4", "transformers": "5.25.0", "accelerate": "1.16.0"},
        package_requires={"trl": TRL_0_11_4},
    )
    assert finding.severity.value == "error"
    assert finding.title == (
        "trl 0.11.4 still uses `tokenizer=` of Trainer, which transformers 5.0.0 removed "
        "(transformers 5.25.0 is installed)"
    )
    assert "TypeError: Trainer.__init__() got an unexpected keyword argument 'tokenizer'" in finding.detail
    assert "declares transformers>=4.40.0, which admits transformers 5.25.0" in finding.detail
    assert finding.fix == (
        "pip install 'trl>=0.12.0' (its first release without it), or keep trl 0.11.4 with "
        "pip install 'transformers>=4.40.0,<5.0.0'"
    )


def test_old_trl_on_transformers_4_39_cannot_import_top_k_top_p_filtering(run):
    """huggingface/trl#1409 (2024-03-08): `from trl import SFTTrainer` fails on transformers 4.39 with trl 0.7.x."""
    [finding] = run(
        "api-renames", packages={"trl": "0.7.11", "transformers": "4.39.0"}, package_requires={"trl": TRL_0_7_11}
    )
    assert finding.severity.value == "error" and finding.evidence["fixed_in"] == "0.8.0"
    assert "ImportError: cannot import name 'top_k_top_p_filtering' from 'transformers'" in finding.detail
    assert finding.fix.endswith("pip install 'transformers>=4.31.0,<4.39.0'")


def test_old_transformers_on_accelerate_1_passes_dispatch_batches(run):
    """huggingface/transformers#34699 prints transformers 4.39.3; its Trainer passes dispatch_batches, which
    accelerate 1.0.0 removed (1.2.1 is the accelerate LLaVA-VL/LLaVA-NeXT#388 reports with the same error)."""
    [finding] = run(
        "api-renames",
        packages={"transformers": "4.39.3", "accelerate": "1.2.1"},
        package_requires={"transformers": TRANSFORMERS_4_39},
    )
    assert finding.severity.value == "error"
    assert finding.evidence == {
        **finding.evidence,
        "consumer": "transformers",
        "provider": "accelerate",
        "old": "dispatch_batches",
        "removed_in": "1.0.0",
        "fixed_in": "4.40.0",
    }
    assert "pip install 'accelerate>=0.21.0,<1.0.0'" in finding.fix


def test_a_pair_on_either_side_of_the_removal_is_not_flagged(run):
    assert severities(run("api-renames", packages={"trl": "0.11.4", "transformers": "4.57.6"})) == ["ok"]
    assert severities(run("api-renames", packages={"trl": "0.12.0", "transformers": "5.0.0"})) == ["ok"]
    assert severities(run("api-renames", packages={"transformers": "4.40.0", "accelerate": "1.16.0"})) == ["ok"]


def test_a_declared_requirement_the_installed_library_does_not_meet_is_a_warning(run):
    """trl 1.16.0's own metadata (installed here) asks for transformers>=4.56.2."""
    findings = run(
        "api-renames",
        packages={"trl": "1.16.0", "transformers": "4.50.0"},
        package_requires={"trl": ["transformers>=4.56.2", "accelerate>=1.10.1"]},
    )
    assert severities(findings) == ["warning"]
    assert findings[0].title == "trl 1.16.0 requires transformers>=4.56.2; transformers 4.50.0 is installed"


def test_without_the_stack_it_does_not_apply(run):
    skipped = run("api-renames", packages={"torch": "2.13.0"})
    assert "none of trl" in skipped.reason


def test_the_installed_stack_is_judged_from_its_own_metadata():
    from sftdoctor.facts import Facts

    facts = Facts()
    finding = api_renames(facts.get("packages"), facts.get("package_requires"))
    assert finding.severity.value == "ok" and "trl 1.16.0" in finding.title


def test_each_pair_names_an_error_python_words_as_the_triage_reads_it():
    for pair in PAIRS:
        assert pair.rename.old in raises(pair.rename)
