"""sftdoctor.errors: InputError's one-line "file: key: message", InputErrors' one line per problem, did_you_mean;
the one base the CLI catches once, with each error's lines and exit code."""

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import make_run

from sftdoctor.cli import Doctor
from sftdoctor.errors import GateError, InputError, InputErrors, RunStopped, SftdoctorError, did_you_mean
from sftdoctor.findings import Finding, Severity

STOPPED = Finding(severity=Severity.ERROR, title="the loss is nan at step 7")
ERRORS = [
    (
        InputError("run.toml", "expected a number", key="[training].epochs"),
        2,
        ["sftdoctor: error: run.toml: [training].epochs: expected a number"],
    ),
    (
        InputErrors(
            [InputError("a.toml", "unknown key", key="[x].y"), InputError("a.toml", "missing", key="[model].path")]
        ),
        2,
        ["sftdoctor: error: a.toml: [x].y: unknown key", "sftdoctor: error: a.toml: [model].path: missing"],
    ),
    (
        GateError("1 of 2 nodes reached the gate within 5 s (a)"),
        1,
        ["sftdoctor: not starting: 1 of 2 nodes reached the gate within 5 s (a)"],
    ),
    (RunStopped(86, STOPPED), 86, ["sftdoctor: stopped: the loss is nan at step 7"]),
]


@pytest.mark.parametrize("error", [GateError, InputError, InputErrors, RunStopped])
def test_bad_input_the_gate_and_a_stopped_run_share_one_base(error):
    assert issubclass(error, SftdoctorError)


def test_the_modules_that_raise_them_name_the_same_classes():
    from sftdoctor.distributed import gate

    assert gate.GateError is GateError  # train.watch (torch) imports RunStopped from sftdoctor.errors the same way


@pytest.mark.parametrize(
    "error, code, lines", ERRORS, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else ""
)
def test_the_cli_handles_each_in_one_place_with_its_lines_and_exit_code(error, code, lines):
    @click.group(cls=Doctor)
    def group():
        pass

    @group.command()
    def fail():
        raise error

    result = CliRunner().invoke(group, ["fail"])
    assert (result.exit_code, result.stderr.splitlines()) == (code, lines)
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback


def test_a_stopped_run_keeps_its_code_and_finding():
    stopped = RunStopped(86, STOPPED)
    assert (stopped.code, stopped.finding, str(stopped)) == (86, STOPPED, "the loss is nan at step 7")


def test_input_error_names_the_file_the_key_and_the_problem():
    err = InputError("run.toml", "expected a number > 0, got 'x'", key="[training].epochs")
    assert str(err) == "run.toml: [training].epochs: expected a number > 0, got 'x'"
    assert (err.source, err.key, err.message) == ("run.toml", "[training].epochs", "expected a number > 0, got 'x'")


def test_input_error_without_a_key_names_only_the_file():
    assert str(InputError("plan", "no NVIDIA GPU found here")) == "plan: no NVIDIA GPU found here"


def test_input_error_accepts_a_path_as_its_source():
    err = InputError(Path("configs") / "ds.json", "not valid JSON", key="line 3")
    assert err.source == str(Path("configs") / "ds.json")
    assert str(err) == f"{Path('configs') / 'ds.json'}: line 3: not valid JSON"


def test_input_errors_print_one_line_per_problem():
    errors = [
        InputError("run.toml", "unknown key", key="[data].trian"),
        InputError("run.toml", "required", key="[model].path"),
    ]
    combined = InputErrors(errors)
    assert str(combined).splitlines() == ["run.toml: [data].trian: unknown key", "run.toml: [model].path: required"]
    assert combined.errors == errors


def test_did_you_mean_suggests_the_closest_choice():
    assert did_you_mean("learning_rat", ["epochs", "learning_rate", "seed"]) == " (did you mean 'learning_rate'?)"
    assert (
        did_you_mean("nproc_per_nod", (k for k in ("nnodes", "nproc_per_node"))) == " (did you mean 'nproc_per_node'?)"
    )


@pytest.mark.parametrize("word, choices", [("zzz", ["epochs", "learning_rate"]), ("epochs", [])])
def test_did_you_mean_stays_silent_without_a_close_choice(word, choices):
    assert did_you_mean(word, choices) == ""


def test_a_run_config_with_a_typo_reports_every_problem_with_a_suggestion(tmp_path):
    with pytest.raises(InputErrors) as caught:
        make_run(tmp_path, training={"learning_rat": 1e-5, "epochs": "x"})
    lines = str(caught.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        f"{tmp_path / 'run.toml'}: [training].learning_rat: unknown key (did you mean 'learning_rate'?)"
    )
    assert lines[1] == f"{tmp_path / 'run.toml'}: [training].epochs: expected a number > 0 and <= 10000, got 'x'"
