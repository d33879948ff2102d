"""Every summariser a signature can name (`summary = "..."` in a kb topic's front matter), by that name.

The summarisers of a few classes live in modules of their own, which use summaries.py's helpers; they are all
gathered here, above both, so that no module has to register itself into another's table.
"""

from __future__ import annotations

from sftdoctor.triage.ddp import DdpReadyTwice, DdpUnused
from sftdoctor.triage.kernels import Kernels
from sftdoctor.triage.renamed import ApiRenames
from sftdoctor.triage.saves import DeepSpeedBatch, DiskFull
from sftdoctor.triage.summaries import (
    Crash,
    CudaBuild,
    CudaOom,
    Failures,
    LossLog,
    LossScale,
    NcclError,
    NcclWatchdog,
    StoreLost,
    Summary,
)

SUMMARIES: dict[str, type[Summary]] = {
    "watchdog": NcclWatchdog,
    "cuda-oom": CudaOom,
    "loss": LossLog,
    "loss-scale": LossScale,
    "nccl": NcclError,
    "cuda-build": CudaBuild,
    "failures": Failures,
    "exception": Crash,
    "store-lost": StoreLost,
    "kernels": Kernels,
    "disk-full": DiskFull,
    "ds-batch": DeepSpeedBatch,
    "ddp-unused": DdpUnused,
    "ddp-ready-twice": DdpReadyTwice,
    "api-renames": ApiRenames,
}
