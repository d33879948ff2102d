"""The GPU/NIC link matrix of `nvidia-smi topo -m`.

Handles tab- and space-aligned output, with or without the legend, old drivers (SOC for
SYS, NIC rows named mlx5_0) and new ones (NIC0.. with a "NIC Legend", NUMA columns), and
the terminal underline escapes nvidia-smi prints around the header. Pastes too: a markdown
table (`| GPU0 | GPU1 |`), a markdown quote (`> ` before each line), a row wrapped onto the
next line, and a paste cut off in its last rows. The matrix is symmetric, so a row that is
missing or cut short is read from its column in the other rows; what could not be read is
named in "incomplete" (present only then). A matrix that contradicts itself (GPU0->GPU1 NV4 but GPU1->GPU0
SYS, a diagonal that is not X, a row of another length, a row without its column) is not a topology: given
by the user it is refused (Contradiction); probed here, the fact says only "inconsistent" and why, and no
link is judged from it. The fact is:
{"source": ..., "devices": ["GPU0", ..., "NIC0"], "nics": {"NIC0": "mlx5_0"},
 "links": {"GPU0": {"GPU1": "NV12", "NIC0": "PXB", ...}, ...},
 "affinity": {"GPU0": {"CPU Affinity": "0-47", "NUMA Affinity": "0"}},
 "incomplete": {"GPU7": "no row"}}
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, read_bytes
from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.shapes import OPT_STR

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\[[0-9;]*m(?=\S)")
_LINK = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|PSB|NA|N/A")
_DEVICE = re.compile(r"GPU\d+|NIC\d+")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_AFFINITY_NAMES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_AFFINITY_START = {"CPU", "NUMA", "GPU"}  # a header word that is not a device name
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
_MARKDOWN = re.compile(r"\\([\\_*|`])")
# The header: GPU0 as a word, followed by another device, an affinity column or nothing (not prose).
_HEADER = re.compile(r"(?:^|\s)GPU0(?:\s+(?:GPU\d+|NIC0|CPU|NUMA|[A-Za-z]+\d*_\d+)\b|\s*$)")
_TABLE_RULE = re.compile(r"[\s|:\-]*-[\s|:\-]*")


class Contradiction(InputError):
    """A matrix that contradicts itself: no link can be judged from it."""


# Closeness of a path, best first (the order of nvidia-smi's legend).
PATH_RANK = {"NV": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}


def path_kind(code: str) -> str:
    """NV12 -> "NV"; SOC (old name of SYS) -> "SYS"; PSB (old single-switch) -> "PIX"."""
    if code.startswith("NV"):
        return "NV"
    return {"SOC": "SYS", "PSB": "PIX"}.get(code, code)


def nvlink_count(code: str) -> int:
    return int(code[2:]) if re.fullmatch(r"NV\d+", code) else 0


def parse_topology(text: str, source: str = "<topology>") -> dict[str, Any]:
    lines = [_plain(line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if _HEADER.search(line)), None)
    if header_at is None:
        raise InputError(source, "no `nvidia-smi topo -m` matrix found: expected a header line with GPU0")
    words = lines[header_at].split()
    first = words.index("GPU0")  # a table may put the affinity columns first
    columns: list[str] = []
    for word in words[first:]:
        if word in _AFFINITY_START:
            break
        columns.append(word)
    if len(set(columns)) != len(columns):
        raise Contradiction(source, f"line {header_at + 1}: repeated device column in the header")
    leading = [name for name in _AFFINITY_NAMES if name in " ".join(words[:first])]
    affinity_names = leading + [name for name in _AFFINITY_NAMES if name in " ".join(words[first + len(columns) :])]

    links: dict[str, dict[str, str]] = {}
    affinity: dict[str, dict[str, str]] = {}
    nics: dict[str, str] = {}
    cut: tuple[int, str, int] | None = None  # a row with too few link codes: (line, row, codes read)
    rows = _rows(lines, header_at + 1, columns, len(leading), source)
    for number, row, values in rows:
        if row is None:
            nics[values[0]] = values[1]
            continue
        before, values = values[: len(leading)], values[len(leading) :]
        if cut is not None:  # a row follows the short one: it was not cut off at the end of a paste
            raise Contradiction(source, _short(cut[:2], len(columns)))
        codes = list(itertools.takewhile(_LINK.fullmatch, values[: len(columns)]))
        if len(values) < len(columns) and len(codes) >= len(values) - 1:  # link codes up to where it stops
            cut = (number, row, len(codes))
            links[row] = dict(zip(columns, codes[:-1]))  # its last code may be cut too (NV1 of NV12)
            continue
        if len(codes) < len(columns):
            raise Contradiction(source, _short((number, row), len(columns)))
        if codes[columns.index(row)] != "X":
            raise Contradiction(source, f"line {number}: row {row} should have X in its own column")
        links[row] = dict(zip(columns, codes))
        if extra := {name: cell for name, cell in zip(affinity_names, before + values[len(columns) :]) if cell}:
            affinity[row] = extra

    incomplete = {c: "no row" for c in columns if c not in links and c.startswith("GPU")}
    if cut is not None:
        incomplete[cut[1]] = f"row cut after {cut[2]} of {len(columns)} link codes"
    if len(incomplete) == len([c for c in columns if c.startswith("GPU")]):
        raise InputError(source, f"no complete matrix row for {', '.join(incomplete)}")
    devices = [c for c in columns if c in links or c in incomplete]
    for name in devices:  # a NIC column without its row: keep what the GPU rows say
        links.setdefault(name, {})
    if not any(d.startswith("GPU") for d in devices):
        raise InputError(source, "the matrix has no GPU rows")
    if found := contradiction(links):
        raise Contradiction(source, found[1], key=found[0])
    fact = {"devices": devices, "nics": nics, "links": links, "affinity": affinity}
    return {**fact, "incomplete": incomplete} if incomplete else fact


def contradiction(links: dict[str, dict[str, str]]) -> tuple[str, str] | None:
    """(the pair "GPU0/GPU1", what contradicts) for link codes that cannot all be true: a code that is no link,
    X off the diagonal or a device not X to itself, or a pair read differently from each end (nvidia-smi prints
    one symmetric matrix; a row may be absent, its pairs then read from the other rows)."""
    for a, row in links.items():
        for b, code in row.items():
            pair = f"{a}/{b}"
            if not _LINK.fullmatch(code):
                return pair, f"{a}->{b} is {code!r}, not a link code (X, NV#, PIX, PXB, PHB, NODE, SYS)"
            if (code == "X") != (a == b):
                return pair, (
                    f"{a}->{b} is X, which only a device's own column may be"
                    if a != b
                    else f"{a}->{a} is {code}: a device's own column is X"
                )
            back = links.get(b, {}).get(a)
            if a != b and back is not None and back != code:
                return pair, (
                    f"the matrix contradicts itself: {a}->{b} is {code} but {b}->{a} is {back} "
                    "(nvidia-smi prints one symmetric matrix)"
                )
    return None


def _plain(line: str) -> str:
    """A line without escape codes, markdown quote marks or table pipes; a table's `|---|` row is blank, its
    escapes (`mlx5\\_0`) and bold marks dropped."""
    line = _QUOTE.sub("", _ANSI.sub("", line)).rstrip()
    if line.count("|") >= 2:
        line = "" if _TABLE_RULE.fullmatch(line) else _MARKDOWN.sub(r"\1", line).replace("**", "").replace("|", "  ")
    return line.rstrip()


def _rows(
    lines: list[str], start: int, columns: list[str], leading: int, source: str
) -> list[tuple[int, str | None, list[str]]]:
    """(line number, row name, its cells: the `leading` affinity cells a table put before the name, then the
    rest) of each matrix row after the header, a row wrapped onto the next lines joined back; (line number,
    None, [NIC, name]) for each NIC legend line."""
    rows: list[tuple[int, str | None, list[str]]] = []
    seen: set[str] = set()
    for number, line in enumerate(lines[start:], start=start + 1):
        if legend := _NIC_LEGEND.match(line):
            rows.append((number, None, [legend[1], legend[2]]))
            continue
        cells = line.split()
        at = next((i for i, cell in enumerate(cells[: leading + 1]) if cell in columns), None)
        if at is not None and cells[at] not in seen:
            seen.add(cells[at])
            rows.append((number, cells[at], [""] * (leading - at) + cells[:at] + cells[at + 1 :]))
        elif len(cells) > 1 and _DEVICE.fullmatch(cells[0]) and cells[0] not in columns and _LINK.fullmatch(cells[1]):
            raise Contradiction(
                source, f"line {number}: row {cells[0]} has no column in the header ({' '.join(columns)})"
            )
        elif (
            cells
            and rows
            and rows[-1][1] is not None
            and _LINK.fullmatch(cells[0])
            and len(rows[-1][2]) < leading + len(columns)
        ):
            rows[-1][2].extend(cells)  # the rest of a row the terminal or the paste wrapped
    return rows


def _short(at: tuple[int, str], width: int) -> str:
    number, row = at
    return f"line {number}: row {row} should have {width} link codes (X, NV#, PIX, PXB, PHB, NODE, SYS)"


def gpu_names(topology: dict[str, Any]) -> list[str]:
    return [d for d in topology["devices"] if d.startswith("GPU")]


def link(topology: dict[str, Any], a: str, b: str) -> str | None:
    return topology["links"].get(a, {}).get(b) or topology["links"].get(b, {}).get(a)


def read_topology_file(path: Path) -> dict[str, Any]:
    # bytes a terminal paste garbled (a box-drawing character cut in half) are replaced, not refused
    text = read_bytes(path, "topology").decode("utf-8", errors="replace")
    return {"source": str(path), **parse_topology(text, str(path))}


def links_problem(topology: dict[str, Any]) -> tuple[str, str] | None:
    """(where, what) when a recorded matrix's rows disagree about a link, or None."""
    pair = contradiction(topology["links"])
    return (".links", f"{pair[0]}: {pair[1]}") if pair else None


@fact(
    "topology",
    "the GPU/NIC link matrix of `nvidia-smi topo -m`",
    inputs=("topology",),
    why_missing="no `nvidia-smi topo -m` available (give a saved one with --topology)",
    shape={
        "source": OPT_STR,
        "devices": [str],
        "nics": {str: str},
        "links": {str: {str: str}},
        "incomplete": {str: str},
        "inconsistent": OPT_STR,
    },
    required=("devices", "links"),
    consistent=links_problem,
)
def probe_topology(facts) -> dict[str, Any] | None:
    if facts.inputs.topology is not None:
        return read_topology_file(facts.inputs.topology)
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        proc = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        return {"source": "nvidia-smi topo -m", **parse_topology(proc.stdout, "nvidia-smi topo -m")}
    except Contradiction as exc:  # a driver's own output: said as a warning by gpu-topology, nothing judged from it
        where = f"{exc.key}: " if exc.key else ""
        return {
            "source": "nvidia-smi topo -m",
            "devices": [],
            "nics": {},
            "links": {},
            "inconsistent": f"{where}{exc.message}",
        }
    except InputError:
        return None  # a single-GPU or unusual box whose output has no matrix
