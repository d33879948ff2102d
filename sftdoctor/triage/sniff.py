"""Whether the start of a "log" is text the signatures can be matched in: a compressed or binary file
would otherwise be scanned without a hit and reported as "nothing recognised", a verdict on bytes
that were never read as a log."""

from __future__ import annotations

SAMPLE = 64 << 10

COMPRESSED = {
    b"\x1f\x8b": ("gzip", "zcat"),
    b"\x28\xb5\x2f\xfd": ("zstd", "zstdcat"),
    b"\xfd7zXZ\x00": ("xz", "xzcat"),
    b"BZh": ("bzip2", "bzcat"),
    b"PK\x03\x04": ("zip", "unzip -p"),
}
# Text in a log: printable ASCII, tab, line ends, form feed, backspace and ESC (tqdm and colours redraw
# with them), and every byte of a multi-byte UTF-8 character.
_TEXT = frozenset(range(0x20, 0x7F)) | frozenset(b"\t\n\r\f\b\x1b") | frozenset(range(0x80, 0x100))
# Logs carry a few stray control bytes (a killed process's half-written line, a terminal's bell): a
# sample is binary only when more than this share of its bytes is neither text nor NUL.
MAX_NON_TEXT = 0.05


def unreadable(head: bytes) -> str | None:
    """Why a log that starts with `head` (its first SAMPLE bytes) cannot be triaged, or None."""
    if not head:
        return "empty: there is nothing to triage"
    for magic, (kind, cat) in COMPRESSED.items():
        if head.startswith(magic):
            return f"a {kind} file, not a text log: decompress it first ({cat} FILE | sftdoctor explain --log -)"
    wide = _utf16_or_32(head)
    if wide:  # PowerShell's Tee-Object and Out-File write UTF-16: the needles, in UTF-8, would never match
        return (
            f"a {wide} text file, not UTF-8: convert it first (iconv -f {wide} -t UTF-8 FILE | "
            "sftdoctor explain --log -)"
        )
    # NUL bytes do not count against a log: a file truncated in place under a writer (logrotate's
    # copytruncate) starts with a hole of them.
    rest = head.replace(b"\x00", b"")
    non_text = sum(1 for byte in rest if byte not in _TEXT)
    if not rest or non_text > MAX_NON_TEXT * len(rest):
        return "binary data, not a text log" + (
            " (only NUL bytes at its start: tr -d '\\000' < FILE | sftdoctor explain --log -)" if not rest else ""
        )
    return None


def _utf16_or_32(head: bytes) -> str | None:
    """UTF-32 or UTF-16 by their byte-order mark, or UTF-16 without one: ASCII text in it puts a NUL at every
    other byte, where a log truncated in place has them in one run."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    pairs = len(head) // 2
    if pairs < 16:
        return None
    even, odd = head[0 : 2 * pairs : 2].count(0), head[1 : 2 * pairs : 2].count(0)
    if max(even, odd) > 0.4 * pairs and min(even, odd) < 0.05 * pairs:
        return "UTF-16LE" if odd > even else "UTF-16BE"  # ASCII's high byte, after it or before
    return None
