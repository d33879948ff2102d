"""sftdoctor.triage.needles: hyperscan finds every needle's occurrences in one pass, exactly those that one
`bytes.find` pass per needle finds (and the lines holding an `only_if` word, as `re` does line by line), so
the triage diagnoses every fixture log alike with either; where hyperscan cannot be imported, the triage
falls back to the `find` passes."""

import subprocess
import sys
import threading

import pytest
from conftest import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st
from triage.helpers import everything

from sftdoctor.triage import diagnose, needles

ALL_LOGS = sorted(FIXTURES.rglob("*.log"))  # tests/fixtures/logs and sftdoctor's own runs (tests/fixtures/train)


def diagnosis(path, chunk=4096):
    with open(path, "rb") as handle:
        return diagnose(handle, path.name, chunk=chunk)


def test_hyperscan_is_installed_so_the_fast_engine_is_the_one_tested():
    assert needles.ENGINE == "hyperscan"


# Needles and logs from a few bytes, line ends included, so that needles overlap, repeat and share lines.
small = st.text(alphabet="ab\n\r\x00", min_size=1, max_size=4).map(str.encode)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(small, min_size=1, max_size=6, unique=True),
    st.binary(max_size=300) | small.map(lambda b: b * 40),
    st.integers(min_value=0, max_value=320),
)
def test_both_engines_find_the_same_occurrences(found, buf, end):
    found = tuple(sorted(found))
    end = min(end, len(buf))
    assert needles._Hyperscan(found)(buf, end) == needles._Find(found)(buf, end)


@settings(max_examples=300, deadline=None)
@given(st.lists(small, min_size=1, max_size=4), st.binary(max_size=300) | st.lists(small).map(b"".join))
def test_both_engines_find_the_same_lines_holding_a_word(words, buf):
    """Hyperscan looks for the words in all the lines at once, joined by newlines; `re`, in each line."""
    spans, start = [], 0
    for stop in [i for i, byte in enumerate(buf) if byte in b"\n\r"] + [len(buf)]:
        spans.append((start, start, stop))
        start = stop + 1
    words = tuple(words)
    assert needles._holders(words, "hyperscan")(buf, spans) == needles._holders(words, "find")(buf, spans)


def test_a_line_holds_a_word_that_is_in_it_and_never_one_with_a_line_end():
    holding = needles.holders((b"nan", b"x\ny"))
    assert holding(b"loss 1\nloss nan\nx\ny\n", [(0, 0, 6), (7, 7, 15), (16, 16, 17), (18, 18, 19)]) == [1]


def test_an_occurrence_is_its_end_offset_and_needle_index_in_order():
    find = needles.finder((b"ab", b"bab"))
    assert find(b"abab|bab", 8) == [(2, 0), (4, 0), (4, 1), (8, 0), (8, 1)]
    assert find(b"abab|bab", 7) == [(2, 0), (4, 0), (4, 1)]  # what ends past `end` is not found


def test_an_empty_needle_is_refused_rather_than_found_everywhere():
    with pytest.raises(ValueError, match="empty needle"):
        needles.finder((b"", b"x"))


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_every_fixture_log_is_diagnosed_alike_with_hyperscan_and_with_the_find_passes(path, monkeypatch):
    fast = diagnosis(path)
    monkeypatch.setattr(needles, "ENGINE", "find")
    assert everything(diagnosis(path)) == everything(fast)


def test_without_hyperscan_the_triage_falls_back_to_the_find_passes_and_finds_the_same():
    """`import hyperscan` failing (no wheel for the platform) is what the fallback is for."""
    path = FIXTURES / "logs" / "dist-nccl-timeout-allreduce-linenumbered-llamafactory.log"
    code = (
        "import sys; sys.modules['hyperscan'] = None\n"  # makes `import hyperscan` raise ImportError
        "sys.path[:0] = sys.argv[1:3]\n"
        "from triage.test_needles import diagnosis, everything, needles\n"
        "from pathlib import Path\n"
        "print(needles.ENGINE, repr(everything(diagnosis(Path(sys.argv[3])))))"
    )
    tests = str(FIXTURES.parent)
    proc = subprocess.run(
        [sys.executable, "-c", code, tests, str(FIXTURES.parents[1]), str(path)],
        capture_output=True,
        text=True,
        cwd=tests,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"find {everything(diagnosis(path))!r}"


def test_diagnoses_in_several_threads_at_once_share_the_compiled_needles_safely():
    path = FIXTURES / "logs" / "gpu-fp16-loss-scale-at-minimum-exit-llamafactory-baichuan13b.log"
    alone, results = everything(diagnosis(path, chunk=97)), []
    threads = [threading.Thread(target=lambda: results.append(everything(diagnosis(path, chunk=97)))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [alone] * 4
