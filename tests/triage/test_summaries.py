"""sftdoctor.triage.summaries: matches turned into findings with the specifics a reader needs (which rank,
which collective, how much memory), checked against what each public report says."""

import io

import pytest
from hypothesis import given, settings, strategies as st

from triage.helpers import LOGS, by_file, diagnosis_of, problems
from sftdoctor.triage import diagnose
from sftdoctor.triage.summaries import ranks_text

WITH_EVIDENCE = [entry for entry in LOGS if entry.get("evidence")]


@pytest.mark.parametrize("entry", WITH_EVIDENCE, ids=by_file(WITH_EVIDENCE))
def test_each_real_logs_finding_carries_the_specifics_its_report_shows(entry):
    found = problems(diagnosis_of(entry["file"]))
    for topic, expected in entry["evidence"].items():
        got = found[topic]
        assert {k: got.get(k) for k in expected} == expected, (topic, got)


@pytest.mark.parametrize("ranks, text", [
    ([7], "rank 7"), ([0], "rank 0"), ([0, 1, 2, 5], "ranks 0-2, 5"), ([5, 3, 4, 0], "ranks 0, 3-5"),
    ([0, 1], "ranks 0-1"), ([1, 3, 5], "ranks 1, 3, 5"), ([], ""),
])
def test_ranks_are_named_in_runs_as_titles_show_them(ranks, text):
    assert ranks_text(ranks) == text


def test_a_cuda_oom_with_memory_reserved_but_unallocated_is_called_fragmentation():
    line = (b"[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity "
            b"of 79.15 GiB of which 1.23 GiB is free. Of the allocated memory 60.00 GiB is allocated by PyTorch, and "
            b"12.50 GiB is reserved by PyTorch but unallocated.\n")
    root = diagnose(io.BytesIO(line)).root.finding
    assert root.title == "CUDA out of memory on rank 2: asked 2.00 GiB, 1.23 GiB free of 79.15 GiB (GPU 2)"
    assert root.detail.startswith("12.50 GiB is reserved by PyTorch but unallocated: fragmentation")
    assert "expandable_segments:True" in root.detail


def test_a_cuda_oom_with_little_memory_unallocated_is_not_called_fragmentation():
    """6.23 MiB reserved but unallocated (the report's own numbers): the model simply does not fit."""
    root = diagnosis_of("gpu-oom-new-format-llamafactory-multirank-rank7.log").root.finding
    assert root.evidence["unallocated"] == "6.23 MiB"
    assert "fragmentation" not in root.detail


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([b"\n", b"\r", b"\r\n", b"\x00", b"\xff\xfe", b"\x1b[31m", b"[rank3]:", b"9: ",
                                 b"Watchdog caught collective operation timeout", b"CUDA out of memory", b"{'loss': ",
                                 b"exitcode", b"Attempted loss scale: ", b"NCCL error", b"NCCL WARN", b"Error: ",
                                 b"\xe2\x96\x88", b"\xc3", b"nan", b"1e309", b"99999999999999999999", b"(", b")", b"'"]),
                max_size=200),
       st.integers(min_value=1, max_value=64))
def test_fragments_of_signatures_in_any_order_never_raise(parts, chunk):
    """Half-matched messages feed the summaries odd specifics (huge numbers, nan, a missing field)."""
    diagnose(io.BytesIO(b"".join(parts)), chunk=chunk)
