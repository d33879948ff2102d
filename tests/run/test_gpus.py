"""sftdoctor.run.gpus: versions, compute capability, bf16 and memory read from recorded nvidia-smi outputs."""

import pytest
from conftest import recorded_gpus

from sftdoctor.run.gpus import (
    BF16_MIN_CC,
    bf16_capable,
    capability,
    describe_gpus,
    devices,
    lacking,
    smallest_memory,
    version_tuple,
)

A100 = "a100_80g_pcie_4x_driver525_princeton.txt"
V100 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
H100 = "h100_1x_princeton_pli.txt"
P100 = "p100_pcie_4x_driver418_princeton_tiger.txt"


def mixed() -> dict:
    """One box with two A100s and two V100s (a V100 node with A100s added)."""
    return {"devices": devices(recorded_gpus(A100))[:2] + devices(recorded_gpus(V100))[:2]}


@pytest.mark.parametrize(
    "version, expected",
    [
        ("12.4", (12, 4)),
        ("2.5.1+cu124", (2, 5, 1)),
        ("525.105.17", (525, 105, 17)),
        ("8", (8,)),
        ("junk", None),
        ("", None),
        (None, None),
        ("v12.4", None),
    ],
)
def test_version_tuple(version, expected):
    assert version_tuple(version) == expected


def test_version_tuple_orders_versions_as_numbers():
    assert version_tuple("12.10") > version_tuple("12.4")


@pytest.mark.parametrize(
    "cc, expected", [("8.0", (8, 0)), ("9.0", (9, 0)), ("8", (8, 0)), ("10.0", (10, 0)), (None, None), ("?", None)]
)
def test_capability(cc, expected):
    assert capability({"compute_capability": cc}) == expected


def test_capability_of_recorded_devices():
    assert capability(devices(recorded_gpus(V100))[0]) == (7, 0)
    assert capability(devices(recorded_gpus(H100))[0]) == (9, 0)
    assert capability({}) is None


def test_lacking_lists_the_devices_below_the_minimum():
    assert len(lacking(devices(recorded_gpus(V100)), BF16_MIN_CC)) == 4
    assert lacking(devices(recorded_gpus(A100)), BF16_MIN_CC) == []
    assert [d["name"] for d in lacking(devices(mixed()), BF16_MIN_CC)] == ["Tesla V100-PCIE..."] * 2


def test_lacking_leaves_out_devices_of_unknown_capability():
    assert lacking([{"name": "GPU"}, {"compute_capability": "7.5"}], BF16_MIN_CC) == [{"compute_capability": "7.5"}]


@pytest.mark.parametrize(
    "gpus, capable",
    [
        (lambda: recorded_gpus(A100), True),
        (lambda: recorded_gpus(H100), True),
        (lambda: recorded_gpus(V100), False),
        (lambda: recorded_gpus(P100), False),
        (mixed, False),
        (lambda: {"devices": [{"name": "NVIDIA A100", "compute_capability": None}]}, None),
        (lambda: {"devices": devices(recorded_gpus(A100)) + [{"name": "?"}]}, None),
        (lambda: {"devices": []}, None),
        (lambda: None, None),
    ],
)
def test_bf16_capable(gpus, capable):
    assert bf16_capable(gpus()) is capable


def test_describe_gpus_counts_each_model():
    assert describe_gpus(devices(recorded_gpus(V100))) == "4x Tesla V100-PCIE... (compute capability 7.0)"
    assert describe_gpus(devices(mixed())) == (
        "2x NVIDIA A100 80G... (compute capability 8.0), 2x Tesla V100-PCIE... (compute capability 7.0)"
    )


def test_describe_gpus_names_unknown_devices():
    assert describe_gpus([{}]) == "1x unknown GPU (compute capability ?)"
    assert describe_gpus([]) == ""


def test_smallest_memory_in_bytes():
    assert smallest_memory(recorded_gpus(A100)) == 81920 * 2**20
    assert smallest_memory(recorded_gpus(H100)) == 81559 * 2**20
    assert smallest_memory(mixed()) == 32510 * 2**20


@pytest.mark.parametrize("gpus", [None, {"devices": []}, {"devices": [{"memory_total_mib": None}]}])
def test_smallest_memory_is_0_without_a_known_size(gpus):
    assert smallest_memory(gpus) == 0
