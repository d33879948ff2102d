"""`sftdoctor mcp` as an agent meets it: the real server started by the SDK's own client over stdio, one session
for every tool. Each answer is the JSON the command prints with --json for the same input (the CLI is run too),
a bad input the line the CLI prints, a write refused; nothing in the inputs' folder changes, and neither the
server nor its scratch folder outlives the session."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, recorded_gpus
from rundirs import run_dir

pytest.importorskip("mcp.server.mcpserver")  # the [mcp] extra (2.x); CI installs it, where a skip fails

import anyio  # noqa: E402  (the SDK's own dependency)
from mcp.client.stdio import stdio_client  # noqa: E402

pytestmark = pytest.mark.slow  # starts the server and runs each command once more through the CLI

ROOT = Path(__file__).parents[2]
LLAMA8B = FIXTURES / "model_config" / "Meta-Llama-3-8B.json"
LOG = FIXTURES / "logs" / "dist-nccl-timeout-allreduce-linenumbered-llamafactory.log"
DS = FIXTURES / "deepspeed" / "axolotl_zero3_bf16.json"
TOOLS = {"check", "explain", "plan", "diff", "report"}
ENV = {  # the client passes the server only HOME, PATH and the like, and these
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1",
    "HF_HUB_OFFLINE": "1",
    "NO_COLOR": "1",
}


def sftdoctor(*args, cwd):
    env = {**os.environ, **ENV}
    return subprocess.run(
        [sys.executable, "-m", "sftdoctor", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env
    )


def tree_hash(root: Path) -> dict[str, str]:
    """Every entry under root: a file's content hash, a folder, a link's target."""
    seen = {}
    for p in sorted(root.rglob("*")):
        key = p.relative_to(root).as_posix()
        if p.is_symlink():
            seen[key] = "-> " + os.readlink(p)
        elif p.is_dir():
            seen[key] = "dir"
        else:
            seen[key] = hashlib.sha256(p.read_bytes()).hexdigest() + f" {p.stat().st_mtime_ns}"
    return seen


def stable(text: str) -> str:
    """A document with the time its facts were collected (check's) left out: the rest must be the same."""
    return re.sub(r'"collected_at": "[^"]*"', '"collected_at": null', text)


def inputs(work: Path) -> dict[str, Path]:
    """A V100 box's facts snapshot, a run config, two run directories that differ in their learning rate, a
    failed run's log, a run config that is not TOML."""
    snap = json.loads(sftdoctor("facts", cwd=work).stdout)
    snap["facts"]["gpus"] = recorded_gpus("v100_pcie_4x_driver470_cuda114_princeton.txt")
    (work / "facts.json").write_text(json.dumps(snap))
    (work / "d.jsonl").write_text('{"text": "a"}\n' * 640)
    (work / "run.toml").write_text(
        f'[model]\npath = "{LLAMA8B}"\n[data]\ntrain = "d.jsonl"\nmax_length = 4096\n'
        "[training]\nglobal_batch_size = 64\n[launch]\nnproc_per_node = 8\n"
    )
    (work / "bad.toml").write_text("[model\npath = 3\n")
    a, b = run_dir(work / "a"), run_dir(work / "b")
    plan = json.loads((b / "resolved.json").read_text())
    (b / "resolved.json").write_text(json.dumps({**plan, "learning_rate": 3e-4}))
    (work / "logs").mkdir()
    shutil.copy(LOG, work / "logs" / "train.log")
    return {"facts": work / "facts.json", "run": work / "run.toml", "bad": work / "bad.toml", "a": a, "b": b}


# (tool, arguments, the same command line)
def calls(f: dict[str, Path], work: Path) -> list[tuple[str, dict, list]]:
    return [
        (
            "check",
            {"facts": str(f["facts"]), "deepspeed": str(DS)},
            ["check", "--facts", f["facts"], "--deepspeed", DS],
        ),
        ("explain", {"topic": "nan-loss"}, ["explain", "nan-loss"]),
        ("explain", {}, ["explain", "--list"]),
        ("explain", {"log": str(work / "logs" / "train.log")}, ["explain", "--log", work / "logs" / "train.log"]),
        ("plan", {"config": str(f["run"]), "gpu_memory": "80GiB"}, ["plan", f["run"], "--gpu-memory", "80GiB"]),
        ("diff", {"run_a": str(f["a"]), "run_b": str(f["b"])}, ["diff", f["a"], f["b"]]),
    ]


REFUSED = [  # (tool, arguments, the same command line): refused by both in the same words
    ("check", {"config": "bad.toml"}, ["check", "--config", "bad.toml"]),
    ("plan", {"config": "missing.toml", "gpu_memory": "80GiB"}, ["plan", "missing.toml", "--gpu-memory", "80GiB"]),
    ("explain", {"topic": "nan-los"}, ["explain", "nan-los"]),
    ("diff", {"run_a": "a", "run_b": "nowhere"}, ["diff", "a", "nowhere"]),
]
WRITES = [  # asked to write: refused, whatever the tool
    ("report", {"runs": ["a"], "output": "out"}, "no argument 'output'"),
    ("plan", {"config": "run.toml", "write": True}, "no argument 'write'"),
    ("check", {"distributed": True, "out": "x"}, "no argument 'distributed'"),
    ("explain", {"log": "-"}, "stdin is this server's protocol channel"),
    ("train", {"config": "run.toml"}, "Unknown tool: train"),
    ("sweep", {}, "Unknown tool: sweep"),
]


async def session(work: Path, f: dict[str, Path], errlog) -> dict:
    from mcp import ClientSession, StdioServerParameters

    server = StdioServerParameters(command=sys.executable, args=["-m", "sftdoctor", "mcp"], env=ENV, cwd=str(work))
    seen: dict = {"answers": [], "refused": [], "writes": []}
    async with (
        stdio_client(server, errlog=errlog) as (read, write),
        ClientSession(read, write, read_timeout_seconds=240) as client,
    ):
        await client.initialize()
        seen["tools"] = (await client.list_tools()).tools
        for tool, arguments, _ in calls(f, work):
            seen["answers"].append(await client.call_tool(tool, arguments))
        seen["report"] = await client.call_tool("report", {"runs": [str(f["a"])]})
        seen["report_exists"] = Path(seen["report"].structured_content["report"]).is_file()
        for tool, arguments, _ in REFUSED:
            seen["refused"].append(await client.call_tool(tool, arguments))
        for tool, arguments, _ in WRITES:
            seen["writes"].append(await client.call_tool(tool, arguments))
    return seen


def test_every_tool_answers_the_sdk_client_with_the_cli_json_and_writes_nothing(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    f = inputs(work)
    before = tree_hash(work)
    with open(tmp_path / "server.log", "w") as errlog:
        seen = anyio.run(session, work, f, errlog)
    log = (tmp_path / "server.log").read_text()
    started = re.search(r"\(pid (\d+), scratch folder (\S+)\)", log)
    assert started, log
    pid, scratch = int(started[1]), Path(started[2])

    # only the five, each marked read-only, none taking an argument it does not declare
    assert {t.name for t in seen["tools"]} == TOOLS
    for t in seen["tools"]:
        assert t.annotations.read_only_hint is True and t.annotations.destructive_hint is False, t.name
        assert t.input_schema["additionalProperties"] is False, t.name

    # nothing written in the inputs' folder; the server and its scratch folder gone with the session
    assert tree_hash(work) == before
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert not scratch.exists()

    # the report was drawn in the scratch folder, not the run, and was there while the server ran
    report = seen["report"]
    assert not report.is_error and seen["report_exists"]
    assert Path(report.structured_content["report"]).is_relative_to(scratch)
    assert report.structured_content["runs"][0]["path"] == str(f["a"])

    # the same JSON as the CLI prints, byte for byte, and its exit code
    for (tool, arguments, argv), answer in zip(calls(f, work), seen["answers"]):
        cli = sftdoctor(*argv, "--json", cwd=work)
        assert not answer.is_error, (tool, answer.content[0].text)
        assert stable(answer.content[0].text) == stable(cli.stdout), (tool, arguments)
        assert json.loads(stable(json.dumps(answer.structured_content))) == json.loads(stable(cli.stdout))
        assert answer.meta["sftdoctor/exit_code"] == cli.returncode, (tool, arguments)
    codes = [a.meta["sftdoctor/exit_code"] for a in seen["answers"]]
    assert (codes[0], codes[3], codes[5]) == (1, 1, 1)  # a bf16 error, a failed run, two learning rates
    out = tmp_path / "out"
    cli = sftdoctor("report", f["a"], "--output", out, "--json", cwd=work)
    folder = str(Path(report.structured_content["report"]).parent)
    assert json.loads(report.content[0].text.replace(folder, str(out))) == json.loads(cli.stdout)

    # a bad input: the CLI's own lines, as an error result
    for (tool, arguments, argv), answer in zip(REFUSED, seen["refused"]):
        cli = sftdoctor(*argv, "--json", cwd=work)
        assert cli.returncode == 2 and answer.is_error, (tool, arguments)
        assert answer.content[0].text == cli.stderr.strip(), (tool, arguments)
        assert answer.meta["sftdoctor/exit_code"] == 2
    for (tool, arguments, says), answer in zip(WRITES, seen["writes"]):
        assert answer.is_error and says in answer.content[0].text, (tool, arguments, answer.content[0].text)
    assert "Traceback" not in log, log


def test_without_the_sdk_it_names_the_extra_in_one_line(tmp_path):
    hide = "import runpy, sys; sys.modules['mcp'] = None; sys.argv = ['sftdoctor', 'mcp']; "
    hide += "runpy.run_module('sftdoctor', run_name='__main__')"
    proc = subprocess.run(
        [sys.executable, "-c", hide], capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=tmp_path
    )
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("sftdoctor: error: mcp: needs the MCP SDK (mcp>=2.3,<3)")
    assert line.endswith("pip install 'sftdoctor[mcp]'")


def test_sigterm_stops_the_server_and_removes_its_scratch_folder(tmp_path):
    """A server killed by its client (the SDK sends SIGTERM to one that does not leave when stdin closes)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sftdoctor", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENV},
    )
    line = proc.stderr.readline()
    scratch = Path(re.search(r"scratch folder (\S+)\)", line)[1])
    assert scratch.is_dir(), line
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    proc.stdin.close()
    assert proc.stdout.read() == ""  # nothing but the protocol ever goes to stdout
    assert not scratch.exists()
