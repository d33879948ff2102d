"""`sftdoctor plan`: will the run fit, which setting is the fastest that does, and how long it takes.

shape.py reads the model (exact parameter count on the meta device), memory.py predicts one rank's
peak memory term by term, speed.py the time per step; this module puts candidates side by side.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from sftdoctor.plan.memory import Estimate, Run, Setting, estimate
from sftdoctor.plan.shape import Shape

HEADROOM = 0.10  # a recommended setting leaves this share of GPU memory free
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Candidate:
    estimate: Estimate
    accumulation: int
    fits: bool
    compute: float  # relative compute per step: 4/3 with recomputation
    communication: float  # relative to DDP's all-reduce: 1.5 for ZeRO-3's extra all-gather

    @property
    def setting(self) -> Setting:
        return self.estimate.setting

    def speed_key(self) -> tuple:
        """Fastest first: no CPU optimizer step, no recomputation, less communication, bigger micro-batches
        (bigger matmuls, fewer accumulation steps), liger's fused kernels."""
        s = self.setting
        return (s.offload_optimizer, self.compute, self.communication, -s.micro_batch, not s.liger)

    def describe(self) -> str:
        s = self.setting
        return (f"ZeRO-{s.zero_stage}{' + optimizer offload' if s.offload_optimizer else ''}, checkpointing "
                f"{'on' if s.checkpointing else 'off'}, micro-batch {s.micro_batch} x {self.accumulation} accumulation, "
                f"liger {'on' if s.liger else 'off'}")

    def to_json(self) -> dict[str, Any]:
        e = self.estimate
        return {"setting": vars(self.setting), "gradient_accumulation_steps": self.accumulation,
                "gpu_peak_bytes": e.gpu_peak, "host_peak_bytes": e.host_peak, "fits": self.fits,
                "relative_compute": self.compute, "relative_communication": self.communication,
                "gpu_terms": [t.to_json() for t in e.gpu], "host_terms": [t.to_json() for t in e.host]}


def candidates(run: Run, global_batch: int, gpu_memory: int, liger_available: bool) -> list[Candidate]:
    """Every ZeRO stage (and optimizer offload for 2 and 3) x checkpointing x micro-batch x liger that
    reaches `global_batch` exactly, fastest first."""
    per_rank = global_batch // run.world if global_batch % run.world == 0 else 0
    micro = [m for m in MICRO_BATCHES if per_rank and per_rank % m == 0] or [1]
    stages = [(0, False), (1, False), (2, False), (2, True), (3, False), (3, True)]
    ligers = (True, False) if liger_available else (False,)
    out: list[Candidate] = []
    for (stage, offload), ckpt, m, liger in itertools.product(stages, (False, True), micro, ligers):
        out.append(_candidate(run, Setting(stage, offload, ckpt, m, liger), global_batch, gpu_memory))
    return sorted(out, key=Candidate.speed_key)


def recommend(found: list[Candidate]) -> Candidate | None:
    return next((c for c in found if c.fits), None)


@dataclass
class Planned:
    run: Run
    current: Candidate
    candidates: list[Candidate]
    recommended: Candidate | None
    gpu_memory: int
    global_batch: int


def plan_run(run_config: dict[str, Any], shape: Shape, gpus: dict[str, Any] | None, packages: dict[str, Any],
             deepspeed_config: dict[str, Any] | None = None, gpu_memory: int | None = None,
             world: tuple[int, int] | None = None) -> Planned:
    """The run's own setting and the candidates, for the GPUs found (or `gpu_memory` bytes each)."""
    from sftdoctor.train import resolve

    nproc, nnodes = world or resolve.world(run_config, gpus)
    devices = (gpus or {}).get("devices") or []
    if gpu_memory is None:
        gpu_memory = min(d.get("memory_total_mib") or 0 for d in devices) * 2**20 if devices else 0
    training = run_config["training"]
    run = Run(shape, nproc * nnodes, nproc, run_config["data"]["max_length"],
              resolve.attn_implementation(run_config, gpus, packages), _precision(run_config, gpus))
    global_batch = training.get("global_batch_size") or training["per_device_batch_size"] * run.world
    ds = (deepspeed_config or {}).get("config") or resolve.deepspeed_config(run_config) or {}
    zero = ds.get("zero_optimization") or {}
    liger_available = bool(packages.get("liger-kernel"))  # its kernels need CUDA: the GPUs planned for
    liger = training["liger_kernel"]
    setting = Setting(int(zero.get("stage", 0)) if ds else 0,
                      (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme"),
                      bool(training["gradient_checkpointing"]), training["per_device_batch_size"],
                      liger_available if liger == "auto" else bool(liger))
    found = candidates(run, global_batch, gpu_memory, liger_available)
    current = _candidate(run, setting, global_batch, gpu_memory)
    return Planned(run, current, found, recommend(found), gpu_memory, global_batch)


def _candidate(run: Run, s: Setting, global_batch: int, gpu_memory: int) -> Candidate:
    e = estimate(run, s)
    per_rank = max(global_batch // run.world, 1)
    return Candidate(e, max(per_rank // s.micro_batch, 1), e.gpu_peak <= gpu_memory * (1 - HEADROOM),
                     4 / 3 if s.checkpointing else 1.0, 1.5 if s.zero_stage == 3 else 1.0)


def _precision(run_config: dict[str, Any], gpus) -> str:
    """The run's precision; "auto" planned from a machine without GPUs means the GPUs' bf16."""
    from sftdoctor.train import resolve

    if run_config["model"].get("precision", "auto") == "auto" and not (gpus or {}).get("devices"):
        return "bf16"
    return resolve.precision(run_config, gpus)
