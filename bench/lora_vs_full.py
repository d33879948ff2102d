"""LoRA against a full fine-tune of the same model, same steps, batch and max_length, on this machine in one run.

The bundled tiny example (examples/tiny.toml, copied into a temporary folder) is trained by `sftdoctor train`
twice: once in full and once with [lora] r = 16 on all-linear.

    python bench/lora_vs_full.py [--model-size tiny|0.5b] [--steps N] [--repeats N] [--batch N] [--max-length N]

Prints, for each: trainable parameters, real (non-padding) tokens per second over steps 2..N (the first step's
one-off costs left out), the training process's peak resident memory, and the ratios LoRA / full. With
--repeats (tiny: 3) the runs alternate (full, lora, lora, full, ...) and the medians are printed: a shared
2-core machine is noisy.

Peak memory is the kernel's high-water mark (VmHWM in /proc/PID/status) of each worker process
(`python -m sftdoctor.train.sft`, found among the launcher's descendants by polling /proc every 0.1 s),
summed over the workers: the training process alone. resource.getrusage(RUSAGE_CHILDREN) is not used: it
reports the largest process of the whole tree, probes of the preflight checks included, and only the largest
child ever waited for in this process, so a second run could not be told from the first.

--model-size 0.5b trains, for a few steps, a Qwen2 built from scratch with Qwen2-0.5B's shape (hidden 896,
24 layers, 14 heads / 2 KV heads, MLP 4864, vocabulary 151,936, tied embeddings: 494 M parameters) on the same
data and tokenizer (its ids are < 384, a corner of the vocabulary), at a small batch so that a CPU step takes
seconds, to show the ratios on a realistic shape. It needs about 10 GiB of free memory (the full fine-tune's
fp32 weights, gradients and AdamW states).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path[:0] = [str(ROOT), str(EXAMPLES)]

from make_tiny import QWEN2_05B  # noqa: E402  (the example's tokenizer, on Qwen2-0.5B's shape)

from sftdoctor.train.processes import descendants  # noqa: E402  (the launcher's own walk of /proc)

WORKER = "sftdoctor.train.sft"

SIZES = {  # steps, repeats, per-device batch, max_length when not given
    "tiny": (20, 3, None, None),  # the example's own batch (8 x 2 accumulation) and max_length (256)
    "0.5b": (4, 1, 1, 128),
}


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def write_toml(path: Path, sections: dict) -> None:
    lines = []
    for name, values in sections.items():
        lines += [f"[{name}]", *(f"{key} = {toml_value(value)}" for key, value in values.items()), ""]
    path.write_text("\n".join(lines))


def prepare(work: Path, size: str) -> Path:
    """The example copied into `work`; for 0.5b a model folder with its config and the tiny tokenizer."""
    shutil.copytree(EXAMPLES / "tiny", work / "tiny")
    shutil.copy(EXAMPLES / "tiny.toml", work / "tiny.toml")
    if size == "0.5b":
        folder = work / "tiny" / "model-0.5b"
        folder.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(work / "tiny" / "model" / name, folder / name)
        (folder / "config.json").write_text(json.dumps(QWEN2_05B, indent=2))
    return work / "tiny.toml"


def variant(
    example: Path, name: str, size: str, steps: int, batch: int | None, max_length: int | None, lora: dict | None
) -> Path:
    """The example's config, training only (no eval set), for `steps` steps, no checkpoint before the end."""
    sections = tomllib.loads(example.read_text())
    sections["data"].pop("eval", None)
    if max_length:
        sections["data"]["max_length"] = max_length
    training = sections["training"]
    if batch:
        training["per_device_batch_size"] = batch
        training["global_batch_size"] = batch * 2  # the example's 2 accumulation steps
    training.update(max_steps=steps, logging_steps=1, save_steps=steps * 10, output_dir=f"runs/{name}")
    if size == "0.5b":
        sections["model"]["path"] = "tiny/model-0.5b"
    sections["launch"] = {**sections.get("launch", {}), "master_port": "auto"}
    if lora is not None:
        sections["lora"] = lora
    path = example.with_name(f"{name}.toml")
    write_toml(path, sections)
    return path


def high_water_kib(pid: int) -> int | None:
    """VmHWM of a worker process (None: not a worker, or gone)."""
    try:
        if WORKER not in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
            return None
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def train(config: Path) -> dict:
    """`sftdoctor train CONFIG` with its workers' peak memory polled from /proc."""
    log = config.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sftdoctor", "train", str(config), "--no-rehearse"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=config.parent,
        )
        peaks: dict[int, int] = {}

        def poll():
            while proc.poll() is None:
                for pid in descendants(proc.pid):
                    if (kib := high_water_kib(pid)) is not None:
                        peaks[pid] = max(peaks.get(pid, 0), kib)
                time.sleep(0.1)

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        code = proc.wait()
        watcher.join()
    if code:
        sys.exit(f"{config.name}: sftdoctor train exited {code}:\n" + log.read_text()[-3000:])
    plan = json.loads((config.parent / "runs" / config.stem / "resolved.json").read_text())
    run_dir = Path(plan["output_dir"])
    if not run_dir.is_absolute():
        run_dir = config.parent / run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r and "tokens_seen" in r]
    first, last = steps[0], steps[-1]
    rate = (last["tokens_seen"] - first["tokens_seen"]) / (last["time"] - first["time"])
    return {
        "plan": plan,
        "run_dir": run_dir,
        "rate": rate,
        "peak_mib": sum(peaks.values()) / 1024,
        "workers": len(peaks),
        "loss": (first["loss"], last["loss"]),
        "steps": len(steps),
    }


