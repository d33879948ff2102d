"""sftdoctor.triage.parallel: a large log split across processes (`explain --log FILE --jobs N`) is diagnosed
exactly as one pass over it would be; what is not a regular file is read in one pass."""

import os

import pytest
from conftest import FIXTURES
from triage.helpers import LOGS, everything, line_of, located, log_bytes

from sftdoctor.triage import diagnose, parallel


def test_a_large_file_split_across_processes_gives_the_same_diagnosis(tmp_path):
    """Ranges cut at line starts, line numbers and skipped Trainer dicts carried across them."""
    finite = b"".join(
        b"{'loss': %.4f, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': %.2f}\n" % (2 - i / 400, i / 100)
        for i in range(400)
    )
    log = tmp_path / "train.log"
    log.write_bytes(
        finite
        + b"{'loss': nan, 'grad_norm': nan, 'epoch': 4.0}\n"
        + b"\r\n".join((FIXTURES / "logs" / e["file"]).read_bytes() for e in LOGS)
    )
    with open(log, "rb") as handle:
        alone = diagnose(handle, str(log))
    with open(log, "rb") as handle:
        split = diagnose(handle, str(log), jobs=2, range_size=4096)
    assert (split.lines, split.bytes) == (alone.lines, alone.bytes)
    assert located(split) == located(alone)
    nan = next(loc.finding for loc in split.findings if loc.finding.id == "nan-loss")
    assert nan.evidence["first_bad_entry"] == 401 and nan.evidence["last_finite_loss"] == "1.0025"


@pytest.mark.parametrize("jobs", [2, 3])
@pytest.mark.parametrize(
    "name, topic",
    [
        ("dist-nccl-timeout-legacy-seq-desync-pytorch.log", "nccl-timeout"),  # per-rank SeqNums merged from every range
        ("gpu-fp16-loss-scale-at-minimum-exit-llamafactory-baichuan13b.log", "fp16-loss-scale"),  # trajectory + cascade
        ("more-negative-deepspeed-cuda-minor-mismatch-accepted-data-loading.log", None),  # benign lines only
    ],
)
def test_a_real_log_cut_into_many_small_ranges_is_diagnosed_as_in_one_pass(name, topic, jobs):
    """Ranges of 97 bytes cut through nearly every message; the calling process scans every `jobs`-th range,
    worker processes the others."""
    path = FIXTURES / "logs" / name
    with open(path, "rb") as handle:
        alone = diagnose(handle, name)
    with open(path, "rb") as handle:
        split = diagnose(handle, name, jobs=jobs, range_size=97)
    assert everything(split) == everything(alone)
    assert (split.root and split.root.finding.id) == topic
    assert split.lines == log_bytes(name).count(b"\n") + (not log_bytes(name).endswith(b"\n"))
    if topic == "nccl-timeout":
        assert split.root.finding.evidence["seq_by_rank"] == {"0": 96120, "7": 64088}
        assert split.root.line == line_of(log_bytes(name), b"Watchdog caught")
    if topic is None:
        assert split.benign == log_bytes(name).count(b"but since the APIs are compatible") > 0


def test_a_log_big_enough_is_split_by_jobs_alone_as_the_cli_asks(tmp_path, monkeypatch):
    """`--jobs 2` on a regular file of PARALLEL_MIN bytes or more (made small here) splits it, same diagnosis."""
    log = tmp_path / "train.log"
    log.write_bytes(
        log_bytes("dist-nccl-timeout-allreduce-linenumbered-llamafactory.log")
        + log_bytes("gpu-oom-new-format-llamafactory-multirank-rank7.log")
    )
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 1024)
    monkeypatch.setattr(parallel, "RANGE", 512)
    scans = spy_on_scans(monkeypatch)
    with open(log, "rb") as handle:
        split = diagnose(handle, str(log), jobs=2)
    assert len(scans) == 1
    with open(log, "rb") as handle:
        alone = diagnose(handle, str(log), jobs=1)
    assert len(scans) == 1  # one job: one pass
    assert everything(split) == everything(alone)
    assert [loc.finding.id for loc in split.findings] == ["cuda-oom", "nccl-timeout"]


def test_a_piped_log_is_read_in_one_pass_whatever_the_jobs(monkeypatch):
    """`explain --log - --jobs 8` reads stdin: a pipe cannot be seeked into ranges."""
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    scans = spy_on_scans(monkeypatch)
    data = log_bytes("gpu-oom-new-format-llamafactory-multirank-rank7.log")
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    with open(read_end, "rb") as stream:
        diagnosis = diagnose(stream, "<stdin>", jobs=8)
    assert scans == []
    assert (diagnosis.root.finding.id, diagnosis.bytes) == ("cuda-oom", len(data))


def spy_on_scans(monkeypatch) -> list:
    """The paths ParallelScan is started on from now on."""
    started, real = [], parallel.ParallelScan

    def scan(path, *args, **kwargs):
        started.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(parallel, "ParallelScan", scan)
    return started
