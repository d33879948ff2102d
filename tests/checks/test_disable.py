"""One message, one id: `--disable ID` and the run config's `[checks] disable` silence a check (every message of
it) or one message (CHECK/slug). A silenced finding is still printed, marked silenced, and counts toward neither
the exit code nor the gate; an id that names nothing is bad input naming the option, or the file and its key."""

from __future__ import annotations

import json
import sys

import pytest
from cli_contract import sftdoctor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sftdoctor.checks import Registry, check, known_ids, silence, split_ids, to_silence
from sftdoctor.errors import InputError, InputErrors
from sftdoctor.facts import Facts
from sftdoctor.findings import Severity, error, info, ok, warning


@check("demo-env", "x", messages={"shm": "shared memory is small", "port": "the port is busy"})
def _demo(env):
    return [error("shm", id="demo-env/shm"), warning("port", id="demo-env/port"), ok("fine")]


@check("other", "y")
def _other(env):
    return ok("x")


def registry() -> Registry:
    found = Registry()
    found.scan(_demo, "sftdoctor")
    found.scan(_other, "sftdoctor")
    return found


FINDINGS = [error("shm", id="demo-env/shm"), warning("port", id="demo-env/port"), ok("x", id="other")]


def test_a_check_id_silences_every_message_of_it_and_a_message_id_only_that_one():
    assert [f.silenced for f in silence(FINDINGS, ["demo-env"])] == [True, True, False]
    assert [f.silenced for f in silence(FINDINGS, ["demo-env/port"])] == [False, True, False]
    assert [f.silenced for f in silence(FINDINGS, [])] == [False, False, False]
    assert [f.silenced for f in silence(FINDINGS, ["demo"])] == [False, False, False]  # no prefix match


def test_ids_come_from_a_repeatable_comma_separated_option():
    assert split_ids(["demo-env/shm, other", "demo-env", ""]) == ["demo-env/shm", "other", "demo-env"]


@pytest.mark.parametrize(
    "name, hint",
    [
        ("demo-env/shmm", " (did you mean 'demo-env/shm'?)"),
        ("othr", " (did you mean 'other'?)"),
        ("other/x", " (did you mean 'other'?)"),  # a check without that message
        ("zzz", ""),
    ],
)
def test_an_id_that_names_nothing_is_bad_input_naming_the_source_and_key(name, hint):
    with pytest.raises(InputErrors) as raised:
        known_ids(registry(), ["other", name], "run.toml", key="[checks].disable")
    assert str(raised.value) == (
        f"run.toml: [checks].disable: no check or message {name!r}{hint}; see `sftdoctor check --list`"
    )


def test_known_ids_are_kept_once_in_order():
    assert known_ids(registry(), ["other", "demo-env/shm", "other"], "--disable") == ("other", "demo-env/shm")


def test_a_refused_plugin_check_may_be_disabled():
    """Its id is known (check --list shows it): disabling it is not an error, only a no-op."""
    found = registry()
    found.scan(check("site-typo", "x")(lambda step_stat: ok("never")), "plugin site")
    assert "site-typo" in found.refused and known_ids(found, ["site-typo"], "--disable") == ("site-typo",)


@pytest.mark.parametrize("given", [[""], [" , "], [","], ["other", ""]])
def test_an_empty_disable_option_is_bad_input(given):
    """`--disable "$UNSET"` must not read as "nothing silenced"."""
    with pytest.raises(InputError, match="--disable: expected check or message ids separated by commas"):
        to_silence(registry(), given)


def test_without_a_run_config_the_run_config_is_never_asked_for():
    """A plain `check` does not pay for the run config's probe (it imports the run model)."""

    class NoRun(Facts):
        def get(self, name):
            raise AssertionError(f"asked for {name}")

    assert to_silence(registry(), ["other"], NoRun()) == ("other",)


# ---------------------------------------------------------------- the command


BUILTIN = """
from sftdoctor.checks import check
from sftdoctor.findings import error, warning

@check("zz-demo", "a check of two messages", messages={"full": "the disk is full", "slow": "the disk is slow"})
def zz_demo(env):
    return [error("disk full", fix="free some space", id="zz-demo/full"), warning("disk slow", id="zz-demo/slow")]
"""


