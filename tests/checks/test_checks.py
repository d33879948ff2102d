"""The check registry and runner: injection by name, skips, isolation of a broken check, and plugins."""

import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import install_plugin

from sftdoctor.checks import NotApplicable, Registry, builtin_modules, check, load_checks, run_check
from sftdoctor.facts import Facts
from sftdoctor.findings import ok

DESIGN_CARD = {"torch-cuda-match", "bf16-support", "gpu-topology", "model-dtype", "deepspeed-precision"}


def test_builtin_checks_include_the_design_card_ids():
    ids = set(load_checks(plugins=False).checks)
    assert DESIGN_CARD | {"flash-attn", "nccl-env"} <= ids


def spec_of(func):
    registry = Registry()
    registry.scan(func, "test")
    return next(iter(registry.checks.values()))


def test_facts_are_injected_by_parameter_name_and_optional_ones_may_be_missing():
    @check("demo", "demo")
    def demo(env, gpus=None):
        return ok(f"{len(env)} vars, gpus={gpus}")

    findings = run_check(spec_of(demo), Facts.replay({"env": {"A": "1"}}))
    assert findings[0].title == "1 vars, gpus=None" and findings[0].id == "demo" and findings[0].explain == "demo"


def test_a_missing_required_fact_skips_with_the_reason():
    @check("needs-topology", "x")
    def needs(topology):
        raise AssertionError("must not run")

    skipped = run_check(spec_of(needs), Facts.replay({}))
    assert skipped.id == "needs-topology" and "not recorded" in skipped.reason


def test_not_applicable_is_a_skip():
    @check("na", "x")
    def na(env):
        raise NotApplicable("one GPU")

    assert run_check(spec_of(na), Facts.replay({"env": {}})).reason == "one GPU"


def test_a_crashing_check_becomes_an_error_finding_naming_it():
    @check("boom", "x")
    def boom(env):
        return 1 / 0

    findings = run_check(spec_of(boom), Facts.replay({"env": {}}))
    assert findings[0].severity.value == "error"
    assert "boom crashed: ZeroDivisionError" in findings[0].title


def test_a_generator_check_that_raises_midway_is_one_error_finding():
    @check("halfway", "x")
    def halfway(env):
        yield ok("first")
        raise KeyError("gpus")

    findings = run_check(spec_of(halfway), Facts.replay({"env": {}}))
    assert [f.severity.value for f in findings] == ["error"] and "halfway crashed: KeyError" in findings[0].title


def test_a_check_returning_something_that_is_not_a_finding_is_one_error_finding():
    @check("stringly", "x")
    def stringly(env):
        return ["all good"]

    [finding] = run_check(spec_of(stringly), Facts.replay({"env": {}}))
    assert finding.severity.value == "error" and "returned str 'all good', not a Finding" in finding.title


def test_duplicate_ids_keep_the_first_and_report_the_second():
    @check("same", "x")
    def first(env):
        return ok("1")

    @check("same", "x")
    def second(env):
        return ok("2")

    registry = Registry()
    registry.scan(first, "a")
    registry.scan(second, "b")
    assert registry.checks["same"].origin == "a"
    assert "ignored" in registry.problems[0].title


def test_declaring_a_check_has_no_side_effect():
    before = set(load_checks(plugins=False).checks)

    @check("not-registered", "x")
    def lonely(env):
        return ok("x")

    assert set(load_checks(plugins=False).checks) == before


PLUGIN = """
from sftdoctor.checks import check
from sftdoctor.findings import warning

@check("site-quota", "the team's disk quota")
def site_quota(env):
    return warning("quota nearly full", fix="clean /scratch")

@check("site-broken", "a plugin check that raises")
def site_broken(env):
    raise RuntimeError("plugin bug")
"""


def check_json(env, *args):
    # nccl-env probes the rendezvous port: its own free one, not torchrun's 29500, which another xdist worker's
    # training (or test_a_busy_default_port_does_not_block_train) may hold at this moment
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--json", "--select", *args],
        capture_output=True,
        text=True,
        env={**env, "MASTER_PORT": str(port)},
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout else proc.stderr


def test_an_installed_plugin_runs_and_a_raising_plugin_check_does_not_sink_the_suite(tmp_path):
    env = install_plugin(tmp_path, PLUGIN)
    code, doc = check_json(env, "site-quota,site-broken,nccl-env")
    by_id = {f["id"]: f for f in doc["findings"]}
    assert by_id["site-quota"]["severity"] == "warning" and by_id["site-quota"]["fix"] == "clean /scratch"
    assert by_id["site-broken"]["severity"] == "error" and "RuntimeError: plugin bug" in by_id["site-broken"]["title"]
    assert "nccl-env" in by_id
    assert code == 1


