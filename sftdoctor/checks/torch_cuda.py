"""torch-cuda-match: torch's CUDA build against the driver, the GPUs and the nvcc toolkit."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.gpus import capability, describe_gpus, version_tuple

# PyTorch wheel indexes (download.pytorch.org/whl/<tag>) seen for torch 2.x.
WHEEL_TAGS = ("cu118", "cu121", "cu124", "cu126", "cu128", "cu129", "cu130")

# Oldest CUDA toolkit that can build kernels for an architecture: a torch built with an
# older CUDA has "no kernel image" for it (sm_90 came with CUDA 11.8, sm_100/sm_120 with 12.8).
MIN_CUDA_FOR_CC = {(9, 0): (11, 8), (8, 9): (11, 8), (10, 0): (12, 8), (12, 0): (12, 8), (10, 3): (12, 9)}
# CUDA 13.0 dropped Maxwell, Pascal and Volta (compute capability below 7.5).
MAX_CUDA_FOR_OLD_CC = ((7, 5), (13, 0))


def wheel_tag_for(driver_cuda: str | None) -> str:
    """The newest PyTorch CUDA wheel tag the driver can run, e.g. "cu124" for a 12.4 driver."""
    limit = version_tuple(driver_cuda)
    fitting = [t for t in WHEEL_TAGS if limit and (int(t[2:-1]), int(t[-1])) <= limit[:2]]
    return fitting[-1] if fitting else "cu118"


def _install_hint(driver_cuda: str | None) -> str:
    tag = wheel_tag_for(driver_cuda)
    return f"pip install torch --index-url https://download.pytorch.org/whl/{tag}"


@check(
    "torch-cuda-match",
    "torch's CUDA build vs the driver's CUDA, the GPUs' architecture and nvcc",
    messages={
        "no-torch": "torch is not installed",
        "no-gpu": "no NVIDIA GPU is visible: torch runs on the CPU",
        "rocm-build": "a ROCm build of torch on NVIDIA GPUs",
        "cpu-only-build": "a CPU-only build of torch on NVIDIA GPUs",
        "driver-cuda-unknown": "the driver's CUDA version is unknown",
        "driver-too-old": "torch's CUDA major version is newer than the driver supports",
        "driver-older-minor": "torch's CUDA minor version is newer than the driver's",
        "no-arch-kernels": "torch's CUDA build has no kernels for a GPU's architecture",
        "arch-dropped": "torch's CUDA 13 build dropped a GPU's architecture",
        "no-nvcc": "no nvcc, but DeepSpeed compiles its CUDA ops",
        "nvcc-mismatch": "nvcc's CUDA major version differs from torch's",
    },
)
def torch_cuda_match(
    gpus: dict[str, Any],
    packages: dict[str, Any],
    torch_build: dict[str, Any] | None = None,
    toolkit: dict[str, Any] | None = None,
):
    devices = gpus.get("devices") or []
    driver_cuda = gpus.get("cuda_version")
    evidence = {
        "torch": torch_build,
        "driver_version": gpus.get("driver_version"),
        "driver_cuda": driver_cuda,
        "nvcc": (toolkit or {}).get("nvcc_version"),
    }
    if torch_build is None:
        return _no_torch(devices, driver_cuda, evidence)
    version, cuda = torch_build.get("version"), torch_build.get("cuda")
    unusable = _no_cuda(gpus, torch_build, evidence)
    if unusable:
        return unusable
    driver = _driver_support(gpus, version, cuda, evidence)
    findings = [driver] if driver is not None else []
    findings += _architecture_support(devices, version, cuda, driver_cuda, evidence)
    findings += _toolkit(toolkit, packages, version, cuda, evidence)
    if not any(f.severity.rank >= 2 for f in findings):
        findings.insert(
            0,
            ok(
                f"torch {version} (CUDA {cuda}) on driver {gpus.get('driver_version')} (CUDA ≤ {driver_cuda})",
                detail=describe_gpus(devices),
                evidence=evidence,
            ),
        )
    return findings


def _no_torch(devices, driver_cuda: str | None, evidence):
    if devices:
        return info(
            f"torch is not installed; the driver supports CUDA up to {driver_cuda}",
            fix=_install_hint(driver_cuda),
            evidence=evidence,
            id="torch-cuda-match/no-torch",
        )
    return info(
        "torch is not installed and no NVIDIA GPU is visible", evidence=evidence, id="torch-cuda-match/no-torch"
    )


def _no_cuda(gpus: dict[str, Any], torch_build: dict[str, Any], evidence):
    """Torch cannot use a GPU at all: none is visible, or torch is a ROCm or CPU-only build on NVIDIA GPUs."""
    devices, driver_cuda = gpus.get("devices") or [], gpus.get("cuda_version")
    version, cuda, hip = torch_build.get("version"), torch_build.get("cuda"), torch_build.get("hip")
    if not devices:
        why = gpus.get("error") or "no GPU found"
        return info(
            f"no NVIDIA GPU visible; torch {version} will run on the CPU",
            detail=f"Probe said: {why}. On a GPU machine this means the driver is missing or not "
            "loaded (check `nvidia-smi`), or the GPUs are hidden from this container.",
            evidence=evidence,
            id="torch-cuda-match/no-gpu",
        )
    if hip:
        return error(
            f"torch {version} is a ROCm (HIP {hip}) build, but this machine has NVIDIA GPUs",
            detail=describe_gpus(devices),
            fix=_install_hint(driver_cuda),
            evidence=evidence,
            id="torch-cuda-match/rocm-build",
            explain="torch-cuda-match#cpu-only-build",
        )
    if not cuda:
        return error(
            f"torch {version} is a CPU-only build on a machine with {len(devices)} NVIDIA GPU(s)",
            detail=f"{describe_gpus(devices)}; torch.cuda.is_available() will be False and training runs on the CPU.",
            fix=f"pip uninstall -y torch && {_install_hint(driver_cuda)}",
            evidence=evidence,
            id="torch-cuda-match/cpu-only-build",
            explain="torch-cuda-match#cpu-only-build",
        )
    return None


def _driver_support(gpus: dict[str, Any], version, cuda: str, evidence):
    """Torch's CUDA against the newest the driver supports: unknown, a newer major (fails) or minor (mostly runs)."""
    driver_cuda = gpus.get("cuda_version")
    t, d = version_tuple(cuda), version_tuple(driver_cuda)
    if d is None:
        return warning(
            f"torch {version} is built for CUDA {cuda}; the driver's CUDA version is unknown",
            fix="run `nvidia-smi` and read 'CUDA Version' in its header",
            evidence=evidence,
            id="torch-cuda-match/driver-cuda-unknown",
        )
    if t[0] > d[0]:
        return error(
            f"torch {version} needs CUDA {cuda} but driver {gpus.get('driver_version')} "
            f"supports only CUDA {driver_cuda}",
            detail="CUDA runtimes of a newer major version do not run on an older driver: "
            "torch.cuda.is_available() "
            "is False with 'The NVIDIA driver on your system is too old'.",
            fix=f"upgrade the NVIDIA driver to one for CUDA {t[0]}.x, or {_install_hint(driver_cuda)}",
            evidence=evidence,
            id="torch-cuda-match/driver-too-old",
            explain="torch-cuda-match#driver-too-old",
        )
    if t[:2] > d[:2]:
        return warning(
            f"torch {version} (CUDA {cuda}) is newer than the driver's CUDA {driver_cuda}",
            detail="It runs through CUDA minor-version compatibility, but code JIT-compiled for the newer toolkit "
            "(Triton kernels of torch.compile and liger-kernel, PTX) can fail with 'the provided PTX was "
            "compiled with an unsupported toolchain'.",
            fix=f"upgrade the driver to one that supports CUDA {cuda}, or {_install_hint(driver_cuda)}",
            evidence=evidence,
            id="torch-cuda-match/driver-older-minor",
            explain="torch-cuda-match#driver-too-old",
        )
    return None


