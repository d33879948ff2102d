"""The MCP server of `sftdoctor mcp` on the official SDK (mcp 2.x: MCPServer, snake_case fields; verified with
2.3.0). Five tools, each the JSON its command prints with --json, from the function that command prints:
check (checks.command.json_text), explain (triage.command.json_text), plan (plan.command.json_text), diff
(diff.command.json_text) and report (report.command.json_text over a report drawn in the scratch folder, with
nothing recorded in the run). A tool's answer: that JSON as text and as structured content, its exit code in
_meta["sftdoctor/exit_code"]; a refusal: is_error, the lines the command prints on stderr.

stdout is the protocol's: the SDK points fd 1 at stderr while it serves, and each tool runs with sys.stdout
sent to stderr too (a print left in a buffer would otherwise reach the wire at exit). Heavy imports stay in the
tools, and their probes in child processes, as in the CLI."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from sftdoctor import __version__
from sftdoctor.cli import MAX_GPUS_PER_NODE, MAX_NODES
from sftdoctor.errors import InputError, SftdoctorError, one_line

TOOLS = ("check", "explain", "plan", "diff", "report")
EXIT_CODE = "sftdoctor/exit_code"  # a _meta key: a prefix, a slash, a name (the spec's form)
# Hints only (the spec tells clients not to trust them). What the server itself holds to: no tool trains or
# writes outside the scratch folder, and ReadOnlyServer refuses any argument a tool does not declare.
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


class Tools:
    """The five tools, run one at a time: sftdoctor's commands were written for one caller per process (the
    SDK runs each call in a worker thread). A relative path is read from the folder the server started in."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.lock = threading.Lock()

    def answer(self, work: Callable[[], tuple[str, int]]) -> CallToolResult:
        with self.lock, contextlib.redirect_stdout(sys.stderr):
            try:
                text, code = work()
            except SftdoctorError as exc:  # what the CLI prints on stderr, one line per problem
                return CallToolResult(
                    content=[TextContent(type="text", text="\n".join(exc.lines()))],
                    is_error=True,
                    meta={EXIT_CODE: exc.exit_code},
                )
        return CallToolResult(
            content=[TextContent(type="text", text=text)], structured_content=json.loads(text), meta={EXIT_CODE: code}
        )

    def check(
        self,
        config: Annotated[str | None, Field(description="The run config (TOML) of `sftdoctor train`.")] = None,
        model: Annotated[
            str | None, Field(description="A model's config.json, or its folder (--model-config).")
        ] = None,
        deepspeed: Annotated[str | None, Field(description="A DeepSpeed JSON config.")] = None,
        fsdp: Annotated[str | None, Field(description="An accelerate FSDP config (YAML).")] = None,
        topology: Annotated[str | None, Field(description="A saved `nvidia-smi topo -m` output.")] = None,
        facts: Annotated[str | None, Field(description="A facts snapshot (`sftdoctor facts`) to judge.")] = None,
        select: Annotated[str | None, Field(description="Only these checks or messages (CHECK/slug), ','.")] = None,
        disable: Annotated[list[str] | None, Field(description="Checks or messages to silence.")] = None,
        no_plugins: bool = False,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """`sftdoctor check --json`: the preflight checks on this machine (or a facts snapshot) and the given
        configs (a run config TOML, a model's config.json, a DeepSpeed JSON, an accelerate FSDP YAML, a saved
        `nvidia-smi topo -m`). _meta exit_code 1: an error finding."""
        from sftdoctor.checks import plugins_enabled
        from sftdoctor.checks.command import json_text
        from sftdoctor.facts import Inputs

        def work():
            named = {"config": config, "model": model, "deepspeed": deepspeed, "fsdp": fsdp, "topology": topology}
            paths = {k: path(k, v) for k, v in {**named, "facts": facts}.items()}
            inputs = Inputs(**{"model_config" if k == "model" else k: v for k, v in paths.items()})
            return json_text(inputs, select, plugins_enabled(no_plugins), tuple(disable or ()))

        return self.answer(work)

    def explain(
        self,
        topic: Annotated[str | None, Field(description="A topic, or TOPIC/section; none: the list.")] = None,
        log: Annotated[str | None, Field(description="A failed run's log file to triage.")] = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """`sftdoctor explain --json`: a topic of the knowledge base (what a finding's `explain` names), the
        list of topics, or (log) what went wrong in a run's log, the root cause first. _meta exit_code 1: the
        log shows a problem."""
        from sftdoctor.triage.command import json_text

        def work():
            if log is not None and log.strip() == "-":
                raise InputError("log", "stdin is this server's protocol channel: give the log file's path")
            return json_text(topic, False, None if log is None else str(path("log", log)))

        return self.answer(work)

    def plan(
        self,
        config: Annotated[str, Field(description="The run config (TOML) of `sftdoctor train`.")],
        gpu_memory: Annotated[str | None, Field(description="Plan for GPUs of this memory, e.g. 80GiB.")] = None,
        gpus: Annotated[int | None, Field(ge=1, le=MAX_GPUS_PER_NODE, description="GPUs per node.")] = None,
        nodes: Annotated[int | None, Field(ge=1, le=MAX_NODES)] = None,
        mfu: Annotated[float, Field(ge=0.01, le=1.0, allow_inf_nan=False)] = 0.4,
        peak_tflops: Annotated[float | None, Field(ge=1, allow_inf_nan=False)] = None,
        tokens_per_second: Annotated[float | None, Field(ge=1, allow_inf_nan=False)] = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """`sftdoctor plan CONFIG --json`: will the run fit, the fastest setting that does, and how long it will
        take; for another machine with gpu_memory, gpus, nodes. _meta exit_code 1: it does not fit."""
        from sftdoctor.plan.command import json_text

        def work():
            what_if = {"gpus_per_node": gpus, "nodes": nodes, "mfu": mfu, "peak_tflops": peak_tflops}
            memory = size("gpu_memory", gpu_memory)
            return json_text(path("config", config), gpu_memory=memory, tokens_per_second=tokens_per_second, **what_if)

        return self.answer(work)

    def diff(
        self,
        run_a: Annotated[str, Field(description="A run directory of `sftdoctor train`.")],
        run_b: Annotated[str, Field(description="Another run directory.")],
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """`sftdoctor diff A B --json`: what differs between two runs, the likely causes first, and the step where
        their losses part. _meta exit_code 1: something that changes a run's numbers differs."""
        from sftdoctor.diff.command import json_text

        return self.answer(lambda: json_text(path("run_a", run_a), path("run_b", run_b)))

    def report(
        self,
        runs: Annotated[list[str], Field(min_length=1, description="Run directories or trainer_state.json files.")],
        x: Literal["step", "tokens"] = "step",
        no_plugins: bool = False,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """`sftdoctor report RUN... --json`: the curve readers' findings of each run. The report.html and panels
        it names are drawn in this server's temporary folder (gone when the server stops); nothing is written
        in the runs (the CLI also records the findings in findings.jsonl). _meta exit_code 1: an error."""
        return self.answer(lambda: self.drawn([path(f"runs[{i}]", r) for i, r in enumerate(runs)], x, no_plugins))

    def drawn(self, runs: list[Path], x: str, no_plugins: bool) -> tuple[str, int]:
        from importlib.util import find_spec

        if find_spec("matplotlib") is None:
            raise InputError("report", "draws with matplotlib, which is not installed: pip install 'sftdoctor[report]'")
        from sftdoctor.checks import plugins_enabled
        from sftdoctor.report.command import build, json_text, verdict

        output = Path(tempfile.mkdtemp(prefix="report-", dir=self.scratch))
        written = build(runs, output, x, plugins_enabled(no_plugins), record=False)
        return json_text(written), verdict(written)


def path(name: str, value: str | None) -> Path | None:
    """A path argument as the CLI's NonEmptyPath takes it: "" would be read as the current folder."""
    if value is None:
        return None
    if not value.strip():
        raise InputError(name, "an empty path; expected a file or folder")
    if "\0" in value:  # os.stat's ValueError, not an OSError: refused before any open
        raise InputError(name, f"{one_line(value)!r} has a NUL character; expected a path")
    return Path(value)


def size(name: str, value: str | None) -> int | None:
    """A memory size as `plan --gpu-memory` reads it (80GiB, 81920MiB), by the CLI's own converter."""
    import click

    from sftdoctor.cli import Size

    if value is None:
        return None
    try:
        return Size().convert(value, None, None)
    except click.BadParameter as exc:
        raise InputError(name, exc.message) from None


class ReadOnlyServer(MCPServer):
    """Refuses an argument no tool parameter takes (the SDK would drop it silently): an output folder, a --write,
    a misspelt name. Its schemas say so (additionalProperties: false)."""

    def __init__(self, tools: Tools):
        super().__init__("sftdoctor", version=__version__, log_level="WARNING")
        self.takes: dict[str, set[str]] = {}
        for name in TOOLS:
            method = getattr(tools, name)
            self.add_tool(method, name=name, description=inspect.cleandoc(method.__doc__), annotations=READ_ONLY)
            self.takes[name] = set(inspect.signature(method).parameters)

    async def call_tool(self, name: str, arguments: dict[str, Any], context=None):
        takes = self.takes.get(name)
        extra = sorted(set(arguments or {}) - takes) if takes is not None and isinstance(arguments, dict) else []
        if extra:
            raise ToolError(
                f"sftdoctor: error: {name}: no argument {one_line(str(extra[0]))!r} (it takes "
                f"{', '.join(sorted(takes))}); no tool writes a file or takes a place to write one"
            )
        return await super().call_tool(name, arguments, context)

    async def list_tools(self):
        listed = await super().list_tools()
        return [
            t.model_copy(update={"input_schema": {**t.input_schema, "additionalProperties": False}}) for t in listed
        ]


def build(scratch: Path) -> ReadOnlyServer:
    return ReadOnlyServer(Tools(scratch))


def serve() -> int:
    """Serve on stdio until the client closes stdin (0), or Ctrl-C or SIGTERM (130, 143); the scratch folder is
    removed either way."""
    import signal

    from sftdoctor.mcp.scratch import scratch

    stopped: list[int] = []

    def stop(signum, frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, stop)
    try:
        with scratch() as folder:
            print(
                f"sftdoctor mcp: serving {', '.join(TOOLS)} on stdio (pid {os.getpid()}, scratch folder {folder})",
                file=sys.stderr,
                flush=True,
            )
            build(folder).run("stdio")
    except KeyboardInterrupt:
        return 143 if stopped else 130
    finally:
        signal.signal(signal.SIGTERM, before)
    return 0
