"""Log triage on real excerpts from public bug reports (tests/fixtures/logs/index.json cites each)."""

import io

import pytest

from conftest import FIXTURES, index
from sftdoctor.findings import Severity
from sftdoctor.triage import diagnose

LOGS = index("logs")


def diagnosis_of(name: str, chunk: int = 1 << 20):
    with open(FIXTURES / "logs" / name, "rb") as handle:
        return diagnose(handle, name, chunk=chunk)


def problems(diagnosis) -> dict[str, dict]:
    """topic -> the evidence of its first warning/error finding."""
    found = {}
    for loc in diagnosis.findings:
        if loc.finding.severity.rank >= Severity.WARNING.rank:
            found.setdefault(loc.finding.id, loc.finding.evidence)
    return found


def test_the_corpus_is_big_enough_cited_and_has_negative_controls():
    assert len(LOGS) >= 20
    assert all(entry["source"].startswith("https://github.com/") for entry in LOGS)
    assert sum(1 for entry in LOGS if not entry["expect"]) >= 4
    assert {t for entry in LOGS for t in entry["expect"]} >= {
        "nccl-timeout", "nccl-error", "cuda-oom", "host-oom", "torch-cuda-match", "flash-attn", "bf16-support",
        "nan-loss", "fp16-loss-scale", "gradient-checkpointing", "master-port"}


@pytest.mark.parametrize("entry", LOGS, ids=lambda e: e["file"])
def test_each_real_log_is_diagnosed_as_its_topic_and_nothing_else(entry):
    found = problems(diagnosis_of(entry["file"]))
    assert sorted(found) == sorted(entry["expect"]), entry["what"]
    for topic, expected in entry.get("evidence", {}).items():
        got = found[topic]
        assert {k: got.get(k) for k in expected} == expected, (topic, got)


@pytest.mark.parametrize("entry", [e for e in LOGS if e["expect"]], ids=lambda e: e["file"])
def test_the_root_cause_comes_first_and_names_a_topic_to_read(entry):
    diagnosis = diagnosis_of(entry["file"])
    assert diagnosis.root is diagnosis.findings[0]
    assert diagnosis.root.finding.id in entry["expect"]
    assert diagnosis.root.finding.fix


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_chunk_boundaries_do_not_change_the_diagnosis(chunk):
    """The scanner reads fixed chunks; a message split across two must be found all the same."""
    for entry in LOGS:
        small, whole = diagnosis_of(entry["file"], chunk), diagnosis_of(entry["file"])
        assert [(l.line, l.finding) for l in small.findings] == [(l.line, l.finding) for l in whole.findings], entry["file"]
        assert small.lines == whole.lines


def test_a_cuda_oom_on_one_rank_is_the_root_cause_not_the_timeouts_and_sigterms_it_caused():
    """Slurm-style interleaving: rank 3 runs out of memory, the others time out in NCCL, torchrun tears down."""
    oom = (FIXTURES / "logs" / "gpu-oom-new-format-llamafactory-multirank-rank7.log").read_bytes()
    timeouts = (FIXTURES / "logs" / "dist-nccl-timeout-allreduce-linenumbered-llamafactory.log").read_bytes()
    cascade = b"".join(b"[rank0]: torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" for _ in range(100))
    log = b"{'loss': 1.25, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}\n" + oom + timeouts + cascade
    diagnosis = diagnose(io.BytesIO(log))
    assert diagnosis.root.finding.id == "cuda-oom"
    assert diagnosis.root.finding.evidence["rank"] == 7
    later = {loc.finding.id: loc.finding for loc in diagnosis.findings[1:]}
    assert "probably its consequence" in later["nccl-timeout"].detail
    assert diagnosis.cascade["child-failed"] == 100


def test_a_large_file_split_across_processes_gives_the_same_diagnosis(tmp_path):
    """Ranges cut at line starts, line numbers and skipped Trainer dicts carried across them."""
    finite = b"".join(b"{'loss': %.4f, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': %.2f}\n" % (2 - i / 400, i / 100)
                      for i in range(400))
    log = tmp_path / "train.log"
    log.write_bytes(finite + b"{'loss': nan, 'grad_norm': nan, 'epoch': 4.0}\n"
                    + b"\r\n".join((FIXTURES / "logs" / e["file"]).read_bytes() for e in LOGS))
    with open(log, "rb") as handle:
        alone = diagnose(handle, str(log))
    with open(log, "rb") as handle:
        split = diagnose(handle, str(log), jobs=2, range_size=4096)
    assert (split.lines, split.bytes) == (alone.lines, alone.bytes)
    assert [(l.line, l.finding) for l in split.findings] == [(l.line, l.finding) for l in alone.findings]
    nan = next(l.finding for l in split.findings if l.finding.id == "nan-loss")
    assert nan.evidence["first_bad_entry"] == 401 and nan.evidence["last_finite_loss"] == "1.0025"


def test_every_signature_matches_at_least_one_real_excerpt():
    """sftdoctor's own lines (`sftdoctor-*`) come from real runs instead: tests/train/test_watch_runs.py."""
    from sftdoctor.triage.signatures import signatures

    seen = set()
    for entry in LOGS:
        seen |= set(diagnosis_of(entry["file"]).matched)
    missing = {s.id for s in signatures() if not s.id.startswith("sftdoctor-")} - seen
    assert not missing, sorted(missing)