def _architecture_support(devices, version, cuda, driver_cuda, evidence):
    built = version_tuple(cuda)[:2]
    out = []
    for cc, needed in MIN_CUDA_FOR_CC.items():
        names = sorted({d["name"] for d in devices if capability(d) == cc})
        if names and built < needed:
            out.append(
                error(
                    f"torch {version} (CUDA {cuda}) has no kernels for {', '.join(names)} (sm_{cc[0]}{cc[1]})",
                    detail=f"Compute capability {cc[0]}.{cc[1]} "
                    f"needs a torch built with CUDA ≥ {needed[0]}.{needed[1]}; "
                    "this one fails with 'no kernel image is available for execution on the device'.",
                    fix=_install_hint(driver_cuda),
                    evidence=evidence,
                    id="torch-cuda-match/no-arch-kernels",
                    explain="torch-cuda-match#no-arch-kernels",
                )
            )
    below, newest = MAX_CUDA_FOR_OLD_CC
    old = sorted({d["name"] for d in devices if (c := capability(d)) and c < below})
    if old and built >= newest:
        out.append(
            error(
                f"torch {version} (CUDA {cuda}) cannot run on {', '.join(old)}",
                detail="CUDA 13 dropped GPUs below compute capability 7.5 (Maxwell, Pascal, Volta).",
                fix="pip install torch --index-url https://download.pytorch.org/whl/cu126",
                evidence=evidence,
                id="torch-cuda-match/arch-dropped",
                explain="torch-cuda-match#no-arch-kernels",
            )
        )
    return out