def test_no_plugins_turns_them_off(tmp_path):
    env = install_plugin(tmp_path, PLUGIN)
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--list", "--no-plugins"], capture_output=True, text=True, env=env
    )
    assert "site-quota" not in proc.stdout and "torch-cuda-match" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--list"], capture_output=True, text=True, env=env
    )
    assert "site-quota" in proc.stdout and "[plugin site (mysite_checks)]" in proc.stdout


STRINGLY = """
from sftdoctor.checks import check

@check("site-text", "a plugin check that returns a string")
def site_text(env):
    return "all fine"
"""


def test_a_plugin_returning_a_string_is_an_error_finding_and_the_rest_still_run(tmp_path):
    env = install_plugin(tmp_path, STRINGLY)
    code, doc = check_json(env, "site-text,nccl-env")
    by_id = {f["id"]: f for f in doc["findings"]}
    assert by_id["site-text"]["severity"] == "error" and "not a Finding" in by_id["site-text"]["title"]
    assert by_id["nccl-env"]["severity"] == "ok" and code == 1


def test_the_environment_switch_turns_plugins_off_for_every_command(tmp_path):
    env = {**install_plugin(tmp_path, PLUGIN), "SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    listed = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--list"], capture_output=True, text=True, env=env
    )
    assert "site-quota" not in listed.stdout and "torch-cuda-match" in listed.stdout
    code, doc = check_json(env, "site-quota")
    assert code == 2 and "no check 'site-quota'" in doc


@pytest.mark.parametrize("value, on", [(None, True), ("", True), ("0", True), ("1", False), ("yes", False)])
def test_plugins_load_unless_switched_off(monkeypatch, value, on):
    from sftdoctor.checks import plugins_enabled

    if value is None:
        monkeypatch.delenv("SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    else:
        monkeypatch.setenv("SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD", value)
    assert plugins_enabled() is on and plugins_enabled(no_plugins=True) is False


def test_an_empty_select_is_bad_input():
    proc = subprocess.run([sys.executable, "-m", "sftdoctor", "check", "--select", ","], capture_output=True, text=True)
    assert proc.returncode == 2 and "--select: expected check or message ids" in proc.stderr


def test_a_plugin_that_fails_to_import_is_a_warning(tmp_path):
    env = install_plugin(tmp_path, "import not_a_module_anywhere\n")
    code, doc = check_json(env, "nccl-env")
    problem = next(f for f in doc["findings"] if f["id"] == "plugin-load")
    assert problem["severity"] == "warning" and "ModuleNotFoundError" in problem["title"]
    assert code == 0


def test_every_module_of_the_package_is_scanned_without_being_listed(tmp_path, monkeypatch):
    """A new check module needs no registration: it is found, and its checks shown after the known ones."""
    import sftdoctor.checks as package

    (tmp_path / "zz_site.py").write_text(
        "from sftdoctor.checks import check\nfrom sftdoctor.findings import ok\n\n"
        "@check('zz-site', 'found without a list')\ndef zz(env):\n    return ok('x')\n"
    )
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = builtin_modules()
    assert modules[0] == "sftdoctor.checks.torch_cuda" and modules[-1] == "sftdoctor.checks.zz_site"
    assert "sftdoctor.checks._common" not in modules  # helpers (a leading _) hold no checks: not scanned


@pytest.mark.parametrize(
    "source, says",
    [
        ("def c(step_stat):", "asks for the fact 'step_stat', which does not exist (did you mean 'step_stats'?)"),
        ("def c(gpus, hang):", "asks for the fact 'hang', which only runtime checks receive, not preflight ones"),
    ],
)
def test_a_check_asking_for_a_fact_that_never_comes_is_refused_at_load(source, says):
    """It would never run (a runtime check whose fact name is misspelt) or always be skipped: said at load."""
    namespace: dict = {}
    exec(f"from sftdoctor.findings import ok\n{source}\n    return ok('x')\n", namespace)
    registry = Registry()
    registry.scan(check("site-typo", "a typo")(namespace["c"]), "plugin site")
    assert "site-typo" not in registry.checks
    [problem] = registry.problems
    assert problem.title == f"check 'site-typo' from plugin site not loaded: it {says}"


def test_every_builtin_check_asks_only_for_facts_of_its_phase():
    registry = load_checks(plugins=False)
    assert registry.problems == [] and len(registry.checks) >= 30


def test_the_plugins_topic_names_every_fact_a_check_can_ask_for():
    """`explain plugins` lists them from the catalogue (kb.facts_by_phase), never by hand."""
    from sftdoctor import kb
    from sftdoctor.facts.catalogue import CATALOGUE

    text = kb.topic("plugins").body
    assert [name for name in CATALOGUE if f"`{name}`" not in text] == []
    assert "- a `runtime` check (during training, whenever the run produces them): `step_stats`" in text


# ---------------------------------------------------------------- refused at import, refused at load

BUILTIN_TYPO = """
from sftdoctor.checks import check
from sftdoctor.findings import ok

@check("zz-typo", "a built-in check with a misspelt fact")
def zz_typo({params}):
    return ok("never")
"""


def builtin_module(tmp_path, monkeypatch, name: str, source: str) -> str:
    """A module put under the sftdoctor.checks package path, as a new built-in check module is."""
    import sftdoctor.checks as package

    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, f"sftdoctor.checks.{name}", raising=False)
    return f"sftdoctor.checks.{name}"