@pytest.fixture
def demo_check(tmp_path, monkeypatch):
    import sftdoctor.checks as package

    folder = tmp_path / "checks"
    folder.mkdir()
    (folder / "zz_demo_disable.py").write_text(BUILTIN)
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    monkeypatch.delitem(sys.modules, "sftdoctor.checks.zz_demo_disable", raising=False)
    root = tmp_path / "inputs"  # the command's folder, apart from the module's (its __pycache__)
    root.mkdir()
    yield root
    sys.modules.pop("sftdoctor.checks.zz_demo_disable", None)


def run(root, *args):
    return sftdoctor(["check", "--select", "zz-demo", *args], root, ["--disable", "--select"])


def test_a_silenced_error_is_printed_marked_and_the_exit_code_is_0(demo_check):
    assert run(demo_check).exit_code == 1
    result = run(demo_check, "--disable", "zz-demo/full")
    lines = result.stdout.splitlines()
    assert result.exit_code == 0
    assert lines[0] == "~  zz-demo/full  silenced error: disk full"
    assert "fix: free some space" in lines[1]  # never hidden
    assert lines[3] == "!  zz-demo/slow  disk slow"
    assert lines[-1] == "1 check: 0 errors, 1 warning, 0 info, 0 ok, 0 skipped, 1 silenced"


def test_disable_takes_a_check_id_repeated_or_comma_separated_and_json_marks_each(demo_check):
    for args in (
        ["--disable", "zz-demo"],
        ["--disable", "zz-demo/full,zz-demo/slow"],
        ["--disable", "zz-demo/full", "--disable", "zz-demo/slow"],
    ):
        result = run(demo_check, "--json", *args)
        doc = json.loads(result.stdout)
        assert result.exit_code == 0 and doc["exit_code"] == 0, args
        assert [(f["id"], f["silenced"]) for f in doc["findings"]] == [("zz-demo/full", True), ("zz-demo/slow", True)]
        assert doc["summary"]["silenced"] == 2 and doc["summary"]["error"] == 0


def test_an_unknown_disable_id_is_one_line_naming_the_option(demo_check):
    result = run(demo_check, "--disable", "zz-demo/fulll")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        "sftdoctor: error: --disable: no check or message 'zz-demo/fulll' (did you mean 'zz-demo/full'?); "
        "see `sftdoctor check --list`\n"
    )


def test_check_list_shows_each_message_id_under_its_check(demo_check):
    listed = sftdoctor(["check", "--list"], demo_check, []).stdout.splitlines()
    at = listed.index(next(line for line in listed if line.startswith("zz-demo ")))
    assert listed[at + 1 : at + 3] == ["  zz-demo/full: the disk is full", "  zz-demo/slow: the disk is slow"]


# ---------------------------------------------------------------- --select CHECK/slug: one message of a check


def select(root, value, *args):
    return sftdoctor(["check", "--select", value, *args], root, ["--select", "--disable"])


def test_select_a_message_shows_only_that_message_of_its_check(demo_check):
    result = select(demo_check, "zz-demo/slow")
    assert result.exit_code == 0  # the other message's error is not shown, nor counted
    assert result.stdout.splitlines()[0] == "!  zz-demo/slow  disk slow" and "disk full" not in result.stdout
    assert result.stdout.splitlines()[-1] == "1 check: 0 errors, 1 warning, 0 info, 0 ok, 0 skipped"
    assert select(demo_check, "zz-demo/full").exit_code == 1


def test_select_a_check_and_one_of_its_messages_shows_the_whole_check(demo_check):
    result = select(demo_check, "zz-demo/slow,zz-demo", "--json")
    assert [f["id"] for f in json.loads(result.stdout)["findings"]] == ["zz-demo/full", "zz-demo/slow"]


def test_a_selected_message_the_check_did_not_report_is_said_checked(demo_check):
    result = select(demo_check, "nccl-env/port-invalid")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "✓  nccl-env/port-invalid  checked, not found: MASTER_PORT is not a port number",
        "1 check: 0 errors, 0 warnings, 0 info, 1 ok, 0 skipped",
    ]


