"""What this machine offers the suite, as one JSON line: torch and its CUDA, the GPUs as torch, NVML and
`nvidia-smi` each see them (sftdoctor's own two probes, compared on real hardware), flash-attn and liger-kernel.

    python bench/gpu/children/env_probe.py
"""

import importlib.metadata
import importlib.util
import json


def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_view():
    import torch

    out = {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "available": torch.cuda.is_available(),
        "devices": [],
    }
    if not out["available"]:
        try:
            torch.cuda.init()
        except Exception as exc:  # the reason torch gives (driver too old, no device, CPU build)
            out["why"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return out
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None
    try:
        out["bf16"] = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch before 2.3 has no including_emulation
        out["bf16"] = torch.cuda.is_bf16_supported()
    for index in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(index)
        out["devices"].append(
            {
                "index": index,
                "name": p.name,
                "compute_capability": f"{p.major}.{p.minor}",
                "memory_total_mib": p.total_memory // 2**20,
            }
        )
    return out


def sftdoctor_view(which):
    from sftdoctor.facts import gpus

    try:
        found = gpus._from_nvml() if which == "nvml" else gpus._from_nvidia_smi()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return found if found is not None else {"error": "nvidia-smi not found or failed"}


def importable(module):
    """Imports it (flash-attn's ABI mismatch with torch only shows at import)."""
    if importlib.util.find_spec(module) is None:
        return {"installed": False}
    try:
        importlib.import_module(module)
        return {"installed": True, "imports": True}
    except Exception as exc:
        return {"installed": True, "imports": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


def main():
    out = {
        "torch": torch_view(),
        "nvml": sftdoctor_view("nvml"),
        "nvidia_smi": sftdoctor_view("nvidia-smi"),
        "flash_attn": {**importable("flash_attn"), "version": version("flash-attn")},
        "flash_attn_3": importable("flash_attn_interface"),
        "liger_kernel": {"installed": version("liger-kernel") is not None, "version": version("liger-kernel")},
        "versions": {n: version(n) for n in ("transformers", "trl", "accelerate", "datasets", "deepspeed")},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
