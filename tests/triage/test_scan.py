"""sftdoctor.triage.scan: the log is streamed in chunks, whatever its bytes; a message is found wherever
the chunks cut it, with its line number and rank, and never by reading a whole file into memory."""

import io
import itertools
import textwrap
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from triage.helpers import LOGS, diagnosis_of, located, log_bytes, topics

from sftdoctor.triage import diagnose

OOM = log_bytes("gpu-oom-new-format-llamafactory-multirank-rank7.log")
OOM_LINE = (
    b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
    b"GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free."
)


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_chunk_boundaries_do_not_change_the_diagnosis(chunk):
    """The scanner reads fixed chunks; a message split across two must be found all the same."""
    for entry in LOGS:
        small, whole = diagnosis_of(entry["file"], chunk), diagnosis_of(entry["file"])
        assert located(small) == located(whole), entry["file"]
        assert small.lines == whole.lines


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_a_wrapped_entry_split_across_chunks_still_gives_its_step(chunk):
    """The lines before a hit at the start of a chunk come with it: a wrapped mmengine entry, its step on the
    first line and the NaN on the third, read in chunks that cut it anywhere."""
    text = log_bytes("nan-xtuner-mmengine-grad-norm-nan.log").decode()
    wrapped = "".join(textwrap.fill(line, 60) + "\n" for line in text.splitlines()).encode()
    found = {loc.finding.id: loc.finding.evidence for loc in diagnose(io.BytesIO(wrapped), chunk=chunk).findings}
    assert found["nan-loss"]["step"] == 240


@pytest.mark.parametrize(
    "prefix",
    [
        b"[rank3]:",
        b"[default3]:",
        b"3: ",
        b"0: [rank3]:",
        b"[rank3]:[12345] ",
        b"\x1b[31m[rank3]:\x1b[0m",
        b"[PG 1 Rank 3] ",
    ],
)
def test_the_rank_a_launcher_prefix_or_torch_names_is_the_rank_reported(prefix):
    """torch >= 2.2, torchrun --tee / accelerate, srun -l (nested too), colour codes, torch's own `[PG 1 Rank 3]`."""
    diagnosis = diagnose(io.BytesIO(b"step 1\n" + prefix + OOM_LINE + b"\n"))
    assert diagnosis.root.finding.id == "cuda-oom"
    assert diagnosis.root.finding.evidence["rank"] == 3
    assert diagnosis.root.finding.title.startswith("CUDA out of memory on rank 3")
    assert "\x1b" not in diagnosis.root.finding.evidence["text"]


def test_a_message_after_a_redrawn_progress_bar_is_found_on_its_own_line_number():
    """tqdm redraws with `\\r`: the message after the bar is found, and line numbers count newlines only."""
    bar = b"".join(b"\r%3d%%|%s|" % (i, b"#" * i) for i in range(0, 100, 5))
    diagnosis = diagnose(io.BytesIO(b"loading\nstep 1\n" + bar + b"\r" + OOM_LINE + b"\nafter\n"))
    assert diagnosis.root.line == 3 and diagnosis.root.finding.id == "cuda-oom"
    assert diagnosis.root.finding.evidence["text"].startswith("torch.OutOfMemoryError")
    assert diagnosis.lines == 4


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096), st.integers(min_value=1, max_value=600))
def test_random_bytes_never_raise(data, chunk):
    diagnose(io.BytesIO(data), chunk=chunk)


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["utf-8", "latin-1", "utf-16", "utf-32", "cp1252"]))
def test_text_in_other_encodings_never_raises(text, encoding):
    diagnose(io.BytesIO(text.encode(encoding, "replace")))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=200).filter(lambda b: b"\n" not in b and b"\r" not in b), max_size=20))
def test_junk_lines_around_a_real_failure_do_not_change_its_diagnosis(junk):
    """A CUDA OOM between arbitrary junk lines is still a CUDA OOM (and junk alone is not a finding)."""
    noise = b"\n".join(junk) + b"\n"
    assert topics(noise + OOM + noise) == topics(OOM) == ["cuda-oom"]


class Generated(io.RawIOBase):
    """A file-like log made on the fly, so the test itself holds none of it."""

    def __init__(self, parts):
        self.parts, self.pending = iter(parts), b""

    def readable(self):
        return True

    def read(self, size=-1):
        while len(self.pending) < size and (part := next(self.parts, None)) is not None:
            self.pending += part
        out, self.pending = self.pending[:size], self.pending[size:]
        return out


def test_an_enormous_line_is_read_in_bounded_memory_and_a_signature_after_it_is_found():
    """66 MB without a newline (a tqdm bar that never ends), then a CUDA OOM: found, with a few MB held."""
    bar = (b"\xe2\x96\x88" * (1 << 20) for _ in range(22))
    oom = b"\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free.\n"  # noqa: E501 - a real log line, kept whole
    tracemalloc.start()
    try:
        diagnosis = diagnose(Generated(itertools.chain(bar, [oom])))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [loc.finding.id for loc in diagnosis.findings] == ["cuda-oom"]
    assert diagnosis.bytes > 66_000_000
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
