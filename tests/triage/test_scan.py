"""Log triage never crashes and never reads a whole file into memory, whatever it is fed."""

import io
import itertools
import tracemalloc

from hypothesis import given, settings, strategies as st

from conftest import FIXTURES
from sftdoctor.triage import diagnose

OOM = (FIXTURES / "logs" / "gpu-oom-new-format-llamafactory-multirank-rank7.log").read_bytes()
HEALTHY = (FIXTURES / "logs" / "gpu-negative-healthy-trl-dpo-logs.log").read_bytes()


def topics(data: bytes, chunk: int = 1 << 20) -> list[str]:
    return [loc.finding.id for loc in diagnose(io.BytesIO(data), chunk=chunk).findings if loc.role != "context"]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096), st.integers(min_value=1, max_value=600))
def test_random_bytes_never_raise(data, chunk):
    diagnose(io.BytesIO(data), chunk=chunk)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([b"\n", b"\r", b"\r\n", b"\x00", b"\xff\xfe", b"\x1b[31m", b"[rank3]:", b"9: ",
                                 b"Watchdog caught collective operation timeout", b"CUDA out of memory", b"{'loss': ",
                                 b"exitcode", b"Attempted loss scale: ", b"NCCL error", b"NCCL WARN", b"Error: ",
                                 b"\xe2\x96\x88", b"\xc3", b"nan", b"1e309", b"99999999999999999999", b"(", b")", b"'"]),
                max_size=200),
       st.integers(min_value=1, max_value=64))
def test_fragments_of_signatures_in_any_order_never_raise(parts, chunk):
    diagnose(io.BytesIO(b"".join(parts)), chunk=chunk)


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
    oom = b"\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free.\n"
    tracemalloc.start()
    try:
        diagnosis = diagnose(Generated(itertools.chain(bar, [oom])))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [loc.finding.id for loc in diagnosis.findings] == ["cuda-oom"]
    assert diagnosis.bytes > 66_000_000
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_a_healthy_log_repeated_is_still_healthy():
    assert topics(HEALTHY * 50) == []
