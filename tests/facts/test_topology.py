"""The `nvidia-smi topo -m` parser against real outputs from public reports, and fuzzed."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fixture_text, index, recorded_topology
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


@pytest.mark.parametrize("text, message", [
    ("", "no `nvidia-smi topo -m` matrix"),
    ("Failed to initialize NVML: Driver/library version mismatch", "no `nvidia-smi topo -m` matrix"),
    ("\tGPU0\tGPU1\nGPU0\t X\tNV2\n", "no matrix row for GPU1"),
    ("\tGPU0\tGPU1\nGPU0\t X\tNV2\nGPU1\tNV2\n", "row GPU1 should have 2 link codes"),
    ("\tGPU0\tGPU1\nGPU0\tNV2\t X\nGPU1\tNV2\t X\n", "row GPU0 should have X in its own column"),
])
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
        for b in names[i + 1:]:
            codes[(a, b)] = codes[(b, a)] = draw(CODES)
    sep = draw(st.sampled_from(["\t", "  ", "\t "]))
    header = sep + sep.join(names) + sep + "CPU Affinity" + sep + "NUMA Affinity"
    rows = []
    for a in names:
        cells = [" X " if a == b else codes[(a, b)] for b in names]
        tail = [f"0-{draw(st.integers(1, 255))}", "0"] if a.startswith("GPU") else []
        rows.append(sep.join([a, *cells, *tail]))
    legend = "\n\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe\n\nNIC Legend:\n\n" + "\n".join(
        f"  NIC{i}: mlx5_{i}" for i in range(nics)) if draw(st.booleans()) else ""
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
    try:
        parse_topology(corrupted)
    except InputError:
        pass