@pytest.mark.parametrize(
    "params, says",
    [
        ("step_stat", "asks for the fact 'step_stat', which does not exist (did you mean 'step_stats'?)"),
        ("gpus, hang", "asks for the fact 'hang', which only runtime checks receive, not preflight ones"),
    ],
)
def test_a_builtin_check_asking_for_a_fact_it_can_never_receive_fails_at_import(tmp_path, monkeypatch, params, says):
    """As pluggy refuses a hook that does not match its spec: the module's own tests fail, not a user's run."""
    import importlib

    from sftdoctor.checks import CheckDeclarationError

    module = builtin_module(tmp_path, monkeypatch, "zz_typo", BUILTIN_TYPO.format(params=params))
    with pytest.raises(CheckDeclarationError) as raised:
        importlib.import_module(module)
    assert str(raised.value) == f"check 'zz-typo' ({module}.zz_typo) {says}"
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(CheckDeclarationError):  # and so does every command, which loads it
        load_checks(plugins=False)


@pytest.mark.parametrize("slug", ["Shm", "shm_size", "", "-shm", "shm/x"])
def test_a_message_slug_that_is_not_kebab_case_is_refused_at_declaration(slug):
    from sftdoctor.checks import CheckDeclarationError

    with pytest.raises(CheckDeclarationError, match=f"check 'demo': message {slug!r}: expected a kebab-case slug"):
        check("demo", "x", messages={slug: "what it says"})


def test_every_builtin_message_is_kebab_case_unique_and_says_what_it_reports():
    import re

    ids = [i for spec in load_checks(plugins=False).checks.values() for i in sorted(spec.ids)]
    assert len(ids) == len(set(ids))
    for spec in load_checks(plugins=False).checks.values():
        for slug, said in spec.messages.items():
            assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug), (spec.id, slug)
            assert said.strip() and "\n" not in said, (spec.id, slug)


def test_every_kb_section_a_builtin_finding_points_to_exists():
    """`explain="TOPIC#slug"` in a check module names a section of that topic (`sftdoctor explain TOPIC/slug`)."""
    import re

    from sftdoctor import kb

    folder = Path(__file__).resolve().parents[2] / "sftdoctor" / "checks"
    pointed = {m for f in folder.glob("*.py") for m in re.findall(r'explain="([a-z0-9-]+#[a-z0-9-]+)"', f.read_text())}
    missing = []
    for where in sorted(pointed):
        name, slug = where.split("#")
        if slug not in kb.sections(kb.topic(name).body):
            missing.append(where)
    assert missing == []


@check("demo-messages", "x", messages={"shm": "shared memory is small", "port": "the port is busy"})
def _demo_messages(env):
    return [ok("fine", id="demo-messages/shm"), ok("also", id=env.get("ID", "demo-messages/port"))]


def test_a_builtin_finding_of_an_undeclared_id_is_one_error_finding_naming_it():
    spec = replace(spec_of(_demo_messages), origin="sftdoctor")
    declared = run_check(spec, Facts.replay({"env": {}}))
    assert [f.id for f in declared] == ["demo-messages/shm", "demo-messages/port"]
    [broken] = run_check(spec, Facts.replay({"env": {"ID": "demo-messages/shmm"}}))
    assert broken.severity.value == "error" and broken.id == "demo-messages"
    assert "returned a finding of id 'demo-messages/shmm', which it does not declare" in broken.title
    # a plugin's own ids are its business: kept as it gave them
    plugin = run_check(replace(spec, origin="plugin site"), Facts.replay({"env": {"ID": "site/x"}}))
    assert [f.id for f in plugin] == ["demo-messages/shm", "site/x"]


REFUSED_PLUGIN = """
from sftdoctor.checks import check
from sftdoctor.findings import ok

@check("site-typo", "a plugin check with a misspelt fact")
def site_typo(step_stat):
    return ok("never")
"""


def test_a_refused_plugin_check_is_listed_and_selecting_it_says_why(tmp_path):
    """A plugin keeps the soft refusal (a plugin-load warning), but --list shows it and --select says why."""
    env = install_plugin(tmp_path, REFUSED_PLUGIN)
    listed = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--list"], capture_output=True, text=True, env=env
    )
    why = "it asks for the fact 'step_stat', which does not exist (did you mean 'step_stats'?)"
    assert f"site-typo              refused     {why}  [plugin site (mysite_checks)]" in listed.stdout.splitlines()
    code, said = check_json(env, "site-typo")
    assert code == 2
    assert (
        said.strip()
        == f"sftdoctor: error: --select: check 'site-typo' from plugin site (mysite_checks) was refused: {why}"
    )
