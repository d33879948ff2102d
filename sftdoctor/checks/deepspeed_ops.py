"""deepspeed-ops: the ops a DeepSpeed JSON makes DeepSpeed JIT-compile at the first step, against the CUDA toolkit
and the ops built at install time."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, info, ok

# DeepSpeed 0.19.8 runtime/engine.py `_configure_basic_optimizer` / `get_optimizer_configuration`: with the CUDA
# accelerator, the fused ops build with nvcc; the CPU ones (ZeRO-Offload) with g++ only (op_builder/cpu/).
NVCC, GXX = "nvcc", "g++"


def jit_ops(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """(op, compiler) for each op the JSON's "optimizer" block makes DeepSpeed build. No block: the Trainer
    creates torch's AdamW and nothing is built."""
    block = cfg.get("optimizer")
    if not isinstance(block, dict):
        return []
    kind = str(block.get("type", "")).lower()
    params = block.get("params") if isinstance(block.get("params"), dict) else {}
    offload = ((cfg.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
    if kind in ("adam", "adamw"):
        if params.get("torch_adam"):
            return []
        return [("cpu_adam", GXX)] if offload else [("fused_adam", NVCC)]
    if kind == "lamb":
        return [("fused_lamb", NVCC)]
    if kind == "lion":
        return [("cpu_lion", GXX)] if offload else [("fused_lion", NVCC)]
    if kind == "adagrad" and offload:
        return [("cpu_adagrad", GXX)]
    return []


@check(
    "deepspeed-ops",
    "the ops the DeepSpeed JSON makes DeepSpeed compile at run time (FusedAdam, ...) against "
    "the CUDA toolkit and the ops prebuilt at install",
    messages={
        "toolkit-unknown": "DeepSpeed will JIT-compile ops; whether a CUDA toolkit is here is unknown",
        "no-toolkit": "DeepSpeed must JIT-compile ops and there is no CUDA toolkit",
    },
)
def deepspeed_ops(
    deepspeed_config: dict[str, Any],
    toolkit: dict[str, Any] | None = None,
    deepspeed_defaults: dict[str, Any] | None = None,
    gpus: dict[str, Any] | None = None,
):
    if gpus is not None and not gpus.get("devices"):
        raise NotApplicable("no NVIDIA GPU visible: DeepSpeed builds its CPU accelerator's ops with g++")
    path, ops = deepspeed_config["path"], jit_ops(deepspeed_config["config"])
    prebuilt = (deepspeed_defaults or {}).get("installed_ops") or {}
    evidence = {
        "path": path,
        "ops": [op for op, _ in ops],
        "installed_ops": prebuilt,
        "nvcc": (toolkit or {}).get("nvcc_version"),
        "cuda_home": (toolkit or {}).get("cuda_home"),
    }
    if not ops:
        return ok(f"{path}: DeepSpeed builds no CUDA op at run time (no fused optimizer)", evidence=evidence)
    to_build = [op for op, compiler in ops if compiler == NVCC and not prebuilt.get(op)]
    if not to_build:
        built = ", ".join(f"{op} ({'prebuilt' if prebuilt.get(op) else c})" for op, c in ops)
        return ok(f"{path}: {built}", evidence=evidence)
    names = ", ".join(to_build)
    if toolkit is None:
        return info(
            f"{path}: DeepSpeed will JIT-compile {names} with nvcc; whether a CUDA toolkit is here is unknown",
            fix="run `nvcc --version`; record facts on the training machine",
            evidence=evidence,
            id="deepspeed-ops/toolkit-unknown",
        )
    if toolkit.get("nvcc_version") is None:
        return error(
            f"{path}: DeepSpeed must JIT-compile {names} with nvcc at the first step, and there is no CUDA toolkit "
            f"(CUDA_HOME={toolkit.get('cuda_home')}, no nvcc)",
            detail="The run dies after the model has loaded with 'MissingCUDAException: CUDA_HOME does not exist, "
            "unable to compile CUDA op(s)'. The op is not prebuilt: ds_report shows it [NO] under installed.",
            fix='drop the "optimizer" block from the DeepSpeed JSON (the Trainer then uses torch\'s AdamW), or set '
            '"torch_adam": true in its params; or install the CUDA toolkit matching torch and export CUDA_HOME; '
            "or reinstall with DS_BUILD_FUSED_ADAM=1 pip install deepspeed on a machine with nvcc",
            evidence=evidence,
            id="deepspeed-ops/no-toolkit",
        )
    return ok(
        f"{path}: DeepSpeed will JIT-compile {names} with nvcc {toolkit['nvcc_version']} on the first run",
        evidence=evidence,
    )
