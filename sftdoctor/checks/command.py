"""`sftdoctor check`: the preflight checks on this machine (or a replayed one) and the given configs."""

from __future__ import annotations

from sftdoctor import render
from sftdoctor.checks import load_checks, run_checks
from sftdoctor.errors import InputError, did_you_mean
from sftdoctor.facts import Facts, Inputs, launch_inputs


def main(
    inputs: Inputs,
    select: str | None = None,
    list_checks: bool = False,
    as_json: bool = False,
    plugins: bool = True,
    verbose: bool = False,
) -> int:
    """Exit 0: no error; 1: an error finding. Bad input raises InputError(s)."""
    registry = load_checks(plugins)
    if list_checks:
        for spec in registry.checks.values():
            origin = "" if spec.origin == "sftdoctor" else f"  [{spec.origin}]"
            print(f"{spec.id:<22} {spec.phase:<11} {spec.summary}{origin}")
        return 0
    specs = registry.phase("preflight")
    if select is not None:
        wanted = [s.strip() for s in select.split(",") if s.strip()]
        if not wanted:
            raise InputError("--select", "expected check ids separated by commas; see `sftdoctor check --list`")
        for name in wanted:
            if name not in registry.checks:
                raise InputError(
                    "--select", f"no check {name!r}{did_you_mean(name, registry.checks)}; see `sftdoctor check --list`"
                )
        specs = registry.select(wanted)
    facts = Facts(inputs)
    launch_inputs.require(facts)  # what `train` refuses, refused here in its words
    findings, skipped = run_checks(specs, facts)
    findings = registry.problems + findings
    if as_json:
        render.render_json(findings, skipped, facts.collected())
    else:
        render.render_table(findings, skipped, verbose=verbose)
    return render.exit_code(findings)
