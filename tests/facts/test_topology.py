"""The `nvidia-smi topo -m` parser against real outputs from public reports, and fuzzed."""

import contextlib

import pytest
from conftest import fixture_text, index, recorded_topology
from hypothesis import given, settings
from hypothesis import strategies as st

from sftdoctor.errors import InputError
from sftdoctor.facts.topology import gpu_names, link, parse_topology

TOPOLOGIES = index("topology")


@pytest.mark.parametrize("entry", TOPOLOGIES, ids=[e["file"] for e in TOPOLOGIES])
def test_real_topologies_parse_to_what_the_matrix_says(entry):
    topo = recorded_topology(entry["file"])
    assert len(gpu_names(topo)) == entry["gpus"]
    assert len([d for d in topo["devices"] if not d.startswith("GPU")]) == entry["nics"]
    for pair, code in entry["expect"].items():
        a, b = pair.split("-", 1)
        if b not in topo["devices"]:  # the index may name a NIC by its legend name (mlx5_0)
            b = {name: column for column, name in topo["nics"].items()}.get(b, b)
        assert link(topo, a, b) == code, pair


def test_the_collection_covers_the_layouts_users_paste():
    files = {e["file"]: e for e in TOPOLOGIES}
    assert len(files) >= 6
    assert {e["whitespace"] for e in TOPOLOGIES} >= {"tabs", "spaces"}
    assert any("SOC" in fixture_text("topology", f) for f in files)  # old drivers
    assert any("NIC Legend" in fixture_text("topology", f) for f in files)  # new drivers
    assert any("Legend" not in fixture_text("topology", f) for f in files)
    assert sum(e.get("layout") == "markdown-table" for e in TOPOLOGIES) >= 2  # pasted into issues and READMEs


def test_a_table_that_puts_the_affinity_columns_first_reads_them_per_gpu():
    """ALCF's Polaris guide: `| CPU Affinity | NUMA Affinity | | GPU0 |...` and NIC names escaped `mlx5\\_0`."""
    topo = recorded_topology("a100_4x_polaris_markdown_table_affinity_first_argonne.txt")
    assert topo["affinity"]["GPU3"] == {"CPU Affinity": "0-7,32-39", "NUMA Affinity": "0"}
    assert "mlx5_0" in topo["devices"] and "mlx5_0" not in topo["affinity"]


def test_nic_legend_maps_nic_columns_to_device_names():
    topo = recorded_topology("h100_8x_nic_legend_princeton_pli.txt")
    assert topo["nics"] and all(name.startswith("NIC") for name in topo["nics"])
    assert all(v for v in topo["nics"].values())


def test_affinity_columns_are_read_per_gpu():
    topo = recorded_topology("dgx_a100_8x_mlx5_gengwg.txt")
    assert set(topo["affinity"]["GPU0"]) == {"CPU Affinity", "NUMA Affinity"}
    assert topo["affinity"]["GPU0"]["NUMA Affinity"] == "3"


def test_terminal_underline_escapes_around_the_header_are_ignored():
    text = "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\x1b[0m\nGPU0\t X \tNV4\t0-11\t0\nGPU1\tNV4\t X \t0-11\t0\n"
    topo = parse_topology(text)
    assert link(topo, "GPU0", "GPU1") == "NV4"
    assert topo["affinity"]["GPU1"] == {"CPU Affinity": "0-11", "NUMA Affinity": "0"}


MARKDOWN = """\
|        | GPU0 | GPU1 | GPU2 | GPU3 | CPU Affinity | NUMA Affinity |
|--------|------|------|------|------|--------------|---------------|
| GPU0   | X    | NV4  | SYS  | SYS  | 0-15         | 0             |
| GPU1   | NV4  | X    | SYS  | SYS  | 0-15         | 0             |
| GPU2   | SYS  | SYS  | X    | NV4  | 16-31        | 1             |
| GPU3   | SYS  | SYS  | NV4  | X    | 16-31        | 1             |
"""


def test_a_matrix_pasted_as_a_markdown_table_reads_like_the_plain_one():
    topo = parse_topology(MARKDOWN)
    assert gpu_names(topo) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert link(topo, "GPU0", "GPU1") == "NV4" and link(topo, "GPU1", "GPU2") == "SYS"
    assert topo["affinity"]["GPU2"] == {"CPU Affinity": "16-31", "NUMA Affinity": "1"}
    assert "incomplete" not in topo


def test_a_matrix_quoted_in_markdown_reads_like_the_plain_one():
    quoted = "".join(f"> {line}\n" for line in MARKDOWN.splitlines())
    assert parse_topology(quoted) == parse_topology(MARKDOWN)


