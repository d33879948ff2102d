"""GPU facts from real `nvidia-smi` outputs recorded in public reports, and fuzzed."""

import pytest
from conftest import fixture_text, index
from hypothesis import given, settings
from hypothesis import strategies as st

from sftdoctor.facts.gpus import (
    compute_capability_from_name,
    cuda_version_from_int,
    parse_nvidia_smi,
    parse_nvlink_status,
    parse_query_csv,
    probe_gpus,
)

TABLES = [e for e in index("nvidia_smi") if e["driver_version"]]


@pytest.mark.parametrize("entry", TABLES, ids=[e["file"] for e in TABLES])
def test_real_nvidia_smi_outputs_give_driver_cuda_and_gpus(entry):
    facts = parse_nvidia_smi(fixture_text("nvidia_smi", entry["file"]))
    assert facts["driver_version"] == entry["driver_version"]
    assert facts["cuda_version"] == entry["cuda_version"]
    got = [(d["index"], d["name"], d["memory_total_mib"]) for d in facts["devices"]]
    assert got == [(g["index"], g["name"], g["memory_total_mib"]) for g in entry["gpus"]]
    assert all(d["compute_capability"] for d in facts["devices"])  # every recorded GPU model is known


@pytest.mark.parametrize(
    "name, cc",
    [
        ("Tesla V100-SXM2-32GB", "7.0"),
        ("Tesla V100-SXM2...", "7.0"),
        ("Tesla T4", "7.5"),
        ("NVIDIA A100-SXM4-80GB", "8.0"),
        ("NVIDIA A10G", "8.6"),
        ("NVIDIA GeForce RTX 3090", "8.6"),
        ("NVIDIA RTX A6000", "8.6"),
        ("NVIDIA RTX 6000 Ada Generation", "8.9"),
        ("NVIDIA L40S", "8.9"),
        ("NVIDIA H100 80GB HBM3", "9.0"),
        ("NVIDIA H200", "9.0"),
        ("NVIDIA B200", "10.0"),
        ("NVIDIA GeForce RTX 5090", "12.0"),
        ("Tesla P100-PCIE-16GB", "6.0"),
        ("Quadro RTX 8000", "7.5"),
        ("Some Future GPU", None),
    ],
)
def test_compute_capability_by_name(name, cc):
    assert compute_capability_from_name(name) == cc


def test_nvlink_status_counts_active_links_per_gpu():
    links = parse_nvlink_status(fixture_text("nvidia_smi", "h800_8x_llm_action_nvlink.txt"))
    assert links == {0: 8, 1: 8, 7: 8}
    assert parse_nvlink_status("GPU 0: X (UUID: a)\n\t Link 0: <inactive>\n\t Link 1: 25 GB/s\n") == {0: 1}


def test_query_csv_rows():
    csv = (
        "0, NVIDIA H100 80GB HBM3, GPU-1, 00000000:18:00.0, 81559, 9.0, 550.54.15\n"
        "1, Tesla V100-SXM2-16GB, GPU-2, 00000000:19:00.0, 16160, [N/A], 450.80.02\n"
    )
    devices = parse_query_csv(csv)
    assert [(d["name"], d["compute_capability"], d["memory_total_mib"]) for d in devices] == [
        ("NVIDIA H100 80GB HBM3", "9.0", 81559),
        ("Tesla V100-SXM2-16GB", "7.0", 16160),
    ]


def test_cuda_versions_decode_like_nvml():
    assert cuda_version_from_int(12040) == "12.4"
    assert cuda_version_from_int(11080) == "11.8"
    assert cuda_version_from_int(13000) == "13.0"


def test_probing_a_machine_without_gpus_is_a_fact_not_a_crash():
    facts = probe_gpus(None)
    assert facts["devices"] == [] and "driver" in facts["error"]


@given(st.text(max_size=3000))
@settings(max_examples=300, deadline=None)
def test_parsers_never_crash_on_arbitrary_text(text):
    parse_nvidia_smi(text)
    parse_nvlink_status(text)
    parse_query_csv(text)
