"""Helpers of the sweep tests: a base run config over the tiny example's data, a sweep file over it, the
recorded facts of a machine with one tiny GPU, and the study a sweep left."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLES
from trainrun import config as run_config
from trainrun import toml_value

# A GPU of 1.5 GiB: the tiny model fits at a micro-batch of 4 (about 1.0 GiB, most of it the CUDA context),
# not at 2048 rows of 64 tokens (about 2.3 GiB).
TINY_GPU = {
    "source": "nvidia-smi",
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "devices": [{"index": 0, "name": "NVIDIA Tiny", "compute_capability": "8.0", "memory_total_mib": 1536}],
}


def base(folder: Path, data: Path, extra: dict | None = None, **training) -> Path:
    """The shortest run that evaluates: 4 steps of 4 rows of 64 tokens, an evaluation every 2 steps."""
    folder.mkdir(parents=True, exist_ok=True)
    path = run_config(
        folder,
        data,
        training={"max_steps": 4, "save_steps": 4, "eval_steps": 2, "logging_steps": 2, "packing": False, **training},
        extra=extra,
    )
    text = path.read_text().replace("max_length = 128", "max_length = 64")
    (folder / "base.toml").write_text(text)
    path.unlink()
    return folder / "base.toml"


def toml_entry(name: str, spec: dict) -> str:
    inner = ", ".join(
        f"{k} = {toml_value(v) if not isinstance(v, list) else '[' + ', '.join(toml_value(x) for x in v) + ']'}"
        for k, v in spec.items()
    )
    return f"{name} = {{{inner}}}"


def sweep_file(folder: Path, base_path: Path, space: dict, name: str = "sweep.toml", **sweep) -> Path:
    lines = ["[sweep]", f"base = {json.dumps(str(base_path))}"]
    lines += [f"{k} = {toml_value(v)}" for k, v in sweep.items()]
    lines += ["", "[space]"] + [toml_entry(k, v) for k, v in space.items()]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_gpu_facts(folder: Path) -> Path:
    path = folder / "tiny-gpu.json"
    path.write_text(
        json.dumps({"sftdoctor": "0.1.0", "schema": 2, "host": "tiny-gpu-box", "facts": {"gpus": TINY_GPU}})
    )
    return path


def sweep_command(path: Path, *flags) -> list[str]:
    return [sys.executable, "-m", "sftdoctor", "sweep", str(path), *flags]


def run_sweep(path: Path, *flags, timeout=900):
    return subprocess.run(sweep_command(path, *flags), capture_output=True, text=True, timeout=timeout)


def trials(sweep_dir: Path, study: str = "sweep"):
    """The study's trials, read from its journal."""
    import optuna

    from sftdoctor.sweep.study import storage

    return optuna.load_study(study_name=study, storage=storage(sweep_dir)).get_trials(deepcopy=False)


LIGHT_BASE = f"""[model]
path = "{EXAMPLES / "tiny" / "model"}"
weights = "random"

[data]
train = "train.jsonl"
eval = "eval.jsonl"

[training]
max_steps = 20
eval_steps = 5
"""


def light_sweep(folder: Path, space: str, sweep: str = "", name: str = "sweep.toml", base_extra: str = ""):
    """A Sweep over a base that names the tiny example's model and local data: read and checked, nothing to train."""
    from sftdoctor.sweep.config import load_sweep

    for data in ("train.jsonl", "eval.jsonl"):
        (folder / data).write_text('{"text": "a"}\n')
    (folder / "base.toml").write_text(LIGHT_BASE + base_extra)
    path = folder / name
    path.write_text(f'[sweep]\nbase = "base.toml"\n{sweep}\n[space]\n{space}\n')
    return load_sweep(path)
