"""The fact catalogue is the one list of fact names: probes, recorded shapes and the phases' facts all read it."""

import importlib

from sftdoctor.facts import Facts
from sftdoctor.facts.catalogue import CATALOGUE, PHASES, fact_names, unavailable_to
from sftdoctor.facts.shapes import REQUIRED, SHAPES


def test_every_probe_named_is_a_function_and_every_preflight_fact_has_one():
    for name, fact in CATALOGUE.items():
        assert fact.phase in PHASES, name
        assert (fact.probe is not None) == (fact.phase == "preflight"), name
        if fact.probe:
            module, function = fact.probe.split(":")
            assert callable(getattr(importlib.import_module(f"sftdoctor.facts.{module}"), function)), name


def test_the_recorded_shapes_are_of_catalogued_facts():
    assert set(SHAPES) | set(REQUIRED) <= set(CATALOGUE)
    assert all(CATALOGUE[name].is_object for name in SHAPES)


def test_the_probed_facts_are_the_preflight_facts_of_the_catalogue():
    assert list(Facts().probes) == fact_names("preflight")
    assert fact_names("runtime") == ["step_stats", "log_stats", "scale_stats", "hang"]


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


def test_a_probe_module_is_imported_only_when_its_fact_is_asked_for():
    """A plain `sftdoctor check` asks no run-config fact: it must not pay for importing their probes."""
    import subprocess
    import sys

    code = (
        "import sys; from sftdoctor.facts import Facts; facts = Facts(); facts.get('env'); "
        "print('sftdoctor.facts.token_ids' in sys.modules, 'sftdoctor.facts.system' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]
