"""Files that are not files, everywhere a command reads one: every path a command line takes (read from click
itself) and every file a run config names, replaced in turn by a FIFO (fed once, as a pipe is), /dev/zero, a
file even root cannot read (/proc/self/mem: EIO), a dangling symlink, a looping symlink and a folder.

The hostile-input fuzzers draw these at random; this test tries each kind at each place, so that none is left
to chance: a verdict, or one line naming the file (exit 2); never a block, a traceback or a file left behind."""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path

import click
import pytest
from cli_contract import sftdoctor
from conftest import EXAMPLES
from hostile import fed_fifo, no_hang, special_file

from sftdoctor.cli import main

KINDS = ["fifo", "dev-zero", "unreadable", "dangling", "loop", "folder"]
OUTPUTS = {("check", "--out"), ("eval", "--out"), ("report", "--output")}  # written, not read: tests of their own
OWN_FUZZERS = {"eval"}  # tests/eval/test_hostile.py: its inputs need a model and tasks to be reached


def read_paths() -> list[tuple[str, str]]:
    """(command, option or argument name) of every path a command reads."""
    found = []
    for name, command in sorted(main.commands.items()):
        for param in command.params:
            flag = param.opts[0] if isinstance(param, click.Option) else param.name
            if name in OWN_FUZZERS or (name, flag) in OUTPUTS:
                continue
            if isinstance(param.type, click.Path) or (name, flag) == ("explain", "--log"):
                found.append((name, flag))
    return found


def command_line(command: str, flag: str, path: Path, example: Path) -> list[str]:
    """A command line that reaches the read of `path` (everything else in it valid)."""
    if command == "diff":
        return ["diff", path, path]
    if command in ("plan", "train", "sweep", "report") and not flag.startswith("-"):
        return [command, path] + (["--dry-run"] if command in ("train", "sweep") else [])
    if command == "sweep":
        return ["sweep", example.parent / "sweep" / "tiny.toml", flag, path, "--dry-run"]
    if command == "chat":  # the prompts are read before the model loads
        return ["chat", example.parent / "tiny" / "model", flag, path]
    return [command, flag, path]


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("example")
    shutil.copytree(EXAMPLES, root / "examples")
    return root / "examples" / "tiny.toml"


def test_every_read_path_is_covered():
    """A new path option joins this test by itself; this guards that the list read from click is not empty
    of the ones known today."""
    paths = set(read_paths())
    assert {
        ("check", "--config"),
        ("check", "--topology"),
        ("explain", "--log"),
        ("diff", "run_a"),
        ("report", "runs"),
        ("sweep", "sweep_file"),
        ("train", "config"),
        ("plan", "config"),
    } <= paths


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command,flag", read_paths())
def test_a_path_that_is_not_a_file(tmp_path, example, command, flag, kind):
    path = special_file(tmp_path / f"given-{kind}", kind)
    argv = command_line(command, flag, path, example)
    with fed_fifo(path, b"x = 1\n") if kind == "fifo" else nullcontext(), no_hang(30):
        sftdoctor(argv, tmp_path, [path, flag])


NAMED = {  # what a run config names, relative to the example's folder
    "train data": "tiny/data/train.jsonl",
    "eval data": "tiny/data/eval.jsonl",
    "model config": "tiny/model/config.json",
    "tokenizer": "tiny/model/tokenizer.json",
    "tokenizer config": "tiny/model/tokenizer_config.json",
}


# `train` reads the run config with the same reader as `check` (run/config.py): one kind each is enough there
CASES = [("check", kind) for kind in ("fifo", "dev-zero", "unreadable", "loop")] + [("train", "fifo")]


@pytest.mark.parametrize("command,kind", CASES)
@pytest.mark.parametrize("what", sorted(NAMED))
def test_a_file_the_run_config_names_that_is_not_a_file(tmp_path, example, command, what, kind):
    root = tmp_path / "ex"
    shutil.copytree(example.parent, root)
    target = root / NAMED[what]
    target.unlink()
    special_file(target, kind)
    config = root / example.name
    argv = ["check", "--config", config] if command == "check" else ["train", config, "--dry-run"]
    with fed_fifo(target, b"{}\n") if kind == "fifo" else nullcontext(), no_hang(60):
        result = sftdoctor(argv, root, [target.name, config])
    assert result.exit_code != 0, f"{what} as {kind} was judged fine:\n{result.stdout[-2000:]}"
