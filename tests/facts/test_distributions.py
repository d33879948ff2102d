"""The fast metadata reader agrees with importlib.metadata on everything installed here."""

import importlib.metadata

from sftdoctor.facts.distributions import entry_points, normalize, version


def test_versions_agree_with_importlib_for_every_installed_distribution():
    dists = list(importlib.metadata.distributions())
    assert len(dists) > 50  # the training stack is installed: this compares real data
    seen = set()
    for dist in dists:
        name = normalize(dist.metadata["Name"])
        if name in seen:
            continue  # shadowed copies further down sys.path: the first one wins in both
        seen.add(name)
        assert version(dist.metadata["Name"]) == importlib.metadata.version(dist.metadata["Name"]), name


def test_names_are_matched_as_pep_503_says():
    assert version("Flash_Attn") == version("flash-attn")
    assert version("NVIDIA-ML-PY") == importlib.metadata.version("nvidia-ml-py")
    assert version("surely-not-installed-anywhere") is None


def test_entry_points_agree_with_importlib():
    ours = sorted((name, value) for name, value, _ in entry_points("console_scripts"))
    theirs = sorted((ep.name, ep.value) for ep in importlib.metadata.entry_points(group="console_scripts"))
    assert ours == theirs and ("sftdoctor", "sftdoctor.cli:main") in ours


def test_direct_urls_agree_with_importlib_and_an_editable_install_has_one():
    """PEP 610: pip records where it installed from when given a file, a link or a folder (sftdoctor's -e)."""
    import json

    from sftdoctor.facts.distributions import direct_url

    seen = set()
    for dist in importlib.metadata.distributions():
        name = normalize(dist.metadata["Name"])
        if name in seen:
            continue
        seen.add(name)
        text = dist.read_text("direct_url.json")
        assert direct_url(name) == (json.loads(text)["url"] if text else None), name
    assert direct_url("sftdoctor").startswith("file://")
