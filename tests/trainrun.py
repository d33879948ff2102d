"""Helpers of the training tests: write a run config over the tiny example's data, run `sftdoctor train` (or
start any command) as a user would, read what the run left; the tiny model, for a trainer in the test's process."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def write_config(folder: Path, sections: dict) -> Path:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
    path = folder / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def config(folder: Path, data: Path, training=None, launch=None, deepspeed=None, extra=None) -> Path:
    sections = {
        "model": {"path": str(data / "model"), "weights": "random"},
        "data": {
            "train": str(data / "data" / "train.jsonl"),
            "eval": str(data / "data" / "eval.jsonl"),
            "max_length": 128,
        },
        "training": {
            "per_device_batch_size": 4,
            "learning_rate": 3e-3,
            "max_steps": 4,
            "save_steps": 2,
            "logging_steps": 1,
            "gradient_checkpointing": False,
            "seed": 0,
            "output_dir": "out",
            **(training or {}),
        },
        "launch": {"master_port": "auto", **(launch or {})},
    }
    if deepspeed:
        sections["deepspeed"] = deepspeed
    sections.update(extra or {})
    return write_config(folder, sections)


def train(cfg: Path, *flags, timeout=600, env=None):
    return subprocess.run(
        [sys.executable, "-m", "sftdoctor", "train", str(cfg), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def tiny_qwen2(**overrides):
    """The smallest real causal LM the trainers take, built in this process: a one-layer Qwen2 (vocabulary 64,
    hidden size 16) of random weights, seeded 0; `overrides` are Qwen2Config fields (tie_word_embeddings)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            **overrides,
        )
    )


def start(*argv, stderr=subprocess.PIPE) -> subprocess.Popen:
    """`sftdoctor ARGV` started as a user starts it, for a test that watches or signals it while it runs; its
    output read as text (stderr=subprocess.STDOUT: both in one stream)."""
    return subprocess.Popen(
        [sys.executable, "-m", "sftdoctor", *map(str, argv)], stdout=subprocess.PIPE, stderr=stderr, text=True
    )


def metrics(run_dir: Path) -> list[dict]:
    """The training-step records (metrics.jsonl also holds eval and end-of-run records)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r]


def complete(run_dir: Path) -> list[str]:
    names = [p.parent.name for p in run_dir.glob("checkpoint-*/sftdoctor-complete")]
    return sorted(names, key=lambda name: int(name.split("-")[1]))


NAN_EXIT, HANG_EXIT = 86, 87  # what `train` exits with when the nan-loss or the hang watcher stopped the run


def runtime_findings(run_dir):
    records = [json.loads(line) for line in (run_dir / "findings.jsonl").read_text().splitlines()]
    return [r for r in records if r["phase"] == "runtime"]


def job_processes(run_dir):
    """Processes of this run still alive (launcher, torchrun, workers: all name the run's files)."""
    import psutil

    alive = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(run_dir) in part for part in proc.info["cmdline"] or []):
                alive.append(proc.pid)
        except psutil.Error:
            pass
    return alive


def stopped_by_sigterm(cfg: Path, run_dir: Path, after_step: int = 3) -> tuple[int, str, int]:
    """`train CFG --no-rehearse`, sent SIGTERM (as `scancel` or a time limit sends it) once step `after_step` is
    logged: (its exit code, its output, the step every rank agreed to stop after)."""
    import signal
    import time

    launcher = start("train", cfg, "--no-rehearse", stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while launcher.poll() is None and time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").exists() and any(m["step"] >= after_step for m in metrics(run_dir)):
            break
        time.sleep(0.2)
    assert launcher.poll() is None, launcher.communicate()[0][-3000:]
    launcher.send_signal(signal.SIGTERM)
    out = launcher.communicate(timeout=120)[0]
    agreed = [line for line in out.splitlines() if "every rank stops after step" in line]
    assert len(agreed) == 1 and "with a checkpoint" in agreed[0], out[-3000:]
    return launcher.returncode, out, int(agreed[0].split("after step ")[1].split()[0])
