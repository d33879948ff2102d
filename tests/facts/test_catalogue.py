"""A fact is declared once, beside its probe (`@fact(...)`), or as a constant of the module whose records it is: the
catalogue, the recorded shapes, the probes of `Facts` and `explain plugins` are all derived from the declarations."""

import importlib
import sys

import pytest

from sftdoctor import kb
from sftdoctor.facts import Facts
from sftdoctor.facts.catalogue import (
    CATALOGUE,
    PHASES,
    FactDeclarationError,
    declared_in,
    fact_names,
    table,
    unavailable_to,
)
from sftdoctor.facts.shapes import SHAPES, fact_problem

EXTRA = """from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.shapes import COUNT

@fact("zz_quota", "the scratch quota left", shape={"left": COUNT}, required=("left",))
def probe_quota(facts):
    return {"left": 3}

ZZ_MOMENT = fact("zz_moment", "a moment of a run", phase="runtime")
"""


@pytest.fixture
def declare(tmp_path, monkeypatch):
    """declare(module, source): a module of sftdoctor.facts in tmp_path (on the package's path, as a new file of
    the package would be), and the catalogue read afresh."""
    import sftdoctor.facts as package

    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(source)
        importlib.invalidate_caches()
        table.cache_clear()
        kb.topics.cache_clear()

    yield write
    for name in [m for m in sys.modules if m.startswith("sftdoctor.facts.zz_")]:
        del sys.modules[name]
        delattr(package, name.rpartition(".")[2])
    table.cache_clear()
    kb.topics.cache_clear()


def test_every_fact_is_of_a_phase_and_every_preflight_fact_has_a_probe_in_its_own_module():
    for name, declared in CATALOGUE.items():
        assert declared.name == name and declared.phase in PHASES, name
        assert (declared.probe is not None) == (declared.phase == "preflight"), name
        module = sys.modules[declared.where.rpartition(":")[0]]
        assert declared in declared_in(module), name
        if declared.probe:  # the probe named resolves: the function of its module, under its own name
            assert getattr(module, declared.probe.__name__) is declared.probe, name


def test_the_recorded_shapes_are_the_declarations():
    assert {name: f.shape for name, f in CATALOGUE.items() if f.shape is not None} == SHAPES
    assert {"gpus", "topology", "packages", "env"} <= set(SHAPES)
    assert all(CATALOGUE[name].is_object for name in SHAPES)
    assert CATALOGUE["topology"].required == ("devices", "links")


def test_the_probed_facts_are_the_preflight_facts_of_the_catalogue():
    assert list(Facts().probes) == fact_names("preflight")
    assert fact_names("runtime") == ["step_stats", "log_stats", "rank_times", "scale_stats", "hang"]
    assert fact_names("distributed") == ["cluster"] and fact_names("postrun") == ["curves"]
    assert list(CATALOGUE)[:2] == ["gpus", "nics"]  # the machine's facts first, then the run's configs'


def test_a_fact_declared_in_a_new_module_is_in_the_catalogue_the_shapes_the_probes_and_explain_plugins(declare):
    """No list to extend: the package's modules are scanned, as the checks' are."""
    declare("zz_site", EXTRA)
    from sftdoctor.facts import catalogue as module
    from sftdoctor.facts import shapes

    assert module.CATALOGUE["zz_quota"].where == "sftdoctor.facts.zz_site:4"
    assert module.CATALOGUE["zz_moment"].phase == "runtime" and "zz_moment" in fact_names("runtime")
    assert shapes.SHAPES["zz_quota"] == {"left": "an integer >= 0"}
    facts = Facts()
    assert "zz_quota" in facts.probes and facts.get("zz_quota") == {"left": 3}
    assert fact_problem("zz_quota", {"left": -1}) == (".left", "expected an integer >= 0, got -1")
    assert fact_problem("zz_quota", {}) == (".left", "missing")
    assert "`zz_quota`" in kb.topic("plugins").body and "`zz_moment`" in kb.topic("plugins").body
    assert unavailable_to("zz_moment", "runtime") is None


def test_a_fact_declared_twice_is_refused_naming_both_places(declare):
    declare(
        "zz_twice",
        "from sftdoctor.facts.catalogue import fact\n\n@fact('gpus', 'again')\ndef probe(facts):\n    pass\n",
    )
    says = r"fact 'gpus' is declared twice: at sftdoctor\.facts\.gpus:\d+ and at sftdoctor\.facts\.zz_twice:3"
    with pytest.raises(FactDeclarationError, match=says):
        table()
    from sftdoctor.checks import load_checks

    with pytest.raises(FactDeclarationError, match=says):  # every command and test that loads the checks
        load_checks(plugins=False)


def test_a_re_exported_declaration_is_not_a_second_one(declare):
    declare("zz_reexport", "from sftdoctor.facts.gpus import probe_gpus\nfrom sftdoctor.facts.moments import HANG\n")
    assert table()["gpus"].where.startswith("sftdoctor.facts.gpus:")


@pytest.mark.parametrize(
    "source, says",
    [
        ("X = fact('zz_x', 'no probe')", r"fact 'zz_x' \(sftdoctor\.facts\.zz_wrong:3\): a preflight fact is declared"),
        ("@fact('zz_x', 'runtime', phase='runtime')\ndef p(facts):\n    pass", "a fact of another phase has none"),
    ],
)
def test_a_preflight_fact_without_a_probe_or_a_moment_with_one_is_refused(declare, source, says):
    declare("zz_wrong", f"from sftdoctor.facts.catalogue import fact\n\n{source}\n")
    with pytest.raises(FactDeclarationError, match=says):
        table()


def test_a_phase_that_does_not_exist_is_refused_where_it_is_declared():
    from sftdoctor.facts.catalogue import fact

    with pytest.raises(FactDeclarationError, match="phase must be one of"):
        fact("zz", "a typo", phase="run-time")


def test_a_fact_of_another_phase_is_named_as_such():
    assert unavailable_to("gpus", "preflight") is None
    assert (
        unavailable_to("curves", "runtime")
        == "asks for the fact 'curves', which only postrun checks receive, not runtime ones"
    )
    assert unavailable_to("gpu", "preflight").endswith("does not exist (did you mean 'gpus'?)")


def test_a_replayed_fact_without_a_probe_is_read_back():
    """`check --distributed` replays its `cluster` fact to the distributed checks: no probe reads it."""
    assert Facts.replay({"cluster": {"ranks": []}}).get("cluster") == {"ranks": []}
    here = Facts()
    assert here.get("cluster") is None and "only under `sftdoctor check --distributed`" in here.why_missing("cluster")


def test_a_recorded_topology_whose_rows_disagree_is_refused_by_its_declaration():
    links = {"GPU0": {"GPU0": "X", "GPU1": "NV18"}, "GPU1": {"GPU0": "SYS", "GPU1": "X"}}
    where, what = fact_problem("topology", {"devices": ["GPU0", "GPU1"], "links": links})
    assert where == ".links" and "GPU0/GPU1" in what
