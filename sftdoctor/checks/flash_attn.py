"""flash-attn: installed, importable against this torch, and usable on these GPUs."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.gpus import FLASH_MIN_CC, describe_gpus, lacking

REINSTALL = (
    "pip uninstall -y flash-attn && pip install flash-attn --no-build-isolation --no-cache-dir "
    "(builds against the installed torch), or take the release wheel whose name matches this "
    "torch version, CUDA major and cxx11abi"
)


@check(
    "flash-attn",
    "flash-attn installed, built for this torch, and on Ampere or newer GPUs",
    messages={
        "not-installed": "flash_attention_2 is asked for but flash-attn is not installed",
        "sdpa-instead": "flash-attn is not installed: attention uses PyTorch sdpa",
        "import-fails": "flash-attn is installed but does not import",
        "pre-ampere": "flash-attn is installed but GPUs predate Ampere",
        "no-gpu": "flash-attn imports, but no NVIDIA GPU is visible",
    },
)
def flash_attn_check(
    packages: dict[str, Any],
    flash_attn: dict[str, Any],
    gpus: dict[str, Any] | None = None,
    plan=None,
    torch_build: dict[str, Any] | None = None,
):
    devices = (gpus or {}).get("devices") or []
    asked = plan is not None and plan.attn_implementation == "flash_attention_2"
    version = packages.get("flash-attn")
    old = lacking(devices, FLASH_MIN_CC)
    evidence = {"flash_attn": flash_attn, "torch": (torch_build or {}).get("version"), "requested": asked}
    if version is None:
        return _not_installed(asked, devices, old, evidence)
    if flash_attn.get("import_ok") is False:
        cause = flash_attn.get("import_error") or "unknown error"
        why = (
            "the compiled extension was built for another torch version or C++ ABI"
            if "undefined symbol" in cause
            else "it does not import"
        )
        return (error if asked or (devices and not old) else warning)(
            f"flash-attn {version} is installed but {why}",
            detail=f"Importing it with torch {(torch_build or {}).get('version')} fails: {cause}",
            fix=REINSTALL,
            evidence=evidence,
            id="flash-attn/import-fails",
        )
    if old:
        severity = error if asked else warning
        return severity(
            f"flash-attn {version} is installed but {describe_gpus(old)} predate Ampere",
            detail="flash-attn 2 raises 'FlashAttention only supports Ampere GPUs or newer.' on these GPUs.",
            fix='attn_implementation = "sdpa" (sftdoctor\'s "auto" picks it here)',
            evidence=evidence,
            id="flash-attn/pre-ampere",
        )
    if not devices:
        return info(
            f"flash-attn {version} imports, but no NVIDIA GPU is visible", evidence=evidence, id="flash-attn/no-gpu"
        )
    return ok(
        f"flash-attn {version} imports with torch {(torch_build or {}).get('version')} on {describe_gpus(devices)}",
        evidence=evidence,
    )


def _not_installed(asked: bool, devices: list, old: list, evidence: dict[str, Any]):
    """No flash-attn: an error if the run asks for it, a hint where the GPUs could use it, else not applicable."""
    if asked:
        return error(
            'attn_implementation = "flash_attention_2" but flash-attn is not installed',
            detail="transformers 5.x raises at load: 'FlashAttention2 has been toggled on, but it cannot be "
            "used due to the following error: the package for FlashAttention2 doesn't seem to be "
            "installed.' (with the `kernels` package installed it tries to download a hub kernel "
            "instead, which fails offline).",
            fix='pip install flash-attn --no-build-isolation, or attn_implementation = "auto" (sdpa)',
            evidence=evidence,
            id="flash-attn/not-installed",
        )
    if devices and not old:
        return info(
            "flash-attn is not installed: attention will use PyTorch sdpa",
            detail="sdpa is fine; flash-attn 2 is faster on long sequences and makes padding-free packing cheap.",
            fix="pip install flash-attn --no-build-isolation  (needs nvcc matching torch's CUDA, or a "
            "release wheel built for this torch and C++ ABI)",
            evidence=evidence,
            id="flash-attn/sdpa-instead",
        )
    raise NotApplicable("flash-attn is not installed" + (" and the GPUs predate Ampere" if old else ""))
