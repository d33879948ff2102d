"""Which "logs" are refused before the scan: compressed and binary files; never a real log."""

import bz2
import gzip
import lzma

import pytest
from conftest import FIXTURES

from sftdoctor.triage.sniff import SAMPLE, unreadable

LOGS = sorted((FIXTURES / "logs").glob("*.log"))
HEALTHY = (FIXTURES / "logs" / "gpu-negative-healthy-trl-dpo-logs.log").read_bytes()


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_every_recorded_log_is_read(log):
    """Real logs from bug reports (tqdm's \\r redraws, colours, CJK, stray bytes) are all triaged."""
    assert unreadable(log.read_bytes()[:SAMPLE]) is None


@pytest.mark.parametrize("pack, kind", [(gzip.compress, "gzip"), (lzma.compress, "xz"), (bz2.compress, "bzip2")])
def test_a_compressed_log_is_refused_with_the_command_that_reads_it(pack, kind):
    why = unreadable(pack(HEALTHY)[:SAMPLE])
    assert why is not None and why.startswith(f"a {kind} file, not a text log: decompress it first")


def test_binary_data_is_refused_but_a_log_truncated_in_place_is_read():
    assert unreadable(bytes(range(256)) * 256) == "binary data, not a text log"
    hole = b"\x00" * 4096  # logrotate's copytruncate: the writer goes on at its old offset
    assert unreadable((hole + HEALTHY)[:SAMPLE]) is None
    assert "only NUL bytes at its start" in unreadable(b"\x00" * SAMPLE)
    assert unreadable(HEALTHY[:2000] + b"\x07\x01" + HEALTHY[2000:8000]) is None  # a few stray control bytes


def test_an_empty_log_is_refused():
    assert unreadable(b"") == "empty: there is nothing to triage"


@pytest.mark.parametrize(
    "encoding, named",
    [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE"), ("utf-32", "UTF-32")],
)
def test_a_utf16_log_from_powershell_is_refused_with_the_conversion(encoding, named):
    """PowerShell's Tee-Object writes UTF-16: with its NULs dropped it would pass as text, and match nothing."""
    wide = HEALTHY.decode("utf-8").encode(encoding)[:SAMPLE]
    assert unreadable(wide) == (
        f"a {named} text file, not UTF-8: convert it first (iconv -f {named} -t UTF-8 FILE | sftdoctor explain --log -)"
    )
