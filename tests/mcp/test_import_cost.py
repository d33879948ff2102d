"""The server starts without the training stack and its tools run without it, as the commands they serve do
(tests/test_import_cost.py): their probes that need torch or transformers run in child processes."""

import json
import subprocess
import sys

import pytest
from conftest import FIXTURES
from rundirs import run_dir
from test_import_cost import HEAVY

pytest.importorskip("mcp.server.mcpserver")  # the [mcp] extra (2.x); CI installs it, where a skip fails

CALLS = """
import anyio, json, sys
from sftdoctor.mcp.scratch import scratch
from sftdoctor.mcp.server import build

with scratch() as folder:
    server = build(folder)
    for name, arguments in json.loads(sys.argv[1]):
        result = anyio.run(server.call_tool, name, arguments)
        assert not result.is_error, (name, result.content[0].text)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in json.loads(sys.argv[2]))))
"""


def test_no_tool_imports_the_training_stack_in_the_server(tmp_path):
    run = str(run_dir(tmp_path / "run"))
    calls = [
        ("check", {}),
        ("check", {"deepspeed": str(FIXTURES / "deepspeed" / "axolotl_zero3_bf16.json")}),
        ("explain", {"topic": "nan-loss"}),
        ("explain", {"log": str(FIXTURES / "logs" / "dist-nccl-timeout-allreduce-linenumbered-llamafactory.log")}),
        ("diff", {"run_a": run, "run_b": run}),
        ("report", {"runs": [run]}),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", CALLS, json.dumps(calls), json.dumps(HEAVY)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == []
