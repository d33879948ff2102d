"""sftdoctor.triage.render: what `sftdoctor explain --log FILE` prints (the root cause first, the cascade
counted in one line) and what `--json` prints, captured as the user sees them."""

import io
import json
import re

import pytest
from triage.helpers import LOGS, by_file, diagnosis_of, line_of, log_bytes, oom_then_cascade

from sftdoctor import __version__
from sftdoctor.findings import Severity
from sftdoctor.render import MARKS
from sftdoctor.triage import diagnose
from sftdoctor.triage.render import render_diagnosis, render_diagnosis_json


def printed(diagnosis, capsys) -> list[str]:
    render_diagnosis(diagnosis)
    return capsys.readouterr().out.splitlines()


def printed_json(diagnosis, capsys) -> dict:
    render_diagnosis_json(diagnosis)
    return json.loads(capsys.readouterr().out)


def test_the_root_cause_is_named_first_and_the_cascade_counted_in_one_last_line(capsys):
    log = oom_then_cascade()
    out = printed(diagnose(io.BytesIO(log), "train.log"), capsys)
    oom_at, newlines = line_of(log, b"CUDA out of memory"), log.count(b"\n")
    assert out[0] == f"train.log: {newlines:,} lines, 0.0 MiB"
    assert out[1] == f"root cause: cuda-oom at line {oom_at} (rank 7)"
    assert out[2].startswith("✗  cuda-oom      CUDA out of memory on rank 7: asked 270.00 MiB")
    rows = [i for i, line in enumerate(out) if line.startswith("✗  ")]
    assert [out[i].split()[1] for i in rows] == ["cuda-oom", "nccl-timeout"]
    timeout_block = "\n".join(out[rows[1] :])
    assert f"after the cuda-oom at line {oom_at}, probably its consequence" in timeout_block
    assert "→ sftdoctor explain cuda-oom" in "\n".join(out[rows[0] : rows[1]])
    assert out[-1] == "ignored 100 cascade lines (child-failed ×100); `sftdoctor explain crash-log`"
    assert not any("ChildFailedError" in line for line in out)  # counted, not quoted


def test_a_root_cause_printed_after_its_symptom_in_the_log_is_still_printed_first(capsys):
    log = log_bytes("dist-nccl-timeout-allreduce-linenumbered-llamafactory.log") + log_bytes(
        "gpu-oom-new-format-llamafactory-multirank-rank7.log"
    )
    out = printed(diagnose(io.BytesIO(log), "train.log"), capsys)
    assert out[1] == f"root cause: cuda-oom at line {line_of(log, b'CUDA out of memory')} (rank 7)"
    assert [line.split()[1] for line in out if line.startswith("✗  ")] == ["cuda-oom", "nccl-timeout"]


@pytest.mark.parametrize("entry", LOGS, ids=by_file(LOGS))
def test_each_real_log_prints_its_root_cause_with_its_severity_and_where_to_read_more(entry, capsys):
    """The lines a user acts on: which topic, how bad (the mark), `sftdoctor explain TOPIC`."""
    diagnosis = diagnosis_of(entry["file"])
    out = printed(diagnosis, capsys)
    text = "\n".join(out)
    if not entry["expect"]:
        assert out[1] == "nothing recognised: no failure and no known problem in this log"
        assert not any(line.startswith((MARKS[Severity.ERROR][0], MARKS[Severity.WARNING][0])) for line in out)
        return
    root = diagnosis.root.finding
    if entry["expect"] == ["crash-log"]:  # a failure that no signature explains
        # (the id column is as wide as the longest id shown: an info finding's may be longer)
        assert out[1].startswith("failed: cause not recognised") and re.match(r"✗  crash-log +the run failed: ", out[2])
        return
    assert out[1].startswith(f"root cause: {root.id} at line {diagnosis.root.line}")
    assert root.id in entry["expect"]
    assert out[2].startswith(f"{MARKS[root.severity][0]}  {root.id}")
    assert f"fix: {root.fix}" in text and f"→ sftdoctor explain {root.explain}" in text


def test_rank_0_is_named_and_a_root_cause_without_a_rank_names_none(capsys):
    desync = printed(diagnosis_of("dist-nccl-timeout-legacy-seq-desync-pytorch.log"), capsys)
    assert desync[1] == "root cause: nccl-timeout at line 2 (rank 0)"
    launcher = printed(diagnosis_of("dist-host-oom-exitcode9-torchrun-llamafactory.log"), capsys)
    assert launcher[1] == "root cause: host-oom at line 1"