def test_a_paste_cut_in_its_last_row_is_read_from_the_other_rows_and_says_what_was_missing():
    cut = MARKDOWN[: MARKDOWN.index("\n| GPU3") + len("\n| GPU3   | SYS  | SY")]
    topo = parse_topology(cut)
    assert link(topo, "GPU2", "GPU3") == "NV4" and link(topo, "GPU0", "GPU3") == "SYS"
    assert topo["incomplete"] == {"GPU3": "row cut after 1 of 4 link codes"}
    without = parse_topology(MARKDOWN[: MARKDOWN.index("\n| GPU3")])
    assert without["incomplete"] == {"GPU3": "no row"} and link(without, "GPU1", "GPU3") == "SYS"


def test_two_missing_rows_leave_their_own_pair_unknown():
    topo = parse_topology(MARKDOWN[: MARKDOWN.index("\n| GPU2")])
    assert topo["incomplete"] == {"GPU2": "no row", "GPU3": "no row"}
    assert link(topo, "GPU2", "GPU3") is None and link(topo, "GPU0", "GPU2") == "SYS"


def test_a_row_the_terminal_wrapped_is_joined_back():
    text = (
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\n"
        "GPU0\t X \tNV12\n\tNV12\t0-7\n"
        "GPU1\tNV12\t X \tNV12\t0-7\n"
        "GPU2\tNV12\tNV12\t X \t0-7\n"
    )
    topo = parse_topology(text)
    assert link(topo, "GPU0", "GPU2") == "NV12" and topo["affinity"]["GPU0"] == {"CPU Affinity": "0-7"}
    assert "incomplete" not in topo


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no `nvidia-smi topo -m` matrix"),
        ("Failed to initialize NVML: Driver/library version mismatch", "no `nvidia-smi topo -m` matrix"),
        ("\tGPU0\tGPU1\n\nLegend:\n", "no complete matrix row for GPU0, GPU1"),
        ("\tGPU0\tGPU1\tGPU2\nGPU0\t X\tNV2\nGPU1\tNV2\t X\tNV2\n", "line 2: row GPU0 should have 3 link codes"),
        ("\tGPU0\tGPU1\nGPU0\t X\tNV2\nGPU1\tNV2\t XX\n", "line 3: row GPU1 should have 2 link codes"),
        ("\tGPU0\tGPU1\nGPU0\tNV2\t X\nGPU1\tNV2\t X\n", "row GPU0 should have X in its own column"),
    ],
)
def test_broken_matrices_are_named_errors(text, message):
    with pytest.raises(InputError, match=message) as err:
        parse_topology(text, "saved.txt")
    assert str(err.value).startswith("saved.txt")


CODES = st.sampled_from(["NV1", "NV2", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC"])


@st.composite
def matrices(draw):
    n = draw(st.integers(1, 8))
    nics = draw(st.integers(0, 3))
    names = [f"GPU{i}" for i in range(n)] + [f"NIC{i}" for i in range(nics)]
    codes = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            codes[(a, b)] = codes[(b, a)] = draw(CODES)
    sep = draw(st.sampled_from(["\t", "  ", "\t "]))
    header = sep + sep.join(names) + sep + "CPU Affinity" + sep + "NUMA Affinity"
    rows = []
    for a in names:
        cells = [" X " if a == b else codes[(a, b)] for b in names]
        tail = [f"0-{draw(st.integers(1, 255))}", "0"] if a.startswith("GPU") else []
        rows.append(sep.join([a, *cells, *tail]))
    legend = (
        "\n\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe\n\nNIC Legend:\n\n"
        + "\n".join(f"  NIC{i}: mlx5_{i}" for i in range(nics))
        if draw(st.booleans())
        else ""
    )
    return names, codes, "\n".join([header, *rows]) + legend


@given(matrices())
@settings(max_examples=150, deadline=None)
def test_any_rendered_matrix_parses_back_to_its_links(case):
    names, codes, text = case
    topo = parse_topology(text)
    assert topo["devices"] == names
    for (a, b), code in codes.items():
        assert link(topo, a, b) == code


@given(st.text(max_size=2000))
@settings(max_examples=300, deadline=None)
def test_arbitrary_text_gives_a_topology_or_a_clean_input_error(text):
    try:
        topo = parse_topology(text)
    except InputError:
        return
    assert gpu_names(topo)


@given(matrices(), st.integers(0, 400), st.text(max_size=20))
@settings(max_examples=200, deadline=None)
def test_corrupted_matrices_never_crash(case, at, junk):
    _, _, text = case
    corrupted = text[:at] + junk + text[at:]
    with contextlib.suppress(InputError):
        parse_topology(corrupted)
