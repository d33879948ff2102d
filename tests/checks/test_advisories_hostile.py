"""known-bad-versions on versions that are not versions, and on valid ones in every spelling PEP 440 allows:
a version that cannot be read is "cannot judge", never "no known-bad release"; "v0.14.0" is 0.14.0; local
labels, pre-, dev- and post-releases and epochs fall where PEP 440 puts them in each advisory's range."""

import json

import pytest
from cli_contract import RUNNER, sftdoctor
from conftest import severities
from hostile import UNPARSEABLE_VERSIONS, no_hang
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import InvalidVersion, Version

from sftdoctor.checks.advisories import ADVISORIES
from sftdoctor.cli import main

CURRENT = {"deepspeed": "0.19.8", "transformers": "5.24.0", "liger-kernel": "0.8.5", "flash-attn": None}
TORCH = {"version": "2.13.0+cu128", "cuda": "12.8"}
ZERO2 = {
    "path": "ds.json",
    "config": {"zero_optimization": {"stage": 2, "overlap_comm": True}, "gradient_accumulation_steps": 4},
}


def flagged(findings):
    return sorted(f.evidence["advisory"] for f in findings if "advisory" in f.evidence)


@pytest.mark.parametrize("version", UNPARSEABLE_VERSIONS)
def test_a_version_pep440_cannot_read_is_not_judged_and_never_passes(run, version):
    findings = run(
        "known-bad-versions", packages={**CURRENT, "deepspeed": version}, torch_build=TORCH, deepspeed_config=ZERO2
    )
    try:
        Version(version)
    except InvalidVersion:
        [unjudged] = [f for f in findings if f.title.startswith("cannot judge deepspeed")]
        assert unjudged.severity.value == "warning"
        assert unjudged.title == f"cannot judge deepspeed {version!r}: not a version PEP 440 reads"
        assert not any(f"deepspeed {version}" in f.title for f in findings if f.severity.value == "ok")
    else:  # "v0.14.0", "0.14.0 ": spellings of 0.14.0, judged as it
        assert flagged(findings) == ["deepspeed-overlap-comm-zero12"]


def test_every_version_unreadable_is_a_warning_not_a_pass(run):
    findings = run("known-bad-versions", packages={"deepspeed": "banana", "transformers": "latest"}, torch_build=TORCH)
    assert severities(findings) == ["warning", "warning"]
    assert [f.title for f in findings] == [
        "cannot judge deepspeed 'banana': not a version PEP 440 reads",
        "cannot judge transformers 'latest': not a version PEP 440 reads",
    ]


@pytest.mark.parametrize(
    "version, expected",
    [
        ("v0.14.0", ["deepspeed-overlap-comm-zero12"]),  # a leading v: 0.14.0, before the fix
        ("0.18.3+cpu", ["deepspeed-accumulation-scaled-twice", "deepspeed-overlap-comm-zero12"]),  # local: still 0.18.3
        ("0.18.3rc1", ["deepspeed-overlap-comm-zero12"]),  # before 0.18.3: not in [0.18.3, 0.18.4)
        ("0.18.3.dev0", ["deepspeed-overlap-comm-zero12"]),
        ("0.18.3.post1", ["deepspeed-accumulation-scaled-twice", "deepspeed-overlap-comm-zero12"]),
        ("0.18.4.dev0", ["deepspeed-accumulation-scaled-twice", "deepspeed-overlap-comm-zero12"]),  # before 0.18.4
        ("0.19.0rc1", ["deepspeed-overlap-comm-zero12"]),  # before the fixed 0.19.0
        ("0.19.0.dev0", ["deepspeed-overlap-comm-zero12"]),
        ("0.19.0+cpu", []),
        ("0.19.0.post1", []),
        ("1!0.1", []),  # an epoch outranks every 0.x
    ],
)
def test_deepspeed_releases_fall_where_pep440_puts_them(run, version, expected):
    findings = run(
        "known-bad-versions", packages={**CURRENT, "deepspeed": version}, torch_build=TORCH, deepspeed_config=ZERO2
    )
    assert flagged(findings) == expected


