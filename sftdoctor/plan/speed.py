"""How long a run takes: model FLOPs per token, the GPUs' peak, and an assumed utilisation (MFU).

FLOPs per token follow the model-FLOPs convention of PaLM (Chowdhery et al., 2022, appendix B):
6 x parameters for the forward and backward matmuls, plus 12 x layers x hidden x sequence length
for attention. Activation checkpointing recomputes the forward (a third of the work again,
Korthikanti et al., 2022), which the MFU convention does not count, so it lengthens the run.
"""

from __future__ import annotations

import re

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOPS per GPU; fp16 for the
# GPUs without bf16. Matched on the name NVML reports, most specific first.
PEAK_TFLOPS = [
    ("H100 PCIe", 756),
    ("H100 NVL", 835),
    ("H100", 989),
    ("H200", 989),
    ("H800", 989),
    ("H20", 148),
    ("B200", 2250),
    ("A100", 312),
    ("A800", 312),
    ("L40S", 362),
    ("L40", 181),
    ("L4", 121),
    ("A10", 125),
    ("RTX A6000", 155),
    ("RTX 4090", 165),
    ("RTX 3090", 71),
    ("V100", 125),
    ("T4", 65),
]
DEFAULT_MFU = 0.4  # a well-tuned dense SFT run on A100/H100 reaches 0.35-0.5


def peak_tflops(gpu_name: str | None) -> float | None:
    """The first key found in the name as a whole word: "A100" is not the "RTX A1000", "T4" not the "T400"."""
    for key, tflops in PEAK_TFLOPS:
        if gpu_name and re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", gpu_name):
            return float(tflops)
    return None


def flops_per_token(parameters: int, layers: int, hidden: int, seq_len: int) -> float:
    return 6 * parameters + 12 * layers * hidden * seq_len


def step_seconds(
    tokens_per_step: int, flops: float, world: int, tflops: float, mfu: float, checkpointing: bool
) -> float:
    recompute = 4 / 3 if checkpointing else 1.0
    return tokens_per_step * flops * recompute / (world * tflops * 1e12 * mfu)
