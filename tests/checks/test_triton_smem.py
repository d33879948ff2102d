"""triton-shared-memory: the shared memory per block each GPU gives a Triton kernel (from its compute capability),
at most info, and only for a run that compiles Triton kernels; on recorded GPUs."""

import pytest
from conftest import plan_of, recorded_gpus, run_of, severities

from sftdoctor.checks import Skipped
from sftdoctor.run.smem import LIMITS, per_block

PACKAGES = {"liger-kernel": "0.8.5"}


@pytest.mark.parametrize(
    "name, limit",
    [
        ("rtx3090_5x_driver535_fics_cluster.txt", 101376),
        ("quadro_rtx8000_10x_driver470_gengwg.txt", 65536),
        ("v100_pcie_4x_driver470_cuda114_princeton.txt", 98304),
        ("p100_pcie_4x_driver418_princeton_tiger.txt", 49152),
    ],
)
def test_a_gpu_below_a100_is_info_with_its_limit_and_class(run, name, limit):
    gpus = recorded_gpus(name)
    [finding] = run("triton-shared-memory", gpus=gpus)
    assert finding.severity.value == "info" and f"{limit} B of shared memory per block" in finding.title
    assert LIMITS[limit] in finding.title and "OutOfResources" in finding.title


@pytest.mark.parametrize(
    "name",
    [
        "a100_sxm4_1x_driver550_princeton.txt",
        "h100_1x_princeton_pli.txt",
        "b200_8x_driver580_cuda13_modal_glossary.txt",
    ],
)
def test_a100_class_gpus_are_info_without_a_warning(run, name):
    [finding] = run("triton-shared-memory", gpus=recorded_gpus(name))
    assert finding.severity.value == "info" and "what A100/H100-tuned Triton kernels expect" in finding.title


def test_a_run_without_liger_compiles_no_triton_kernels(run):
    gpus = recorded_gpus("rtx3090_5x_driver535_fics_cluster.txt")
    plan = plan_of(run_of(training={"liger_kernel": False}), gpus=gpus, packages=PACKAGES)
    assert isinstance(run("triton-shared-memory", gpus=gpus, plan=plan), Skipped)
    plan = plan_of(run_of(training={"liger_kernel": True}), gpus=gpus, packages=PACKAGES)
    [finding] = run("triton-shared-memory", gpus=gpus, plan=plan)
    assert "liger-kernel's kernels in this run" in finding.title


def test_unknown_capability_says_it_cannot_tell(run):
    findings = run("triton-shared-memory", gpus={"source": "nvml", "devices": [{"index": 0, "name": "Mystery GPU"}]})
    assert severities(findings) == ["info"] and findings[0].title.startswith("cannot tell")


def test_no_gpu_is_not_applicable(run):
    assert isinstance(run("triton-shared-memory", gpus={"source": None, "devices": []}), Skipped)


@pytest.mark.parametrize(
    "cc, limit",
    [
        ((7, 0), 98304),
        ((7, 5), 65536),
        ((8, 0), 166912),
        ((8, 6), 101376),
        ((8, 9), 101376),
        ((9, 0), 232448),
        ((10, 0), 232448),
        ((12, 0), 101376),
        ((6, 1), 49152),
        ((3, 7), None),
    ],
)
def test_per_block_follows_the_cuda_programming_guide(cc, limit):
    assert per_block(cc) == limit