def test_a_single_cascade_line_is_counted_in_the_singular_and_the_failure_is_not_called_healthy(capsys):
    out = printed(
        diagnose(io.BytesIO(b"[rank1]: torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \ndone\n")),
        capsys,
    )
    assert (
        out[1] == "failed: cause not recognised (no known failure signature explains it; the failure is quoted below)"
    )
    assert out[2] == (
        "✗  crash-log  the run failed: the launcher tore the job down and the log holds no traceback; "
        "cause not recognised"
    )
    assert out[-1] == "ignored 1 cascade line (child-failed ×1); `sftdoctor explain crash-log`"


def test_an_unrecognised_crash_prints_where_its_first_exception_is(capsys):
    out = printed(
        diagnose(io.BytesIO(b"step 1\nTraceback (most recent call last):\nValueError: bad shape\n"), "x.log"), capsys
    )
    assert out[:3] == [
        "x.log: 3 lines, 0.0 MiB",
        "failed: cause not recognised (no known failure signature explains it; the failure is quoted below)",
        "✗  crash-log  the run failed: ValueError: bad shape (line 3; cause not recognised)",
    ]


def test_a_deprecation_notice_on_a_run_that_trained_is_shown_as_info_and_is_no_root_cause(capsys):
    log = (
        b"/usr/lib/python3/torch/utils/checkpoint.py:460: UserWarning: torch.utils.checkpoint: please pass in "
        b"use_reentrant=True or use_reentrant=False explicitly. The default value of use_reentrant will be updated\n"
        b"{'train_runtime': 100.0, 'train_samples_per_second': 3.0, 'train_loss': 1.1, 'epoch': 3.0}\n"
    )
    diagnosis = diagnose(io.BytesIO(log), "x.log")
    out = printed(diagnosis, capsys)
    assert out[1] == "nothing recognised: no failure and no known problem in this log"
    assert out[2].startswith("i  gradient-checkpointing  checkpointing without use_reentrant")
    assert diagnosis.root is None and not diagnosis.problems  # exit 0


def test_the_size_is_printed_in_mib(capsys):
    out = printed(diagnose(io.BytesIO(b"x" * 99 + b"\n" + b"y" * (3 << 20)), "big.log"), capsys)
    assert out[0] == "big.log: 2 lines, 3.0 MiB"


def test_a_one_line_log_is_counted_in_the_singular(capsys):
    out = printed(diagnose(io.BytesIO(b"[rank1]: ChildFailedError: \n"), "one.log"), capsys)
    assert out[0] == "one.log: 1 line, 0.0 MiB"


def test_the_json_document_names_the_root_cause_its_line_and_what_was_ignored(capsys):
    log = oom_then_cascade()
    diagnosis = diagnose(io.BytesIO(log), "train.log")
    doc = printed_json(diagnosis, capsys)
    assert set(doc) == {
        "sftdoctor",
        "log",
        "bytes",
        "lines",
        "verdict",
        "failed",
        "root_cause",
        "root_cause_line",
        "findings",
        "ignored",
        "signatures",
    }
    oom_at = line_of(log, b"CUDA out of memory")
    assert (doc["sftdoctor"], doc["log"], doc["bytes"], doc["lines"]) == (
        __version__,
        "train.log",
        len(log),
        log.count(b"\n"),
    )
    assert (doc["root_cause"], doc["root_cause_line"]) == ("cuda-oom", oom_at)
    assert (doc["verdict"], doc["failed"]) == ("root-cause", True)
    assert [(f["id"], f["line"], f["role"], f["severity"]) for f in doc["findings"]] == [
        ("cuda-oom", oom_at, "root", "error"),
        ("nccl-timeout", line_of(log, b"Watchdog caught"), "symptom", "error"),
    ]
    for finding in doc["findings"]:
        assert {"title", "detail", "fix", "explain", "evidence"} <= set(finding)
    assert doc["findings"][0]["evidence"]["rank"] == 7
    assert doc["ignored"] == {"cascade": {"child-failed": 100}, "benign": 0}
    assert doc["signatures"]["child-failed"] == 100 and doc["signatures"]["cuda-oom"] >= 1


def test_the_json_of_a_healthy_log_has_no_root_cause_and_counts_benign_lines(capsys):
    name = "more-negative-deepspeed-cuda-minor-mismatch-accepted-data-loading.log"
    doc = printed_json(diagnosis_of(name), capsys)
    assert (doc["root_cause"], doc["root_cause_line"], doc["findings"]) == (None, None, [])
    assert doc["ignored"] == {"cascade": {}, "benign": log_bytes(name).count(b"but since the APIs are compatible")}
    assert doc["ignored"]["benign"] > 0
