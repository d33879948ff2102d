"""Every tool of `sftdoctor mcp` given odd arguments in-process (`await server.call_tool`), as an agent may send
them: values of every JSON type, numbers that are not (nan, inf, 1e400), empty and blank text, NUL characters,
files that are not files (tests/hostile.py), arguments no tool takes, tools that do not exist. Whatever the mix:
an answer (the command's JSON, its exit code 0 or 1) or a refusal (the command's lines, "sftdoctor: error: ..."),
never a crash (the SDK's UnexpectedToolError), nothing left behind in the inputs' folder, nothing left running."""

from __future__ import annotations

import json
import math
import shutil
import traceback
from pathlib import Path

import pytest
from cli_contract import _children, _tree
from conftest import FIXTURES
from hostile import fed_fifo, no_hang, special_file
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rundirs import run_dir

pytest.importorskip("mcp.server.mcpserver")  # the [mcp] extra (2.x); CI installs it, where a skip fails

import anyio  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError  # noqa: E402

from sftdoctor.mcp.scratch import scratch  # noqa: E402
from sftdoctor.mcp.server import TOOLS, build  # noqa: E402

pytestmark = pytest.mark.slow  # a few hundred calls, each a command's work: about a minute

SPECIAL = ["fifo", "dev-zero", "unreadable", "dangling", "loop", "folder", "empty", "binary"]
REAL = [  # real inputs that are judged in well under a second (a run config's probes build a model: not here)
    FIXTURES / "deepspeed" / "axolotl_zero3_bf16.json",
    FIXTURES / "model_config" / "Llama-3.2-1B.json",
    FIXTURES / "topology" / "dgx1_8xv100_sxm2_oneflow_dlperf.txt",
    FIXTURES / "logs" / "dist-nccl-timeout-allreduce-linenumbered-llamafactory.log",
]
TEXT = ["", " ", "-", "x", "nan", "inf", "1e400", "80GiB", "-5GiB", "0.5MiB", "a\0b", "x\ny", "\u2028", "nan-loss"]
TEXT += ["nan-loss/nope", "nccl-env", "gpu-topolgy", "torch-cuda-match,,", ",", "step", "tokens", "../..", "/"]
NUMBERS = [0, 1, -1, 8, 2**70, 0.5, 1e400, math.nan, math.inf, -math.inf, 10**400]


def make_inputs(root: Path) -> list[str]:
    for kind in SPECIAL:
        special_file(root / kind, kind)
    (root / "bad.toml").write_text("[model\npath = 3\n")
    (root / "odd.toml").write_text('[model]\npath = "nowhere"\n[training]\nlearning_rate = "fast"\n')
    (root / "list.json").write_text("[1, 2]\n")
    run_dir(root / "run")
    shutil.copy(REAL[3], root / "train.log")
    return [str(p) for p in (*REAL, *(root / k for k in SPECIAL), root / "run", root / "train.log")] + [
        str(root / name) for name in ("bad.toml", "odd.toml", "list.json", "missing.toml")
    ]


def values(paths: list[str]) -> st.SearchStrategy:
    """Any JSON value, of the kinds an argument is given."""
    scalar = st.one_of(
        st.sampled_from(paths), st.sampled_from(TEXT), st.sampled_from(NUMBERS), st.booleans(), st.none()
    )
    return st.one_of(scalar, scalar, st.lists(scalar, max_size=3), st.dictionaries(st.sampled_from(TEXT), scalar))


def typed(schema: dict, paths: list[str]) -> st.SearchStrategy:
    """A value of the type the argument's schema names (a string: a path or odd text), or now and then any."""
    kinds = {schema.get("type")} | {option.get("type") for option in schema.get("anyOf", [])}
    text = st.sampled_from(paths) | st.sampled_from(TEXT) | st.sampled_from(schema.get("enum") or TEXT)
    pools = {
        "string": text,
        "integer": st.sampled_from([0, 1, -1, 8, 1024, 1025, 2**16 + 1, 2**70]),
        "number": st.sampled_from(NUMBERS),
        "boolean": st.booleans(),
        "array": st.lists(text, max_size=3),
        "null": st.none(),
    }
    return st.one_of(*(pools[k] for k in sorted(kinds - {None}) if k in pools))