def _toolkit(toolkit, packages, version, cuda, evidence):
    """nvcc builds DeepSpeed's JIT ops and flash-attn from source; torch.utils.cpp_extension
    refuses a toolkit whose major version differs from torch's CUDA (torch 2.x)."""
    if toolkit is None:
        return []
    builds = [name for name in ("deepspeed", "flash-attn") if packages.get(name)]
    nvcc = toolkit.get("nvcc_version")
    if nvcc is None:
        if "deepspeed" in builds:
            return [
                warning(
                    "no nvcc found, but DeepSpeed compiles its CUDA ops "
                    '(FusedAdam, the default for an "AdamW" optimizer '
                    "block) on first use",
                    detail=f"CUDA_HOME={toolkit.get('cuda_home')}; a run that needs such an op fails "
                    "with 'MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s)', "
                    "unless the ops were prebuilt (DS_BUILD_OPS=1 at install). CPUAdam (ZeRO-Offload) builds "
                    "with g++ alone (DeepSpeed 0.19).",
                    fix=f"install the CUDA {cuda} toolkit and export CUDA_HOME=/usr/local/cuda-{cuda}",
                    evidence=evidence,
                    id="torch-cuda-match/no-nvcc",
                    explain="torch-cuda-match#no-nvcc",
                )
            ]
        return []
    if version_tuple(nvcc)[0] != version_tuple(cuda)[0]:
        severity = error if builds else warning
        return [
            severity(
                f"nvcc is CUDA {nvcc} but torch {version} was built with CUDA {cuda}",
                detail="Building CUDA extensions fails: "
                "'The detected CUDA version ({}) mismatches the version that was "
                "used to compile PyTorch ({})'{}.".format(
                    nvcc, cuda, f" — this affects {', '.join(builds)}" if builds else ""
                ),
                fix=f"point CUDA_HOME at a CUDA {version_tuple(cuda)[0]}.x toolkit "
                f"(found by {toolkit.get('found_by')}: "
                f"{toolkit.get('cuda_home')}), e.g. export CUDA_HOME=/usr/local/cuda-{cuda}",
                evidence=evidence,
                id="torch-cuda-match/nvcc-mismatch",
                explain="torch-cuda-match#nvcc-mismatch",
            )
        ]
    return []