@pytest.mark.parametrize(
    "version, expected",
    [
        ("1!4.45.0", []),  # epoch 1: after every 4.x, so after both fixes (read as 1 > 4.46 before)
        ("4.46.0.dev0", ["transformers-accumulation-loss"]),  # a dev release of 4.46.0 comes before it
        ("4.48.1rc1", ["transformers-accumulation-kwargs"]),
        ("4.48.1+local", []),
        ("V4.47.1", ["transformers-accumulation-kwargs"]),
    ],
)
def test_transformers_releases_fall_where_pep440_puts_them(run, version, expected):
    findings = run(
        "known-bad-versions", packages={**CURRENT, "transformers": version}, torch_build=TORCH, deepspeed_config=ZERO2
    )
    assert flagged(findings) == expected


# ---------------------------------------------------------------- the CLI on replayed snapshots

ODD_VALID = [
    "v0.14.0",
    "V0.18.3",
    "0.18.3+cpu",
    "0.18.3rc1",
    "0.18.3.dev0",
    "0.18.3.post1",
    "0.18.3-1",
    "1!0.1",
    "0.19.0rc1",
    "0.19.0.dev0",
    "0.18.4",
    "0.12.6",
    "4.46.0.dev0",
    "4.45.2+local",
    "4.48.1",
    "4.48.1rc1",
    "4.47.1",
    " 4.47.1 ",
    "5.24.0",
    "0.4.1.dev0",
    "0.3.0",
    "0.4.1",
    "0.8.5",
    "2.3.4+cu122",
]
VERSION = st.sampled_from(UNPARSEABLE_VERSIONS + ODD_VALID) | st.none()
PACKAGES = ("deepspeed", "transformers", "liger-kernel", "flash-attn")


def pep440(text):
    try:
        return Version(text)
    except InvalidVersion:
        return None


def expected_hits(versions: dict) -> set[str]:
    """The advisories that may hit a run on torch 2.13 whose settings are unknown (no run config, no DeepSpeed JSON:
    each is an info that cannot tell), from packaging's own reading of each version. Liger's needs transformers
    4.46 or newer; flash-attn's needs a wheel URL, and none is recorded."""
    found = set()
    for advisory in ADVISORIES:
        have = pep440(versions.get(advisory.package)) if versions.get(advisory.package) is not None else None
        first, fixed = (Version(v) if v else None for v in advisory.affected)
        if have is None or advisory.id == "flash-attn-wheel-torch":
            continue
        if (first is None or have >= first) and (fixed is None or have < fixed):
            transformers = pep440(versions.get("transformers") or "")
            if advisory.id == "liger-kernel-accumulation" and transformers and transformers < Version("4.46"):
                continue
            found.add(advisory.id)
    return found


@pytest.fixture(scope="module")
def snapshot():
    result = RUNNER.invoke(main, ["facts"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow  # about 0.5 s a command line (a DeepSpeed JSON would cost seconds more: DeepSpeed reads it)
@given(versions=st.fixed_dictionaries({name: VERSION for name in PACKAGES}))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_check_on_a_snapshot_never_passes_a_version_it_cannot_read(tmp_path_factory, snapshot, versions):
    root = tmp_path_factory.mktemp("advisories")
    snap = json.loads(json.dumps(snapshot))
    snap["facts"]["packages"].update(versions)
    snap["facts"]["torch_build"] = {**TORCH, "version": "2.13.0+cpu"}
    (root / "snap.json").write_text(json.dumps(snap))
    with no_hang(30):
        result = sftdoctor(
            ["check", "--json", "--facts", root / "snap.json", "--select", "known-bad-versions"],
            root,
            [root / "snap.json"],
        )
    assert result.exit_code == 0, result.stdout
    findings = json.loads(result.stdout)["findings"]
    unreadable = {n: v for n, v in versions.items() if v is not None and pep440(v) is None}
    judged = {n: v for n, v in versions.items() if v is not None and n not in unreadable}
    titles = [f["title"] for f in findings]
    for name, version in unreadable.items():
        assert f"cannot judge {name} {version!r}: not a version PEP 440 reads" in titles, titles
    passed = [f["title"] for f in findings if f["severity"] == "ok"]
    assert not any(f"{n} {v}" in t for t in passed for n, v in unreadable.items()), passed
    if passed:  # it lists what it judged, and only that
        assert not expected_hits(versions) and not unreadable
        assert all(f"{n} {v}" in passed[0] for n, v in judged.items()), passed
    assert {f["evidence"]["advisory"] for f in findings if "advisory" in f["evidence"]} == expected_hits(versions)
