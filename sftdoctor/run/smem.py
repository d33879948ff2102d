"""Shared memory per thread block, by compute capability: what a Triton kernel may use on a GPU.

Triton compares a kernel's need with the device's `cudaDevAttrMaxSharedMemoryPerBlockOptin` (triton/compiler/
compiler.py `max_shared`) and raises `OutOfResources: out of resource: shared memory, Required: N, Hardware limit: M`.
The values are the CUDA C++ Programming Guide's ("Technical Specifications per Compute Capability": per SM 7.0 96 KB,
7.5 64 KB, 8.0/8.7 164 KB, 8.6/8.9/12.0 100 KB, 9.0/10.x 228 KB; from 8.0 on a block may opt in to 1 KB less), and
match the limits real logs print (101376 on RTX 3090/4090, A10, A6000; 65536 on T4; 49152 on P40).
"""

from __future__ import annotations

# Hardware limit (bytes) -> what it tells of the GPU.
LIMITS = {
    49152: "compute capability 5.x/6.x (48 KB: P100, P40, GTX 10xx, K80, M60)",
    65536: "compute capability 7.5 (64 KB: T4, RTX 20xx, Quadro RTX) or an AMD Instinct GPU (64 KB LDS)",
    98304: "compute capability 7.0 (96 KB: V100)",
    101376: "compute capability 8.6/8.9/12.0 (99 KB: RTX 30xx/40xx/50xx, A10, A40, A6000, L4, L40S)",
    166912: "compute capability 8.0/8.7 (163 KB: A100, A800, A30, Jetson Orin)",
    232448: "compute capability 9.0/10.x (227 KB: H100, H200, H800, B200)",
}

TRITON_MIN_CC = (
    7,
    0,
)  # torch/_inductor/exc.py GPUTooOldForTriton: "Triton only supports devices of CUDA Capability >= 7.0"
TUNED_ON = 166912  # an A100's limit: kernels tuned on A100/H100 may need up to this, or H100's 232448


def per_block(cc: tuple[int, int]) -> int | None:
    """The opt-in shared memory per block of compute capability `cc`, in bytes; None where not known."""
    major, minor = cc
    if major in (5, 6):
        return 49152
    if cc == (7, 0) or cc == (7, 2):
        return 98304
    if cc == (7, 5):
        return 65536
    if cc in ((8, 0), (8, 7)):
        return 166912
    if cc in ((8, 6), (8, 9), (12, 0), (12, 1)):
        return 101376
    if major in (9, 10):
        return 232448
    return None


def gpu_class(limit: int | None) -> str | None:
    return LIMITS.get(limit) if limit is not None else None