def test_a_selected_message_may_be_silenced_too(demo_check):
    result = select(demo_check, "zz-demo/full", "--disable", "zz-demo")
    assert result.exit_code == 0 and result.stdout.startswith("~  zz-demo/full  silenced error: disk full")


@pytest.mark.parametrize(
    "value, says",
    [
        ("zz-demo/fulll", "no check or message 'zz-demo/fulll' (did you mean 'zz-demo/full'?)"),
        ("zz-demo/", "no check or message 'zz-demo/' (did you mean 'zz-demo'?)"),
        ("zz-dem/full", "no check or message 'zz-dem/full' (did you mean 'zz-demo/full'?)"),
    ],
)
def test_an_unknown_selected_message_is_one_line_with_a_did_you_mean(demo_check, value, says):
    result = select(demo_check, value)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"sftdoctor: error: --select: {says}; see `sftdoctor check --list`\n"


# ---------------------------------------------------------------- fuzzed with tests/hostile.py's vocabulary

OPTION_VALUES = ["", " ", ",", "a,,b", "nccl-env/", "/shm", "nccl-env//shm", "NCCL-ENV", "x\ny", "\u00e9t\u00e9", "☃"]


@given(
    values=st.lists(
        st.sampled_from([*OPTION_VALUES, "nccl-env", "nccl-env/port-busy", "disk-full"]), min_size=1, max_size=3
    )
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_disable_option_is_a_verdict_or_one_line_naming_it(tmp_path, values):
    args = [a for v in values for a in ("--disable", v)]
    result = sftdoctor(["check", "--select", "nccl-env", *args], tmp_path, ["--disable"])
    bad = [v for v in values if v not in ("nccl-env", "nccl-env/port-busy", "disk-full")]
    assert (result.exit_code == 2) == bool(bad), result.stderr


def test_disable_does_not_go_with_the_clusters_check(tmp_path):
    """check --distributed judges the cluster as one: a --disable there would read as applied, and is not."""
    result = sftdoctor(["check", "--distributed", "--disable", "nccl-env"], tmp_path, ["--disable"])
    assert (result.exit_code, result.stderr) == (2, "sftdoctor: error: --disable: does not go with --distributed\n")


@given(
    values=st.lists(
        st.sampled_from([*OPTION_VALUES, "nccl-env", "nccl-env/port-busy", "nccl-env/port-bussy", "disk-full"]),
        min_size=1,
        max_size=3,
    )
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_select_value_is_a_verdict_or_one_line_naming_it(tmp_path, values):
    """--select's value, ids joined by commas (a blank one between them is dropped, as before)."""
    value = ",".join(values)
    result = sftdoctor(["check", "--select", value], tmp_path, ["--select"])
    named = [part.strip() for part in value.split(",") if part.strip()]
    bad = not named or any(v not in ("nccl-env", "nccl-env/port-busy", "disk-full") for v in named)
    assert (result.exit_code == 2) == bad, result.stderr


def test_an_error_of_the_whole_check_selected_by_a_message_is_never_hidden():
    """A check that crashed says so under its own id: selecting one of its messages must not hide it."""
    from sftdoctor.checks.command import of_messages

    crashed = error("check demo-env crashed: KeyError", id="demo-env")
    findings = [crashed, warning("port", id="demo-env/port")]
    assert of_messages(registry(), findings, [], {"demo-env": {"demo-env/shm"}}) == [crashed]


def test_a_selected_message_beside_an_info_of_its_check_is_not_judged_apart_never_ok():
    """A check that says an info (how it says what it could not judge) has not cleared the other messages:
    `--select CHECK/slug` must not give them a ✓."""
    from sftdoctor.checks.command import of_messages

    findings = [info("free space unknown", id="demo-env/port")]
    [said] = of_messages(registry(), findings, [], {"demo-env": {"demo-env/shm"}})
    assert said.severity is Severity.INFO and said.id == "demo-env/shm"
    assert said.title.startswith("not judged apart: shared memory is small; the check also said demo-env/port")
    [cleared] = of_messages(registry(), [warning("port", id="demo-env/port")], [], {"demo-env": {"demo-env/shm"}})
    assert cleared.severity is Severity.OK and cleared.title == "checked, not found: shared memory is small"
