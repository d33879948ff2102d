"""torch-cuda-match on GPU facts recorded from real machines (public `nvidia-smi` outputs)."""

import pytest
from conftest import NO_GPU, recorded_gpus, severities

V100_CUDA114 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
A100_CUDA120 = "a100_80g_pcie_4x_driver525_princeton.txt"
H100_CUDA124 = "h100_sxm_8x_driver550_modal_glossary.txt"
B200_CUDA130 = "b200_8x_driver580_cuda13_modal_glossary.txt"
PACKAGES = {"deepspeed": "0.19.8", "flash-attn": None}


def torch(version, cuda=None, hip=None):
    return {"version": version, "cuda": cuda, "hip": hip}


CU124 = torch("2.5.1+cu124", "12.4")


@pytest.fixture
def match(run):
    """torch-cuda-match on a machine (a recorded `nvidia-smi` output's name, or GPU facts) with DeepSpeed installed
    unless `packages` says otherwise; the other facts as given."""

    def findings(machine, packages=PACKAGES, **facts):
        gpus = recorded_gpus(machine) if isinstance(machine, str) else machine
        return run("torch-cuda-match", gpus=gpus, packages=packages, **facts)

    return findings


def test_matching_build_is_ok_and_names_the_numbers(match):
    findings = match(H100_CUDA124, torch_build=CU124)
    assert severities(findings) == ["ok"]
    assert "550.90.07" in findings[0].title and "12.4" in findings[0].title


def test_torch_for_a_newer_cuda_major_than_the_driver_is_an_error(match):
    findings = match(V100_CUDA114, torch_build=torch("2.6.0+cu124", "12.4"))
    assert "error" in severities(findings)
    problem = next(f for f in findings if f.severity.value == "error")
    assert "11.4" in problem.title and "driver" in problem.title
    assert "whl/cu118" in problem.fix  # the newest wheel index this driver can run


def test_newer_minor_than_the_driver_runs_but_warns(match):
    findings = match(A100_CUDA120, torch_build=CU124)
    assert severities(findings) == ["warning"]
    assert "minor-version compatibility" in findings[0].detail


def test_cpu_only_torch_on_a_gpu_machine_is_an_error(match):
    findings = match(H100_CUDA124, torch_build=torch("2.13.0+cpu"))
    assert severities(findings) == ["error"]
    assert "CPU-only" in findings[0].title and "whl/cu124" in findings[0].fix


def test_rocm_torch_on_nvidia_is_an_error(match):
    findings = match(H100_CUDA124, torch_build=torch("2.5.1+rocm6.2", hip="6.2.41133"))
    assert severities(findings) == ["error"] and "ROCm" in findings[0].title


def test_no_gpu_is_information_not_an_error(match):
    findings = match(NO_GPU, torch_build=torch("2.13.0+cpu"))
    assert severities(findings) == ["info"]
    assert "no NVIDIA GPU" in findings[0].title


def test_torch_missing_on_a_gpu_box_says_which_build_to_install(match):
    findings = match(A100_CUDA120)
    assert severities(findings) == ["info"] and "whl/cu118" in findings[0].fix  # 12.0 driver: no cu12x wheel fits


def test_blackwell_needs_a_torch_built_with_cuda_12_8(match):
    findings = match(B200_CUDA130, torch_build=CU124)
    assert severities(findings) == ["error"]
    assert "sm_100" in findings[0].title and "no kernel image" in findings[0].detail


def test_cuda_13_builds_drop_volta(match):
    gpus = {**recorded_gpus(V100_CUDA114), "cuda_version": "13.0", "driver_version": "580.95.05"}
    findings = match(gpus, torch_build=torch("2.10.0+cu130", "13.0"))
    assert severities(findings) == ["error"] and "V100" in findings[0].title


def test_nvcc_of_another_major_breaks_deepspeed_builds(match):
    toolkit = {
        "cuda_home": "/usr/local/cuda-11.8",
        "found_by": "CUDA_HOME",
        "nvcc": "/usr/local/cuda-11.8/bin/nvcc",
        "nvcc_version": "11.8",
    }
    findings = match(H100_CUDA124, torch_build=CU124, toolkit=toolkit)
    assert severities(findings) == ["error"]
    assert "mismatches the version that was used to compile PyTorch" in findings[0].detail
    # Without anything to build, the same mismatch is only a warning.
    findings = match(H100_CUDA124, packages={}, torch_build=CU124, toolkit=toolkit)
    assert severities(findings) == ["warning"]


def test_missing_nvcc_with_deepspeed_warns_about_jit_ops(match):
    findings = match(
        H100_CUDA124,
        torch_build=CU124,
        toolkit={"cuda_home": None, "found_by": None, "nvcc": None, "nvcc_version": None},
    )
    assert severities(findings) == ["warning"] and "CUDA_HOME" in findings[0].detail
