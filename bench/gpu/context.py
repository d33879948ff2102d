"""What every step of the GPU suite shares: the mode, the workload, the machine as the environment probe saw it,
the running step's deadline, the child processes' environment, and the runs already made (a step reuses the
runs of another instead of training the same config twice)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import procs
from workload import ROOT, Workload

HERE = Path(__file__).resolve().parent
CHILDREN = HERE / "children"


@dataclass
class Context:
    mode: str  # "gpu" or "cpu-rehearsal"
    work: Path  # a temporary folder: configs, data, run directories, logs
    load: Workload
    machine: dict[str, Any]  # children/env_probe.py's answer
    fixture_dir: Path
    peak_tflops: float | None  # the GPU's dense bf16 peak (None: unknown, or no GPU)
    peak_source: str  # where the peak came from, or why there is none
    attn: list[str]  # the attention implementations the packing probe tries
    deadline: float = 0.0  # time.monotonic() by which the running step must end
    memo: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------ the machine

    @property
    def rehearsal(self) -> bool:
        return self.mode == "cpu-rehearsal"

    @property
    def cuda(self) -> bool:
        """torch can use a GPU (never in the rehearsal, which hides them)."""
        return not self.rehearsal and bool(self.machine.get("torch", {}).get("available"))

    @property
    def cuda_devices(self) -> list[dict[str, Any]]:
        return self.machine.get("torch", {}).get("devices", []) if self.cuda else []

    def why_no_cuda(self) -> str:
        if self.rehearsal:
            return "CPU rehearsal: no GPU"
        return "torch cannot use a GPU here: " + (
            self.machine.get("torch", {}).get("why") or "torch.cuda.is_available() is False"
        )

    # ------------------------------------------------------------ time

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def share(self, fraction: float) -> float:
        """A part of the step's time left, for one child of several."""
        return max(0.0, self.left() * fraction)

    # ------------------------------------------------------------ children

    def env(self, pin: bool = False, **extra: str) -> dict[str, str]:
        """The children's environment: sftdoctor importable from this checkout; in the rehearsal no GPU; with
        `pin`, one GPU only (the training runs: sftdoctor and TRL on the same GPU)."""
        env = {**os.environ, **extra}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if self.rehearsal:
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif pin:
            visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if d.strip()]
            env["CUDA_VISIBLE_DEVICES"] = visible[0] if visible else "0"
        return env

    def log(self, name: str) -> Path:
        return self.work / "logs" / name

    def python(
        self,
        name: str,
        args: list[str],
        *,
        timeout: float,
        ok: tuple[int, ...] = (0,),
        env: dict[str, str] | None = None,
    ) -> tuple[int, str, str]:
        """`python ARGS` in the work folder, its output in logs/NAME: (exit code, stdout, stderr)."""
        return procs.run([sys.executable, *args], self.log(name), timeout, env=env or self.env(), cwd=self.work, ok=ok)

    def sftdoctor(self, name: str, *args: str, **run: Any) -> tuple[int, str, str]:
        return self.python(name, ["-m", "sftdoctor", *args], **run)

    def child(self, name: str, script: str, *args: str, **run: Any) -> tuple[int, str, str]:
        return self.python(name, [str(CHILDREN / script), *args], **run)

    def torchrun(self, name: str, procs_: int, *args: str, **run: Any) -> tuple[int, str, str]:
        return self.python(
            name, ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs_), *args], **run
        )


def last_json(text: str) -> Any:
    """The JSON document in a child's stdout: its last line that is one (one-line output), else the first
    document that starts a line (pretty-printed output, with anything after it ignored)."""
    lines = text.strip().splitlines()
    for line in reversed(lines):
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    offset = 0
    for line in lines:
        if line.startswith("{"):
            start = text.index(line, offset)
            return json.JSONDecoder().raw_decode(text[start:])[0]
        offset += len(line)
    raise ValueError("no JSON document in the output: " + (lines[-1][:200] if lines else "it was empty"))
