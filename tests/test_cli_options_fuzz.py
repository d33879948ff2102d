"""Every command and every option of the real CLI, read from click itself, given odd values: numbers that are
not (nan, inf, 1e400, '²'), empty and blank text, commas, templates, and files of the wrong kind (missing,
a folder, binary, empty, gzip, a JSON list, /dev/null, and tests/hostile.py's files that are not files: a FIFO,
/dev/zero, a file even root cannot read, a dangling or looping symlink). Whatever the mix, the command keeps the
contract of tests/cli_contract.py: a verdict or one line per problem naming what is at fault, never a traceback,
never a block on a read, nothing left behind, nothing left running. `check --distributed` is given launcher
environments with at least one variable wrong, so that no rank ever waits for the others.

The run-config, model-config, DeepSpeed, topology, snapshot and data fuzzers (test_cli_fuzz.py) mutate real
files; this one mutates the command line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import click
import pytest
from cli_contract import sftdoctor
from conftest import FIXTURES
from hostile import OPTION_TEXT, fed_fifo, no_hang, special_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sftdoctor.cli import main
from sftdoctor.errors import one_line

pytestmark = pytest.mark.slow  # 2,000 command lines in-process: about 20 s

FUZZ = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}

TEXT_VALUES = [
    *OPTION_TEXT,
    "3.5",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "9" * 30,
    "\u00b2",
    "\u0663",
    "abc",
    "a,,b",
    ",",
    "auto",
    "step",
    "tokens",
    "absent:0",
    "absent:9",
    "nan-loss@1",
    "hang@0:1",
    "nan-loss@2:\u00b2",
    "x\ny",
    "\u00e9t\u00e9",
    "{rank}",
    "{",
    "}{",
    "80GiB",
    "-5GiB",
    "0.5MiB",
    "bubblewrap",
    "docker",
    "nccl-error",
    "bf16-support",
    "gpu-topology,nccl-env",
    "tiny_count_choice",
    "torch-cuda-match,,",
    "1,2,0",
    "1,-1",
]
FILES = [
    "missing",
    "folder",
    "binary",
    "empty",
    "gzip",
    "list.json",
    "object.json",
    "text",
    "/dev/null",
    "fifo",
    "dev-zero",
    "unreadable",
    "dangling",
    "loop",
]
SPECIAL = {"fifo", "dev-zero", "unreadable", "dangling", "loop"}  # tests/hostile.py: files that are not files
LOG = (FIXTURES / "logs" / "gpu-negative-healthy-trl-dpo-logs.log").read_bytes()


def make_files(root: Path) -> dict[str, Path]:
    (root / "folder").mkdir()
    (root / "binary").write_bytes(bytes(range(256)) * 4)
    (root / "empty").write_bytes(b"")
    (root / "gzip").write_bytes(gzip.compress(LOG[:4000]))
    (root / "list.json").write_text("[1, 2]\n")
    (root / "object.json").write_text(json.dumps({"facts": [], "step": "x", "task_id": 3}) + "\n")
    (root / "text").write_text("just some words\n[model\n")
    for kind in SPECIAL:
        special_file(root / kind, kind)
    return {name: (Path(name) if name.startswith("/") else root / name) for name in FILES}


def commands() -> dict[str, click.Command]:
    return dict(main.commands)


@st.composite
def command_lines(draw, files: dict[str, Path]):
    """(argv, the names a refusal may name): one command, a few of its options, its arguments."""
    name = draw(st.sampled_from(sorted(commands())))
    command = commands()[name]
    value = st.sampled_from(TEXT_VALUES) | st.sampled_from(sorted(files)).map(lambda k: str(files[k]))
    argv, names = [name], set(files.values()) | {name}
    options = [p for p in command.params if isinstance(p, click.Option) and "--help" not in p.opts]
    for option in draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda p: p.name)) if options else []:
        flag = option.opts[-1]
        names.update(option.opts)
        if option.is_flag:
            argv.append(flag)
        else:
            argv += [flag] + [draw(value) for _ in range(option.nargs if option.nargs > 0 else 1)]
    for argument in (p for p in command.params if isinstance(p, click.Argument)):
        count = argument.nargs if argument.nargs > 0 else draw(st.integers(0 if not argument.required else 1, 2))
        if not argument.required and draw(st.booleans()):
            continue
        argv += [draw(value) for _ in range(count)]
    if name == "explain" and "--log" in argv:
        names.add("-")
    # a value given where a path goes is named as the path ("" would match any line)
    return argv, names | {one_line(v) for v in argv[1:] if v.strip()}  # as errors escape them


LAUNCHER = st.fixed_dictionaries(
    {
        "RANK": st.sampled_from(["0", "1", "5", "-1", "x", ""]),
        "WORLD_SIZE": st.sampled_from(["1", "2", "0", "abc", ""]),
        "LOCAL_RANK": st.sampled_from(["0", "3", "x"]),
        "MASTER_ADDR": st.sampled_from(["", " "]),  # never set: no rank ever opens a store and waits
        "MASTER_PORT": st.sampled_from(["29500", "0", "99999", "http"]),
    }
)


@given(data=st.data())
@settings(max_examples=2000, **FUZZ)
def test_every_command_and_option(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("argv")
    files = make_files(root)
    argv, names = data.draw(command_lines(files), label="argv")
    stdin = data.draw(st.sampled_from([b"", LOG[:3000], gzip.compress(LOG[:3000]), b"\x00\xff" * 64]), label="stdin")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # a default output (sftdoctor-distributed, ./sftdoctor-report) would land here
        if "--distributed" in argv:
            for variable, setting in data.draw(LAUNCHER, label="launcher").items():
                mp.setenv(variable, setting)
            names |= {"environment", "--distributed"}
        # the FIFO is fed once, as a pipe is: a command that reads it twice blocks, caught by no_hang
        with fed_fifo(files["fifo"], LOG[:3000]), no_hang(30):
            sftdoctor(argv, root, sorted(map(str, names)), input=stdin)
