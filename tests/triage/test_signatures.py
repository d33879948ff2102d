"""sftdoctor.triage.signatures: the `[[signatures]]` kb topics declare, each proven on a real log, and
front matter that would make a signature silently never match refused with a message naming it."""

import pytest
from triage.helpers import LOGS, diagnosis_of

from sftdoctor.triage.signatures import _signature, signatures


def test_every_signature_matches_at_least_one_real_excerpt():
    """sftdoctor's own lines (`sftdoctor-*`) come from real runs instead: tests/train/test_watch.py."""
    seen = set()
    for entry in LOGS:
        seen |= set(diagnosis_of(entry["file"]).matched)
    missing = {s.id for s in signatures() if not s.id.startswith("sftdoctor-")} - seen
    assert not missing, sorted(missing)


def test_every_signature_points_to_a_topic_with_a_title_or_fix_a_reader_can_act_on():
    """Roots and symptoms are findings: the report shows their fix and `sftdoctor explain TOPIC`."""
    from sftdoctor import kb

    names = {t.name for t in kb.topics()}
    for sig in signatures():
        assert sig.topic in names, sig.id
        if sig.role in ("root", "symptom") and not sig.summariser:
            assert sig.fix, sig.id


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"id": "x", "needle": "CUDA out of memory", "role": "root", "regexp": "CUDA"}, "unknown keys ['regexp']"),
        ({"id": "x", "needle": "CUDA out of memory", "role": "cause"}, "role must be one of"),
        (
            {"id": "x", "needle": "CUDA out of memory", "role": "root", "severity": "fatal"},
            "severity must be error, warning or info",
        ),
        (
            {"id": "x", "needle": ["CUDA out of memory", "CUDA error: out of memory"], "role": "root"},
            "several needles need a regex",
        ),
        (
            {"id": "x", "needle": "CUDA out of memory", "role": "root", "regex": "out of memory"},
            "the regex must contain 'CUDA out of memory' literally",
        ),
        ({"id": "x", "needle": "CUDA out of memory", "role": "root", "wraps": 5}, "wraps must be 0, 1 or 2"),
    ],
)
def test_a_signature_that_could_never_match_as_meant_is_refused_naming_topic_and_id(entry, message):
    with pytest.raises(ValueError) as raised:
        _signature("cuda-oom", entry)
    assert "kb topic cuda-oom" in str(raised.value) and message in str(raised.value)
    if "unknown keys" not in message:
        assert "'x'" in str(raised.value)


def test_a_needle_without_a_regex_is_matched_literally():
    """A needle with regex metacharacters (`Timeout(ms)=`) means those characters, not a pattern."""
    sig = _signature("nccl-timeout", {"id": "x", "needle": "Timeout(ms)=", "role": "symptom"})
    assert sig.regex.search("WorkNCCL(SeqNum=1, Timeout(ms)=600000)")
    assert not sig.regex.search("Timeoutms=600000")
