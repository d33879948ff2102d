"""The plan and the memory-fit check on real GPUs' recorded facts and published model configs."""

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from conftest import FIXTURES, recorded_gpus, severities
from sftdoctor.plan import plan_run
from sftdoctor.plan.shape import shape_of
from sftdoctor.train.config import validate

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"  # 8 x 80 GB
V100x4 = "v100_pcie_4x_driver470_cuda114_princeton.txt"  # 4 x 32 GB
LLAMA8B = FIXTURES / "model_config" / "Meta-Llama-3-8B.json"


@pytest.fixture(scope="module")
def llama8b():
    return shape_of(json.loads(LLAMA8B.read_text()))


def run_config(tmp_path, **sections):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n' * 640)
    raw = {"model": {"path": str(LLAMA8B)}, "data": {"train": "d.jsonl", "max_length": 4096},
           "training": {"global_batch_size": 64}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return validate(raw, tmp_path / "run.toml")


def test_the_recommended_setting_is_the_fastest_that_fits_and_keeps_the_global_batch(tmp_path, llama8b):
    cfg = run_config(tmp_path, training={"per_device_batch_size": 8, "gradient_checkpointing": False},
                     deepspeed={"zero_stage": 2})
    planned = plan_run(cfg, llama8b, recorded_gpus(H100x8), {"liger-kernel": "0.8.5"})
    assert not planned.current.fits  # 8 x 4,096 tokens of activations without checkpointing
    best = planned.recommended
    assert best.fits and best.estimate.gpu_peak <= 0.9 * planned.gpu_memory
    assert best.setting.micro_batch * best.accumulation * planned.run.world == 64
    faster = [c for c in planned.candidates if c.speed_key() < best.speed_key()]
    assert faster and not any(c.fits for c in faster)


def test_more_gpus_partition_more_and_checkpointing_cuts_activations(tmp_path, llama8b):
    cfg = run_config(tmp_path, deepspeed={"zero_stage": 3})
    eight = plan_run(cfg, llama8b, recorded_gpus(H100x8), {})
    four = plan_run(cfg, llama8b, recorded_gpus(V100x4), {})
    terms = lambda c: {t.name: t.bytes for t in c.estimate.gpu}  # noqa: E731
    assert terms(four.current)["optimizer states"] == 2 * terms(eight.current)["optimizer states"]
    off = plan_run(run_config(tmp_path, training={"gradient_checkpointing": False}), llama8b, recorded_gpus(H100x8), {})
    assert terms(off.current)["activations"] > 10 * terms(eight.current)["activations"]


def test_memory_fit_check_errs_with_the_change_that_fits(run, tmp_path, llama8b):
    shape = asdict(llama8b)
    big = run_config(tmp_path, training={"per_device_batch_size": 8, "gradient_checkpointing": False},
                     deepspeed={"zero_stage": 2})
    [finding] = run("memory-fit", run_config=big, model_shape=shape, gpus=recorded_gpus(H100x8))
    assert finding.severity.value == "error" and "more than the GPU has" in finding.title
    assert "per_device_batch_size = 1" in finding.fix or "gradient_checkpointing = true" in finding.fix
    fine = run_config(tmp_path, deepspeed={"zero_stage": 2})
    assert severities(run("memory-fit", run_config=fine, model_shape=shape, gpus=recorded_gpus(H100x8))) == ["ok"]
    # DDP keeps 16 bytes per parameter on every V100: 128 GB of states on 32 GB GPUs
    [ddp] = run("memory-fit", run_config=run_config(tmp_path), model_shape=shape, gpus=recorded_gpus(V100x4))
    assert ddp.severity.value == "error" and "zero_stage" in ddp.fix


def sftdoctor(*args):
    return subprocess.run([sys.executable, "-m", "sftdoctor", *args], capture_output=True, text=True)


def test_plan_command_prints_every_term_and_json_for_machines(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n' * 640)
    (tmp_path / "run.toml").write_text(f'[model]\npath = "{LLAMA8B}"\n[data]\ntrain = "d.jsonl"\nmax_length = 4096\n'
                                       '[training]\nglobal_batch_size = 64\n[deepspeed]\nzero_stage = 2\n'
                                       '[launch]\nnproc_per_node = 8\n')
    text = sftdoctor("plan", str(tmp_path / "run.toml"), "--gpu-memory", "80GiB", "--peak-tflops", "989")
    assert text.returncode == 0, text.stderr
    for term in ("weights", "gradients", "optimizer states", "activations", "logits and loss", "fragmentation",
                 "CUDA context", "host RAM per node", "= peak per GPU", "8,030,261,248 parameters", "s per step"):
        assert term in text.stdout, term
    doc = json.loads(sftdoctor("plan", str(tmp_path / "run.toml"), "--gpu-memory", "80GiB", "--json").stdout)
    assert doc["model"]["parameters"] == 8_030_261_248 and doc["world_size"] == 8
    assert {t["name"] for t in doc["current"]["gpu_terms"]} >= {"weights", "activations", "logits and loss"}
    assert sum(t["bytes"] for t in doc["current"]["gpu_terms"]) == doc["current"]["gpu_peak_bytes"]
    assert doc["recommended"]["fits"] and len(doc["candidates"]) > 10


@pytest.mark.parametrize("args, says", [
    (["--gpu-memory", "lots"], "'lots' is not a size like 80GiB"),
    ([], "no NVIDIA GPU found here: give --gpu-memory"),
])
def test_plan_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "run.toml").write_text(f'[model]\npath = "{LLAMA8B}"\n[data]\ntrain = "d.jsonl"\n')
    proc = sftdoctor("plan", str(tmp_path / "run.toml"), *args)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_shows_the_memory_plan_when_there_are_gpus(tmp_path, llama8b):
    from sftdoctor.facts import Facts
    from sftdoctor.train.launch import memory_plan

    cfg = run_config(tmp_path, training={"per_device_batch_size": 8, "gradient_checkpointing": False},
                     deepspeed={"zero_stage": 2})
    facts = Facts.replay({"model_shape": asdict(llama8b), "gpus": recorded_gpus(H100x8), "packages": {}})
    text = memory_plan(cfg, facts)
    assert "does NOT fit" in text and "fastest that fits: ZeRO-2" in text and "sftdoctor plan RUN.toml" in text


def test_gpu_memory_sizes_parse_or_fail_cleanly():
    import click
    from hypothesis import given, settings, strategies as st

    from sftdoctor.cli import Size

    assert Size().convert("80GiB", None, None) == 80 * 2**30
    assert Size().convert("40 GB", None, None) == 40 * 10**9
    assert Size().convert("81920MiB", None, None) == 80 * 2**30

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=20))
    def anything(text):
        try:
            assert Size().convert(text, None, None) >= 0
        except click.BadParameter:
            pass

    anything()
