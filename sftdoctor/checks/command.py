"""`sftdoctor check`: the preflight checks on this machine (or a replayed one) and the given configs."""

from __future__ import annotations

from sftdoctor import render
from sftdoctor.checks import CheckSpec, Registry, Skipped, known_ids, load_checks, run_checks, silence, to_silence
from sftdoctor.errors import InputError
from sftdoctor.facts import Facts, Inputs, launch_inputs
from sftdoctor.findings import Finding, Severity, info, ok


def main(
    inputs: Inputs,
    select: str | None = None,
    list_checks: bool = False,
    as_json: bool = False,
    plugins: bool = True,
    verbose: bool = False,
    disable: tuple[str, ...] = (),
) -> int:
    """Exit 0: no error (silenced ones aside); 1: an error finding. Bad input raises InputError(s)."""
    registry = load_checks(plugins)
    if list_checks:
        show_list(registry)
        return 0
    findings, skipped, facts = judged(registry, inputs, select, disable)
    if as_json:
        render.render_json(findings, skipped, facts.collected())
    else:
        render.render_table(findings, skipped, verbose=verbose)
    return render.exit_code(findings)


def json_text(
    inputs: Inputs, select: str | None = None, plugins: bool = True, disable: tuple[str, ...] = ()
) -> tuple[str, int]:
    """What `check --json` prints, and its exit code (for `sftdoctor mcp`, which prints nothing)."""
    findings, skipped, facts = judged(load_checks(plugins), inputs, select, disable)
    return render.json_text(findings, skipped, facts.collected()), render.exit_code(findings)


def judged(
    registry: Registry, inputs: Inputs, select: str | None, disable: tuple[str, ...]
) -> tuple[list[Finding], list[Skipped], Facts]:
    """The preflight checks (or --select's) on the facts of `inputs`, silenced as --disable and the config say."""
    specs, only = registry.phase("preflight"), {}
    if select is not None:
        specs, only = selection(registry, select)
    facts = Facts(inputs)
    launch_inputs.require(facts)  # what `train` refuses, refused here in its words
    silenced = to_silence(registry, disable, facts)  # with the config's [checks] disable, as train's gate
    findings, skipped = run_checks(specs, facts)
    return registry.problems + silence(of_messages(registry, findings, skipped, only), silenced), skipped, facts


def selection(registry: Registry, select: str) -> tuple[list[CheckSpec], dict[str, set[str]]]:
    """--select's checks, and for each named only by messages (CHECK/slug), the message ids to show of it; a
    message id is checked as --disable's are (a did-you-mean), a check id as before (a refused one says why)."""
    wanted = [s.strip() for s in select.split(",") if s.strip()]
    if not wanted:
        raise InputError("--select", "expected check or message ids separated by commas; see `sftdoctor check --list`")
    for name in wanted:
        if "/" not in name and name not in registry.checks:
            raise InputError("--select", registry.not_a_check(name))
    known_ids(registry, [name for name in wanted if "/" in name], "--select")
    checks = list(dict.fromkeys(name.partition("/")[0] for name in wanted))
    only: dict[str, set[str]] = {}
    for name in wanted:
        if "/" in name and name.partition("/")[0] not in wanted:
            only.setdefault(name.partition("/")[0], set()).add(name)
    return registry.select(checks), only


def of_messages(
    registry: Registry, findings: list[Finding], skipped: list[Skipped], only: dict[str, set[str]]
) -> list[Finding]:
    """Of a check selected by its messages, only theirs (and an error of the whole check, as a crash: never
    hidden); a selected message the check ran and did not report is said, so that the check is seen to have run."""
    kept = [
        f
        for f in findings
        if f.id in only.get(f.id.partition("/")[0], {f.id}) or (f.id in only and f.severity is Severity.ERROR)
    ]
    said, idle = {f.id for f in kept}, {s.id for s in skipped}
    for name, ids in only.items():
        spec = registry.checks[name]
        if name not in idle and name not in said:
            kept += [_not_said(spec, i, findings) for i in sorted(ids - said)]
    return kept


def _not_said(spec, message: str, findings: list[Finding]) -> Finding:
    """✓ for a selected message its check ran and did not say, unless the check said an info of another of its
    messages (how a check says what it could not judge): then the message is not judged apart, never ✓."""
    what = spec.messages[message.partition("/")[2]]
    notes = sorted({f.id for f in findings if f.id.partition("/")[0] == spec.id and f.severity is Severity.INFO})
    if notes:
        return info(
            f"not judged apart: {what}; the check also said {', '.join(notes)}",
            fix=f"`sftdoctor check --select {spec.id}` shows what it said",
            id=message,
            explain=spec.explain,
        )
    return ok(f"checked, not found: {what}", id=message, explain=spec.explain)


def show_list(registry: Registry) -> None:
    """Every check, its messages (the ids --disable takes) under it, then the plugins' refused checks and why."""
    for spec in registry.checks.values():
        origin = "" if spec.origin == "sftdoctor" else f"  [{spec.origin}]"
        print(f"{spec.id:<22} {spec.phase:<11} {spec.summary}{origin}")
        for slug, said in spec.messages.items():
            print(f"  {spec.id}/{slug}: {said}")
    for name, refused in registry.refused.items():
        print(f"{name:<22} {'refused':<11} {refused.why}  [{refused.spec.origin}]")
