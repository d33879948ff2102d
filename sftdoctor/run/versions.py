"""Package versions read as PEP 440 reads them (pip, and `packaging.version.Version`), without importing
`packaging` into the CLI (a light install does not have it): "v0.14.0" is 0.14.0, "2.13.0+cpu" is 2.13.0 with a
local label (after 2.13.0, before 2.13.1), 0.19.0rc1 and 0.19.0.dev0 come before 0.19.0, 0.18.4.post1 after it,
and an epoch ("1!0.1") outranks every version without one. A string PEP 440 does not read ("banana",
"0.14.0-23-gabc") has no key: whoever compares it cannot judge it, and says so.

The pattern and the ordering are packaging's (packaging/version.py, VERSION_PATTERN and _cmpkey, 26.x); a test
holds them to the installed packaging on generated versions.
"""

from __future__ import annotations

import re

_PATTERN = re.compile(
    r"""
    \s*v?
    (?a:
        (?:(?P<epoch>[0-9]+)!)?
        (?P<release>[0-9]+(?:\.[0-9]+)*)
        (?P<pre>[._-]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[._-]?(?P<pre_n>[0-9]+)?)?
        (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[._-]?(?P<post_l>post|rev|r)[._-]?(?P<post_n2>[0-9]+)?))?
        (?P<dev>[._-]?(?P<dev_l>dev)[._-]?(?P<dev_n>[0-9]+)?)?
    )
    (?a:\+(?P<local>[a-z0-9]+(?:[._-][a-z0-9]+)*))?
    \s*""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
DEV_ONLY, STABLE = -1, 3  # a dev release without pre or post sorts before its alphas; a final one after its rcs


def version_key(text: str | None) -> tuple | None:
    """A key that sorts versions as PEP 440 does; None for a string PEP 440 does not read."""
    match = _PATTERN.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return None
    try:
        release = tuple(int(part) for part in match["release"].split("."))
        epoch, pre_n = int(match["epoch"] or 0), int(match["pre_n"] or 0)
        post_n, dev_n = int(match["post_n1"] or match["post_n2"] or 0), int(match["dev_n"] or 0)
    except ValueError:  # a number of more digits than int() reads
        return None
    while release and release[-1] == 0:  # 1.0.0 == 1.0 == 1
        release = release[:-1]
    if match["pre_l"]:
        pre = (_PRE[match["pre_l"].lower()], pre_n)
    else:
        pre = (DEV_ONLY if match["dev"] and not match["post"] else STABLE, 0)
    suffix = (*pre, 1 if match["post"] else 0, post_n, 0 if match["dev"] else 1, dev_n)
    key = (epoch, release, suffix)
    if match["local"]:  # strings sort before numbers; a longer label after its prefix
        parts = re.split(r"[._-]", match["local"].lower())
        key += (tuple((int(p), "") if p.isdigit() else (-1, p) for p in parts),)
    return key


def in_range(version: str, first: str | None, fixed: str | None) -> bool | None:
    """Whether `version` is in [first, fixed) (None: an open end); None when `version` is not a PEP 440 version."""
    have = version_key(version)
    if have is None:
        return None
    return (first is None or have >= version_key(first)) and (fixed is None or have < version_key(fixed))


def at_least(version: str | None, release: str) -> bool | None:
    have = version_key(version)
    return None if have is None else have >= version_key(release)
