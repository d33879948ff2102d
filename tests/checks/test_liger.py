"""liger-kernel: the installed liger-kernel against triton, transformers and TRL (each broken pair from the projects'
own tags and fixes), and the GPUs Triton compiles for; on recorded GPUs and version sets."""

from importlib.metadata import version

import pytest
from conftest import plan_of, recorded_gpus, run_of, severities

from sftdoctor.checks import Skipped
from sftdoctor.checks.liger import PAIRS

CURRENT = {"liger-kernel": "0.8.5", "triton": "3.9.0", "transformers": "5.25.0", "trl": "1.16.0"}
RTX3090 = recorded_gpus("rtx3090_5x_driver535_fics_cluster.txt")
P100 = recorded_gpus("p100_pcie_4x_driver418_princeton_tiger.txt")
LIGER_ON = plan_of(run_of(training={"liger_kernel": True}), gpus=RTX3090, packages=CURRENT)
LIGER_OFF = plan_of(run_of(training={"liger_kernel": False}), gpus=RTX3090, packages=CURRENT)


def pairs(findings):
    return sorted(f.evidence.get("pair") for f in findings if f.severity.value != "ok")


def test_the_installed_stack_is_no_broken_pair(run):
    installed = {name: version(name) for name in CURRENT}
    findings = run("liger-kernel", packages=installed, plan=LIGER_ON, gpus=RTX3090)
    assert severities(findings) == ["ok"]
    assert f"liger-kernel {installed['liger-kernel']}, triton {installed['triton']}" in findings[0].title
    assert "use_liger_kernel pairs do not apply" in findings[0].title


@pytest.mark.parametrize(
    "stack, pair",
    [
        (
            {"liger-kernel": "0.3.1", "triton": "2.2.0", "transformers": "4.44.2"},
            ["liger-triton-cast", "liger-triton-floor"],
        ),
        ({"liger-kernel": "0.3.1", "triton": "2.3.1", "transformers": "4.44.2"}, ["liger-triton-cast"]),
        ({"liger-kernel": "0.5.0", "triton": "2.3.0", "transformers": "4.46.3"}, ["liger-triton-floor"]),
        ({"liger-kernel": "0.8.5", "transformers": "4.48.2"}, ["liger-transformers-floor"]),
        ({"liger-kernel": "0.6.4", "transformers": "5.0.0"}, ["liger-transformers-v5"]),
    ],
)
def test_a_pair_that_breaks_liger_anywhere_is_an_error_for_a_run_with_liger_and_a_warning_without_a_run(
    run, stack, pair
):
    packages = {**CURRENT, **stack}
    with_run = run("liger-kernel", packages=packages, plan=LIGER_ON, gpus=RTX3090)
    assert pairs(with_run) == pair and set(severities(with_run)) == {"error"}
    alone = run("liger-kernel", packages=packages)
    assert pairs(alone) == pair and set(severities(alone)) == {"warning"}
    assert all(f.evidence["sources"][0].startswith("https://github.com/") for f in alone)


def test_the_cast_pair_names_the_versions_and_its_fix(run):
    [finding] = run(
        "liger-kernel",
        packages={**CURRENT, "liger-kernel": "0.3.1", "triton": "2.3.1", "transformers": "4.44.2"},
        plan=LIGER_ON,
    )
    assert (
        finding.title.startswith("liger-kernel 0.3.1 with triton 2.3.1")
        and finding.fix == 'pip install "liger-kernel>=0.4.0"'
    )


@pytest.mark.parametrize(
    "stack, pair",
    [
        ({"trl": "0.15.1"}, ["trl-liger-logits"]),
        (
            {"trl": "0.26.2", "liger-kernel": "0.6.4", "triton": "3.5.0", "transformers": "4.57.1"},
            ["trl-liger-token-accuracy"],
        ),
        (
            {"trl": "0.27.0", "liger-kernel": "0.6.4", "triton": "3.2.0", "transformers": "4.57.1"},
            ["liger-token-accuracy-triton"],
        ),
    ],
)
def test_a_pair_of_trls_own_switch_warns_without_a_run_and_spares_sftdoctors_trainer(run, stack, pair):
    packages = {**CURRENT, **stack}
    alone = run("liger-kernel", packages=packages)
    assert pairs(alone) == pair and severities(alone) == ["warning"]
    assert "use_liger_kernel=True" in alone[0].detail
    assert severities(run("liger-kernel", packages=packages, plan=LIGER_ON)) == ["ok"]


def test_the_fixed_releases_are_not_flagged(run):
    for stack in (
        {"trl": "0.16.0"},
        {"trl": "0.26.2", "liger-kernel": "0.6.5", "transformers": "4.57.1"},
        {"liger-kernel": "0.4.0", "triton": "2.3.1", "transformers": "4.46.3"},
        {"liger-kernel": "0.7.0", "transformers": "4.52.0"},
        {"liger-kernel": "0.6.5", "triton": "3.2.0", "transformers": "4.57.1"},
    ):
        assert severities(run("liger-kernel", packages={**CURRENT, **stack})) == ["ok"], stack


def test_gpus_below_triton_floor_are_an_error_when_the_run_uses_liger(run):
    plan = plan_of(run_of(training={"liger_kernel": True}), gpus=P100, packages=CURRENT)
    [finding] = run("liger-kernel", packages=CURRENT, plan=plan, gpus=P100)
    assert finding.severity.value == "error" and "compute capability 6.0" in finding.title
    assert finding.fix == "[training] liger_kernel = false on these GPUs"


def test_not_installed_or_off_in_the_run_is_not_applicable(run, registry):
    assert isinstance(run("liger-kernel", packages={**CURRENT, "liger-kernel": None}), Skipped)
    assert isinstance(run("liger-kernel", packages=CURRENT, plan=LIGER_OFF), Skipped)


def test_liger_without_triton_cannot_compile(run):
    findings = run("liger-kernel", packages={**CURRENT, "triton": None}, plan=LIGER_ON)
    assert severities(findings) == ["warning"] and "triton is not" in findings[0].title


def test_every_pair_cites_public_sources_and_says_whom_it_hits():
    assert len({p.id for p in PAIRS}) == len(PAIRS)
    assert all(p.sources and all(s.startswith("https://github.com/") for s in p.sources) for p in PAIRS)
