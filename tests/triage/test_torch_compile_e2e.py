"""torch.compile failing for real on this machine's torch (CPU): the log it prints is named torch-compile, with the
specifics, by `sftdoctor explain --log`'s engine. One child process, two failures: dynamo's recompile limit under
fullgraph=True (backend "eager": no compiler needed) and CPU inductor without a working C++ compiler."""

import io
import subprocess
import sys

import pytest

from sftdoctor.triage import diagnose

CHILD = r"""
import sys, traceback, torch
import torch._dynamo
import torch._inductor.config as inductor

torch._dynamo.config.recompile_limit = 2

@torch.compile(backend="eager", fullgraph=True, dynamic=False)
def f(x):
    return x.sin() + 1

try:
    for n in range(1, 5):
        f(torch.ones(n, n))
except Exception:
    traceback.print_exc()
print("=" * 40, file=sys.stderr, flush=True)
inductor.cpp.cxx = ("/bin/false",)
try:
    torch.compile(lambda x: (x * 2).sin(), backend="inductor")(torch.ones(8))
except Exception:
    traceback.print_exc()
"""


@pytest.fixture(scope="module")
def logs():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    recompile, _, cpp = done.stderr.partition("=" * 40)  # tracebacks and dynamo's warnings: stderr, in order
    return recompile, cpp


@pytest.mark.slow
def test_dynamos_recompile_limit_under_fullgraph_is_a_hard_failure_named_with_its_function(logs):
    diagnosis = diagnose(io.BytesIO(logs[0].encode()))
    assert diagnosis.root.finding.id == "torch-compile" and diagnosis.problems
    evidence = diagnosis.root.finding.evidence
    assert (evidence["recompile_limit"], evidence["recompiles"], evidence["function"]) == ("recompile_limit", 2, "'f'")
    assert "a hard failure under fullgraph=True" in diagnosis.root.finding.title


@pytest.mark.slow
def test_cpu_inductor_without_a_cxx_compiler_is_named_with_the_fix(logs):
    diagnosis = diagnose(io.BytesIO(logs[1].encode()))
    assert diagnosis.root.finding.id == "torch-compile"
    assert "C++" in diagnosis.root.finding.title and "build-essential" in diagnosis.root.finding.fix
