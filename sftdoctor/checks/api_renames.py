"""api-renames: installed trl / transformers / peft / accelerate releases where one still uses a name that the other
removed (the rename table, facts/renames.py), and requirements a library declares on another that the installed
one does not meet. Both fail at the first import or the first Trainer, before any GPU time is spent; the table says
which release to move to."""

from __future__ import annotations

from sftdoctor.checks import NotApplicable, check
from sftdoctor.facts.renames import ARGUMENT, IMPORT, PAIRS, RENAMES, STACK, Pair, Rename, broken_pairs
from sftdoctor.facts.requirements import requirement_on, satisfies
from sftdoctor.findings import error, ok, warning


@check(
    "api-renames",
    "installed trl/transformers/peft/accelerate pairs where one uses a name the other removed",
    messages={
        "removed-name": "a library uses a name that the installed release of another removed",
        "unmet-requirement": "a library's declared requirement on another is not met",
    },
)
def api_renames(packages: dict, package_requires: dict | None = None):
    installed = {name: packages.get(name) for name in STACK if packages.get(name)}
    if not installed:
        raise NotApplicable("none of trl, transformers, peft, accelerate is installed")
    found = [
        _broken(pair, consumer, provider, package_requires or {}) for pair, consumer, provider in broken_pairs(packages)
    ]
    found += _unmet(installed, package_requires)
    if found:
        return found
    versions = ", ".join(f"{name} {version}" for name, version in installed.items())
    unread = "" if package_requires else "; their declared requirements were not read"
    return ok(
        f"{versions}: none of the {len(PAIRS)} known broken pairs of the rename table",
        f"{len(RENAMES)} renames known; and each library's declared requirements on the others are met{unread}",
        evidence={"packages": installed},
    )


def _broken(pair: Pair, consumer_version: str, provider_version: str, requires: dict):
    row, consumer, provider = pair.rename, pair.consumer, pair.rename.library
    declared = requirement_on(requires.get(consumer, []), provider)
    spec = declared[0] if declared else None
    admits = (
        (
            f"; {consumer} {consumer_version} declares {provider}{spec or ' (no bound)'}, which admits "
            f"{provider} {provider_version}: pip does not stop this pair"
        )
        if declared is not None
        else ""
    )
    keep = ",".join(filter(None, [spec, f"<{row.removed}"]))
    title = (
        f"{consumer} {consumer_version} still uses {_what(row)}, which {provider} {row.removed} removed "
        f"({provider} {provider_version} is installed)"
    )
    detail = f"{pair.how}; it fails at once with `{raises(row)}`{admits}. Sources: {pair.source}; {row.source}"
    fix = (
        f"pip install '{consumer}>={pair.fixed_in}' (its first release without it), or keep {consumer} "
        f"{consumer_version} with pip install '{provider}{keep}'"
    )
    return error(
        title,
        detail,
        fix,
        evidence={
            "consumer": consumer,
            "consumer_version": consumer_version,
            "provider": provider,
            "provider_version": provider_version,
            "old": row.old,
            "new": row.replacement,
            "removed_in": row.removed,
            "fixed_in": pair.fixed_in,
            "declared": spec,
        },
        id="api-renames/removed-name",
    )


def _what(row: Rename) -> str:
    if row.kind == IMPORT:
        return f"`{row.old}` (imported from {row.owner})"
    return f"`{row.old}=` of {row.owner}" if row.kind == ARGUMENT else f"`{row.owner}.{row.old}`"


def raises(row: Rename) -> str:
    """The error the old name raises on a release that removed it, as Python words it."""
    if row.kind == IMPORT:
        return f"ImportError: cannot import name '{row.old}' from '{row.owner}'"
    if row.kind == ARGUMENT:
        return f"TypeError: {row.owner}.__init__() got an unexpected keyword argument '{row.old}'"
    return f"AttributeError: '{row.owner}' object has no attribute '{row.old}'"


def _unmet(installed: dict[str, str], requires: dict | None) -> list:
    """A library whose declared requirement on another is not met by the installed one (pip --no-deps, a later
    `pip install X==old`, a conda mix): the pair it was not released for."""
    found = []
    for consumer, lines in (requires or {}).items():
        for provider, version in installed.items():
            declared = requirement_on(lines, provider) if consumer in installed and provider != consumer else None
            if not declared or not declared[0] or satisfies(version, declared[0]) is not False:
                continue
            spec, extra = declared
            under = f" (in its `{extra}` extra)" if extra else ""
            found.append(
                warning(
                    f"{consumer} {installed[consumer]} requires {provider}{spec}{under}; "
                    f"{provider} {version} is installed",
                    f"{consumer} was not released for this {provider}: "
                    f"renamed or removed APIs between them fail at import "
                    f"or at the first Trainer (the rename table lists the ones known)",
                    f"pip install '{provider}{spec}', or the {consumer} release made for {provider} {version}",
                    evidence={
                        "consumer": consumer,
                        "consumer_version": installed[consumer],
                        "provider": provider,
                        "provider_version": version,
                        "declared": spec,
                        "extra": extra,
                    },
                    id="api-renames/unmet-requirement",
                )
            )
    return found
