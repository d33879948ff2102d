"""`sftdoctor check`, `explain` and `--help` must not import the training stack (as accelerate's
tests/test_imports.py does it: run `python -X importtime` and read which modules were loaded)."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "trl", "deepspeed", "accelerate", "datasets", "peft", "liger_kernel", "flash_attn")


def imported_modules(*args):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sftdoctor", *args],
                          capture_output=True, text=True)
    modules = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            modules.add(name.split(".")[0])
    return proc, modules


def test_the_heavy_stack_is_installed_so_this_guard_can_fail():
    import importlib.util

    assert importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")


@pytest.mark.parametrize("args", [["--help"], ["check"], ["check", "--json"], ["check", "--list"],
                                  ["explain", "--list"], ["explain", "nan-loss"], ["facts"],
                                  ["explain", "--log", "tests/fixtures/logs/gpu-oom-new-format-llamafactory-multirank-rank7.log"]])
def test_no_heavy_imports(args):
    proc, modules = imported_modules(*args)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "sftdoctor.cli" in proc.stderr  # importtime really recorded our imports
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
