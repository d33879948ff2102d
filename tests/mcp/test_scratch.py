"""The server's scratch folder: where the probe cache, the datasets cache, transformers' remote code, matplotlib's
font cache and bytecode would be written, for as long as the server runs; then gone, and the variables as before."""

import os
import sys

from sftdoctor.mcp.scratch import redirected, scratch


def test_the_writes_go_to_the_scratch_folder_while_it_lives_and_nothing_stays(monkeypatch):
    monkeypatch.setenv("SFTDOCTOR_CACHE", "/somewhere/the/user/keeps/it")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    with scratch() as folder:
        assert folder.is_dir()
        for name in ("SFTDOCTOR_CACHE", "HF_DATASETS_CACHE", "HF_MODULES_CACHE", "MPLCONFIGDIR"):
            assert os.environ[name].startswith(str(folder) + os.sep), name
        assert os.environ["PYTHONDONTWRITEBYTECODE"] == "1" and sys.dont_write_bytecode
        (folder / "probes").mkdir()
        (folder / "probes" / "x.json").write_text("{}")
    assert not folder.exists()
    assert os.environ["SFTDOCTOR_CACHE"] == "/somewhere/the/user/keeps/it"
    assert "HF_DATASETS_CACHE" not in os.environ


def test_a_probe_cache_turned_off_stays_off(monkeypatch, tmp_path):
    monkeypatch.setenv("SFTDOCTOR_CACHE", "off")
    assert redirected(tmp_path)["SFTDOCTOR_CACHE"] == "off"