def trainable(result: dict, model_dir: Path) -> int:
    """Full: every parameter (tied embeddings once), counted on the meta device. LoRA: the saved adapter."""
    if result["plan"].get("lora"):
        from safetensors import safe_open

        with safe_open(str(result["run_dir"] / "final" / "adapter_model.safetensors"), "pt") as f:
            total = 0
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                shape = f.get_slice(key).get_shape()
                count = 1
                for n in shape:
                    count *= n
                total += count
            return total
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--steps", type=int, help="training steps of each run (tiny: 20, 0.5b: 4)")
    parser.add_argument("--repeats", type=int, help="runs of each, alternating (tiny: 3, 0.5b: 1)")
    parser.add_argument("--batch", type=int, help="per-device batch (tiny: the example's 8, 0.5b: 1)")
    parser.add_argument("--max-length", type=int, help="packed row length (tiny: the example's 256, 0.5b: 128)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA r (alpha 32, all-linear)")
    args = parser.parse_args()
    steps, repeats, batch, max_length = SIZES[args.model_size]
    steps, repeats = args.steps or steps, args.repeats or repeats
    batch, max_length = args.batch or batch, args.max_length or max_length
    lora = {"r": args.rank, "alpha": 32, "target_modules": "all-linear"}
    work = Path(tempfile.mkdtemp(prefix="sftdoctor-bench-lora-"))
    runs: dict[str, list[dict]] = {"full": [], "lora": []}
    try:
        example = prepare(work, args.model_size)
        model_dir = work / "tiny" / ("model-0.5b" if args.model_size == "0.5b" else "model")
        for index in range(repeats):
            for name in ("full", "lora") if index % 2 == 0 else ("lora", "full"):
                print(
                    f"training {name} ({args.model_size}, {steps} steps, run {index + 1} of {repeats}) ...",
                    file=sys.stderr,
                    flush=True,
                )
                config = variant(
                    example,
                    f"{name}-{index}",
                    args.model_size,
                    steps,
                    batch,
                    max_length,
                    lora if name == "lora" else None,
                )
                result = train(config)
                result["trainable"] = trainable(result, model_dir)
                runs[name].append(result)
                shutil.rmtree(result["run_dir"], ignore_errors=True)  # the 0.5b ones hold GBs
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {
        name: {
            "trainable": done[0]["trainable"],
            "loss": done[0]["loss"],
            "plan": done[0]["plan"],
            "rate": statistics.median(r["rate"] for r in done),
            "rates": [r["rate"] for r in done],
            "peak_mib": statistics.median(r["peak_mib"] for r in done),
        }
        for name, done in runs.items()
    }
    show(results, args, steps, repeats)
    return 0


def show(results: dict[str, dict], args: argparse.Namespace, steps: int, repeats: int) -> None:
    """The settings, one line per run kind, and LoRA's ratios to the full fine-tune."""
    plan = results["full"]["plan"]
    print(
        f"model {args.model_size}: {plan['per_device_batch_size']} per device x "
        f"{plan['gradient_accumulation_steps']} accumulation, max_length {plan['max_length']}, "
        f"packing {'on' if plan['packing'] else 'off'}, {plan['precision']}, {steps} steps, "
        f"{os.cpu_count()} CPUs; LoRA r {args.rank} alpha 32 all-linear; median of {repeats}"
    )
    print(
        f"{'run':<6} {'trainable params':>17} {'real tok/s':>11} {'peak RSS MiB':>13} {'loss first -> last':>20}"
        "  tok/s of each run"
    )
    for name, r in results.items():
        loss = f"{r['loss'][0]:.3f} -> {r['loss'][1]:.3f}"
        each = ", ".join(f"{rate:,.1f}" for rate in r["rates"])
        print(f"{name:<6} {r['trainable']:>17,} {r['rate']:>11,.1f} {r['peak_mib']:>13,.0f} {loss:>20}  {each}")
    full, lora = results["full"], results["lora"]
    print(
        f"ratio LoRA / full: trainable params {lora['trainable'] / full['trainable']:.4f}, "
        f"tokens/s {lora['rate'] / full['rate']:.2f}, peak RSS {lora['peak_mib'] / full['peak_mib']:.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
