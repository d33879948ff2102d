"""`sftdoctor plan`: every term, JSON for machines, another machine, and bad input."""

import json
import subprocess
import sys

import pytest
from conftest import FIXTURES, PLAN_TERMS

pytestmark = pytest.mark.slow  # end-to-end: every test launches sftdoctor for real

LLAMA8B = FIXTURES / "model_config" / "Meta-Llama-3-8B.json"


def sftdoctor(*args):
    return subprocess.run([sys.executable, "-m", "sftdoctor", *args], capture_output=True, text=True)


def write_run(tmp_path, extra: str = "", model: str = "", training: str = "global_batch_size = 64\n") -> str:
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n' * 640)
    (tmp_path / "run.toml").write_text(
        f'[model]\npath = "{LLAMA8B}"\n{model}[data]\ntrain = "d.jsonl"\nmax_length = 4096\n'
        f"[training]\n{training}" + extra
    )
    return str(tmp_path / "run.toml")


def test_plan_command_prints_every_term_and_json_for_machines(tmp_path):
    config = write_run(tmp_path, "[deepspeed]\nzero_stage = 2\n[launch]\nnproc_per_node = 8\n")
    text = sftdoctor("plan", config, "--gpu-memory", "80GiB", "--peak-tflops", "989")
    assert text.returncode == 0, text.stderr
    for term in (
        *PLAN_TERMS,
        "= peak per GPU",
        "8,030,261,248 parameters",
        "s per step",
        "counted closed form",
        "bf16",
    ):
        assert term in text.stdout, term
    doc = json.loads(sftdoctor("plan", config, "--gpu-memory", "80GiB", "--json").stdout)
    assert doc["model"]["parameters"] == 8_030_261_248 and doc["world_size"] == 8
    assert {t["name"] for t in doc["current"]["gpu_terms"]} >= {"weights", "activations", "logits and loss"}
    assert sum(t["bytes"] for t in doc["current"]["gpu_terms"]) == doc["current"]["gpu_peak_bytes"]
    assert doc["recommended"]["fits"] and len(doc["candidates"]) > 10


@pytest.mark.parametrize("target", [16, 100])
def test_every_setting_printed_reaches_the_global_batch(tmp_path, target):
    """Planning 8 GPUs for a global batch of 16 (micro 8 cannot: 8 x 8 = 64) or 100 (8 ranks cannot share it)."""
    config = write_run(tmp_path, training=f"global_batch_size = {target}\nper_device_batch_size = 8\n")
    doc = json.loads(sftdoctor("plan", config, "--gpu-memory", "80GiB", "--gpus", "8", "--json").stdout)
    for c in doc["candidates"]:
        assert c["setting"]["micro_batch"] * c["gradient_accumulation_steps"] * 8 == target
    assert doc["current"]["gradient_accumulation_steps"] is None
    if target == 100:
        assert doc["candidates"] == [] and doc["recommended"] is None


def test_an_explicit_precision_is_kept_for_another_machine(tmp_path):
    config = write_run(tmp_path, model='precision = "fp32"\n')
    doc = json.loads(sftdoctor("plan", config, "--gpu-memory", "80GiB", "--json").stdout)
    assert doc["precision"] == "fp32"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--gpu-memory", "lots"], "'lots' is not a size like 80GiB"),
        ([], "no NVIDIA GPU found here: give --gpu-memory"),
    ],
)
def test_plan_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    config = write_run(tmp_path)
    proc = sftdoctor("plan", config, *args)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_plan_with_lora_counts_the_models_own_adapters_and_offers_4_bits_where_16_do_not_fit(tmp_path):
    config = write_run(tmp_path, "[lora]\nr = 16\n")
    doc = json.loads(sftdoctor("plan", config, "--gpu-memory", "80GiB", "--gpus", "8", "--json").stdout)
    assert doc["lora"]["trainable"] == 41_943_040  # from the model's linear layers, listed on the meta device
    assert {"frozen base", "adapter weights"} <= {t["name"] for t in doc["current"]["gpu_terms"]}
    assert doc["current"]["setting"]["quantize"] == "none" and doc["recommended"]["fits"]
    text = sftdoctor("plan", config, "--gpu-memory", "20GiB", "--gpus", "1")  # 15 GiB of 16-bit base on 20 GiB
    assert text.returncode == 1, text.stderr  # the run's own setting does not fit
    assert (
        "adapters   LoRA on the 16-bit base: r 16" in text.stdout and "41,943,040 trainable parameters" in text.stdout
    )
    assert "recommended: QLoRA 4-bit base" in text.stdout and "frozen base, 4-bit" in text.stdout
