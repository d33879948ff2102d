"""sftdoctor.triage.diagnose: what a log is diagnosed as, the root cause before its symptoms, the cascade
counted apart; on real excerpts from public bug reports (tests/fixtures/logs/index.json cites each)."""

import io

import pytest
from triage.helpers import LOGS, POSITIVE, by_file, diagnosis_of, line_of, log_bytes, oom_then_cascade, problems, topics

from sftdoctor.findings import Severity
from sftdoctor.triage import diagnose

HEALTHY = log_bytes("gpu-negative-healthy-trl-dpo-logs.log")


def test_the_corpus_is_big_enough_cited_and_has_negative_controls():
    assert len(LOGS) >= 20
    # a public report's URL, or a log recorded here by running the real stack, whose source says how
    assert all(
        entry["source"].startswith("https://github.com/")
        or (entry["project"] == "recorded" and entry["source"].startswith("recorded on "))
        for entry in LOGS
    )
    assert sum(1 for entry in LOGS if not entry["expect"]) >= 4
    assert {t for entry in LOGS for t in entry["expect"]} >= {
        "nccl-timeout",
        "nccl-error",
        "cuda-oom",
        "host-oom",
        "torch-cuda-match",
        "flash-attn",
        "bf16-support",
        "nan-loss",
        "fp16-loss-scale",
        "gradient-checkpointing",
        "master-port",
    }


@pytest.mark.parametrize("entry", LOGS, ids=by_file(LOGS))
def test_each_real_log_is_diagnosed_as_its_topic_and_nothing_else(entry):
    """(The specifics each finding carries: test_summaries.py.)"""
    found = problems(diagnosis_of(entry["file"]))
    assert sorted(found) == sorted(entry["expect"]), entry["what"]


@pytest.mark.parametrize("entry", POSITIVE, ids=by_file(POSITIVE))
def test_the_root_cause_comes_first_and_names_a_topic_to_read(entry):
    diagnosis = diagnosis_of(entry["file"])
    assert diagnosis.root is diagnosis.findings[0]
    assert diagnosis.root.finding.id in entry["expect"]
    assert diagnosis.root.finding.fix


@pytest.mark.parametrize("entry", LOGS, ids=by_file(LOGS))
def test_the_exit_status_says_problem_exactly_for_the_logs_that_have_one(entry):
    """`sftdoctor explain --log` exits 1 when `problems`, else 0: the negative controls must exit 0."""
    assert diagnosis_of(entry["file"]).problems is bool(entry["expect"]), entry["what"]


def test_a_cuda_oom_on_one_rank_is_the_root_cause_not_the_timeouts_and_sigterms_it_caused():
    """Slurm-style interleaving: rank 7 runs out of memory, the others time out in NCCL, torchrun tears down."""
    diagnosis = diagnose(io.BytesIO(oom_then_cascade()))
    assert diagnosis.root.finding.id == "cuda-oom"
    assert diagnosis.root.finding.evidence["rank"] == 7
    later = {loc.finding.id: loc.finding for loc in diagnosis.findings[1:]}
    assert "probably its consequence" in later["nccl-timeout"].detail
    assert diagnosis.cascade["child-failed"] == 100


def test_a_root_cause_logged_after_a_symptom_still_comes_first_but_the_symptom_is_not_called_its_consequence():
    """Ranks flush at different times: a timeout may be printed before the OOM that caused it. The OOM is still
    the root cause; the timeout, printed before it, is not said to come after it."""
    log = log_bytes("dist-nccl-timeout-allreduce-linenumbered-llamafactory.log") + log_bytes(
        "gpu-oom-new-format-llamafactory-multirank-rank7.log"
    )
    diagnosis = diagnose(io.BytesIO(log))
    assert [(loc.line, loc.finding.id) for loc in diagnosis.findings] == [
        (line_of(log, b"CUDA out of memory"), "cuda-oom"),
        (line_of(log, b"Watchdog caught"), "nccl-timeout"),
    ]
    assert diagnosis.root.role == "root"
    assert "consequence" not in diagnosis.findings[1].finding.detail


def test_an_unrecognised_crash_is_a_problem_that_quotes_its_first_exception():
    log = b'step 1\nTraceback (most recent call last):\n  File "train.py", line 3\nValueError: bad shape (3, 4)\n'
    diagnosis = diagnose(io.BytesIO(log))
    assert diagnosis.verdict == "failed-unrecognised" and diagnosis.problems  # `explain --log` exits 1
    [only] = diagnosis.findings
    assert only.finding.severity is Severity.ERROR and only.finding.id == "crash-log"
    assert only.finding.title == "the run failed: ValueError: bad shape (3, 4) (line 4; cause not recognised)"
    assert only.finding.evidence["text"] == "ValueError: bad shape (3, 4)"


def test_an_exception_message_that_goes_on_to_the_next_line_is_quoted_with_it():
    """torch's load_state_dict error (nn/modules/module.py), as a rank printed it under torchrun >= 2.2."""
    log = (
        b"[rank0]: [rank0]: RuntimeError: Error(s) in loading state_dict for Qwen2ForCausalLM:\n"
        b"[rank0]: [rank0]: \tsize mismatch for lm_head.weight: copying a param with shape torch.Size([64, 16]) "
        b"from checkpoint, the shape in current model is torch.Size([128, 16]).\n"
    )
    [only] = diagnose(io.BytesIO(log)).findings
    assert only.finding.id == "crash-log" and only.finding.evidence["rank"] == 0
    assert only.finding.evidence["text"].startswith(
        "RuntimeError: Error(s) in loading state_dict for Qwen2ForCausalLM: size mismatch for lm_head.weight"
    )


def test_a_recognised_failure_gets_no_pointer_to_the_first_exception():
    """The OOM line is also a Python exception line; the report names the OOM, not "no known signature"."""
    assert [loc.finding.id for loc in diagnosis_of("gpu-oom-new-format-llamafactory-multirank-rank7.log").findings] == [
        "cuda-oom"
    ]


def test_a_healthy_log_repeated_is_still_healthy():
    assert topics(HEALTHY * 50) == []


def test_a_deepspeed_value_transformers_refuses_is_the_root_cause_with_its_key():
    """sftdoctor's own 2-rank run (tests/fixtures/train): every rank raises the same ValueError."""
    from pathlib import Path

    log = Path(__file__).resolve().parents[1] / "fixtures" / "train" / "torchrun-ds-batch-mismatch-2ranks.log"
    with open(log, "rb") as stream:
        diagnosis = diagnose(stream)
    assert diagnosis.root.finding.id == "batch-size" and diagnosis.root.finding.evidence["ranks"] == [0, 1]
    assert diagnosis.root.finding.title == (
        "the DeepSpeed JSON fixes train_batch_size=999 but the run has "
        "train_batch_size (calculated)=8: transformers refuses it"
    )
