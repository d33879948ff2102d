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


def test_direct_urls_agree_with_importlib(tmp_path, monkeypatch):
    """PEP 610: pip records the URL it installed a wheel from; the flash-attn advisory reads the wheel's name."""
    import json

    from sftdoctor.facts import distributions

    url = (
        "https://github.com/Dao-AILab/flash-attention/releases/download/v2.3.4/"
        "flash_attn-2.3.4%2Bcu122torch2.1cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"
    )
    info = tmp_path / "flash_attn-2.3.4.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.3.4\n\n")
    (info / "direct_url.json").write_text(json.dumps({"url": url, "archive_info": {}}))
    monkeypatch.syspath_prepend(str(tmp_path))
    distributions._metadata_dirs.cache_clear()
    try:
        [dist] = importlib.metadata.distributions(path=[str(tmp_path)])
        assert distributions.direct_url("flash-attn") == json.loads(dist.read_text("direct_url.json"))["url"] == url
        assert distributions.direct_url("surely-not-installed-anywhere") is None
        (info / "direct_url.json").write_text("{not json")
        assert distributions.direct_url("flash-attn") is None
    finally:
        distributions._metadata_dirs.cache_clear()
