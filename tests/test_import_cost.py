"""`sftdoctor check`, `explain`, `report` and `--help` must not import the training stack (as accelerate's
tests/test_imports.py does it: run `python -X importtime` and read which modules were loaded)."""

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "trl", "deepspeed", "accelerate", "datasets", "peft", "liger_kernel", "flash_attn")


def imported_modules(*args):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sftdoctor", *args], capture_output=True, text=True
    )
    modules = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            modules.add(name.split(".")[0])
    return proc, modules


# What a plain `sftdoctor check` (no --config) once imported and its checks never need: the run config's parser and
# the resolver (run/__init__ imported them eagerly for anything under sftdoctor.run), and the probe cache's
# hashing and package metadata (importlib.metadata pulls email, zipfile, csv).
NOT_FOR_A_PLAIN_CHECK = (
    "sftdoctor.run.config",
    "sftdoctor.run.resolve",
    "tomllib",
    "hashlib",
    "importlib.metadata",
    "argparse",
    "logging",
    "pickle",
)
SFTDOCTOR_MODULES = 100  # sftdoctor's own modules a plain `check` imports: 90 when this budget was set


def loaded_by(*args: str) -> set[str]:
    """Every module in sys.modules after `sftdoctor ARGS` ran in-process: -X importtime does not list the modules
    importlib.import_module loads (the check and fact modules the registries scan), sys.modules has them all."""
    code = (
        "import contextlib, io, runpy, sys\nsys.argv = ['sftdoctor', *sys.argv[1:]]\n"
        "try:\n    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        runpy.run_module('sftdoctor', run_name='__main__')\n"
        "except SystemExit:\n    pass\nprint(' '.join(sorted(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return set(proc.stdout.split())


@pytest.mark.parametrize("args", [["check"], ["check", "--json"], ["check", "--list"]])
def test_a_plain_check_imports_only_what_its_checks_need(args):
    """bench/check_latency.py holds `check` to 0.06 of collect_env's time: its imports are most of it."""
    modules = loaded_by(*args)
    assert "sftdoctor.checks.nccl_env" in modules  # the checks really loaded
    assert sorted(modules & set(NOT_FOR_A_PLAIN_CHECK)) == []
    ours = sorted(m for m in modules if m == "sftdoctor" or m.startswith("sftdoctor."))
    assert len(ours) <= SFTDOCTOR_MODULES, ours


def test_the_heavy_stack_is_installed_so_this_guard_can_fail():
    import importlib.util

    assert importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["check"],
        ["check", "--json"],
        ["check", "--list"],
        ["explain", "--list"],
        ["explain", "nan-loss"],
        ["facts"],
        ["explain", "--log", "tests/fixtures/logs/gpu-oom-new-format-llamafactory-multirank-rank7.log"],
        ["report", "tests/fixtures/curves/overfit_cpt_large_adgen.json", "--output", "{tmp}"],
        # the FSDP YAML here, the model's classes built on the meta device by a child process
        [
            "check",
            "--fsdp",
            "tests/fixtures/fsdp/trl_fsdp2.yaml",
            "--model-config",
            "tests/fixtures/model_config/gpt2.json",
        ],
    ],
)
def test_no_heavy_imports(args, tmp_path):
    proc, modules = imported_modules(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "sftdoctor.cli" in proc.stderr  # importtime really recorded our imports
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_explain_log_reads_flight_recorder_dumps_in_a_child(tmp_path):
    """torch's analyzer runs in a child process: the CLI's own process still imports nothing heavy."""
    import shutil

    shutil.copytree(
        Path(__file__).parent / "fixtures" / "flight_recorder" / "gloo-hang-drill", tmp_path / "flight-recorder"
    )
    (tmp_path / "train.log").write_text("step 2\n")
    proc, modules = imported_modules("explain", "--log", str(tmp_path / "train.log"))
    assert "flight recorder: rank 1 never entered" in proc.stdout  # the dumps were read (by the child)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "sftdoctor.cli" in proc.stderr  # importtime really recorded our imports
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


@pytest.fixture(scope="module")
def gpu_snapshot(tmp_path_factory):
    """This machine's facts with 8 H100s recorded from a real `nvidia-smi` and their `nvidia-smi topo -m`."""
    import json

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import recorded_gpus, recorded_topology

    doc = json.loads(
        subprocess.run([sys.executable, "-m", "sftdoctor", "facts"], capture_output=True, text=True).stdout
    )
    doc["facts"]["gpus"] = recorded_gpus("h100_sxm_8x_driver550_modal_glossary.txt")
    doc["facts"]["topology"] = recorded_topology("h100_8x_nv18_no_nic_stas00_ml_engineering.txt")
    path = tmp_path_factory.mktemp("gpu") / "facts.json"
    path.write_text(json.dumps(doc))
    return path


def test_check_with_a_run_config_on_gpu_facts_imports_nothing_heavy(gpu_snapshot, tmp_path):
    """The model's shape for memory-fit comes from the closed form in this process, not from torch."""
    config = tmp_path / "run.toml"
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    llama = Path(__file__).parent / "fixtures" / "model_config" / "Meta-Llama-3-8B.json"
    config.write_text(
        f'[model]\npath = "{llama}"\n[data]\ntrain = "d.jsonl"\nmax_length = 4096\n'
        "[training]\npacking = false\n[deepspeed]\nzero_stage = 2\n"
    )
    proc, modules = imported_modules("check", "--facts", str(gpu_snapshot), "--config", str(config))
    assert "memory-fit" in proc.stdout and "8.03B parameters on 8 GPUs" in proc.stdout, proc.stdout + proc.stderr
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