@st.composite
def calls(draw, schemas: dict[str, dict], paths: list[str]) -> tuple[str, dict]:
    name = draw(st.sampled_from([*TOOLS, *TOOLS, "train", "nope"]))
    schema = schemas.get(name, {})
    properties = schema.get("properties", {})
    keys = draw(st.lists(st.sampled_from(sorted(properties)), unique=True, max_size=4)) if properties else []
    keys += [key for key in schema.get("required", []) if key not in keys and draw(st.integers(0, 19))]
    # mostly the schema's type (the tool's own checks then judge the value), now and then any JSON value
    arguments = {key: draw(typed(properties[key], paths) if draw(st.integers(0, 7)) else values(paths)) for key in keys}
    if name in ("report", "diff") and draw(st.booleans()):  # a real run directory, which must stay untouched
        run = next(p for p in paths if p.endswith("/run"))
        arguments.update({"runs": [run]} if name == "report" else {"run_a": run, "run_b": run})
    if draw(st.integers(0, 9)) == 0:
        arguments[draw(st.sampled_from(["output", "write", "out", "--json", "", "dry_run"]))] = draw(values(paths))
    return name, arguments


def judged(server, name: str, arguments: dict) -> None:
    """One call: an answer or a refusal in the command's words; a crash fails with the SDK's cause."""
    shown = f"{name}({json.dumps(arguments, default=str)})"
    try:
        result = anyio.run(server.call_tool, name, arguments)
    except UnexpectedToolError as exc:
        cause = "".join(traceback.format_exception(exc.__cause__)) if exc.__cause__ else ""
        pytest.fail(f"crashed: {shown}\n{cause[-4000:]}")
    except ToolError as exc:  # refused before the tool ran: an argument it does not take, a wrong type, no tool
        assert str(exc).startswith(("sftdoctor: error: ", "Error executing tool ", "Unknown tool: ")), shown
        event(f"{name}: refused before it ran")
        return
    event(f"{name}: {'refused' if result.is_error else 'answered'}")
    text = result.content[0].text
    assert "Traceback (most recent call last)" not in text, shown
    if result.is_error:
        assert result.meta["sftdoctor/exit_code"] == 2, shown
        for line in text.splitlines():
            assert line.startswith("sftdoctor: error: "), f"{shown}: {line!r}"
    else:
        assert result.meta["sftdoctor/exit_code"] in (0, 1), shown
        assert result.structured_content == json.loads(text), shown


@pytest.fixture(scope="module")
def server():
    with scratch() as folder:
        yield build(folder)


@pytest.fixture(scope="module")
def schemas(server) -> dict[str, dict]:
    return {t.name: t.input_schema for t in anyio.run(server.list_tools)}


@given(data=st.data())
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_every_tool_answers_or_refuses_in_one_line(server, schemas, tmp_path_factory, data):
    root = tmp_path_factory.mktemp("mcp-fuzz")
    paths = make_inputs(root)
    name, arguments = data.draw(calls(schemas, paths), label="call")
    before, procs = _tree(root), _children()
    with fed_fifo(root / "fifo", b"x\n" * 100), no_hang(60):
        judged(server, name, arguments)
    assert _tree(root) == before, f"{name}({arguments}) wrote in its inputs' folder"
    assert not _children() - procs, f"{name}({arguments}) left a process running"


PATH_ARGUMENTS = [  # (tool, arguments with V where the path goes, the name the refusal gives it)
    ("check", {"facts": "V"}, "facts"),
    ("check", {"config": "V"}, "config"),
    ("check", {"deepspeed": "V"}, "deepspeed"),
    ("explain", {"log": "V"}, "log"),
    ("plan", {"config": "V"}, "config"),
    ("diff", {"run_a": ".", "run_b": "V"}, "run_b"),
    ("report", {"runs": [".", "V"]}, "runs[1]"),
]


@pytest.mark.parametrize("value", ["a\0b", "", "  "])
@pytest.mark.parametrize("tool, arguments, name", PATH_ARGUMENTS)
def test_a_path_that_names_no_file_is_refused_by_its_argument_name(server, tool, arguments, name, value):
    """ "" would be read as the current folder, and a NUL is os.stat's ValueError: neither reaches a reader."""
    given = {k: [value if x == "V" else x for x in v] if isinstance(v, list) else value if v == "V" else v
             for k, v in arguments.items()}  # fmt: skip
    result = anyio.run(server.call_tool, tool, given)
    [line] = result.content[0].text.splitlines()
    assert result.is_error and line.startswith(f"sftdoctor: error: {name}: "), line
