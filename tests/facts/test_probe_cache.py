import json

import pytest

from sftdoctor.facts import probe_cache
from sftdoctor.facts.probe_cache import cached, folder_files


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SFTDOCTOR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def counting(result):
    calls = []

    def compute():
        calls.append(1)
        return result

    return compute, calls


def test_the_same_request_over_the_same_content_is_answered_from_disk(tmp_path, cache):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text('{"x": 1}')
    b.write_text('{"x": 1}')  # another path, same content: a test's or a copied run's folder
    compute, calls = counting({"isolated": True})
    assert cached("packing", {"attn": "sdpa"}, [a], compute) == {"isolated": True}
    assert cached("packing", {"attn": "sdpa"}, [b], compute) == {"isolated": True}
    assert len(calls) == 1
    assert [p.suffix for p in (cache / "probes").iterdir()] == [".json"]  # no temporary file left


def test_changed_content_request_or_kind_is_probed_again(tmp_path, cache):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a"}\n')
    compute, calls = counting({"samples": []})
    cached("targets", {"max_length": 8}, [data], compute)
    data.write_text('{"text": "b"}\n')
    cached("targets", {"max_length": 8}, [data], compute)
    cached("targets", {"max_length": 16}, [data], compute)
    cached("packing", {"max_length": 16}, [data], compute)
    assert len(calls) == 4


def test_a_failed_probe_is_not_kept(tmp_path, cache):
    compute, calls = counting({"error": "the probe failed: ImportError"})
    for _ in range(2):
        assert cached("targets", {}, [], compute)["error"].startswith("the probe failed")
    assert len(calls) == 2


def test_off_or_an_unwritable_folder_still_answers(tmp_path, monkeypatch):
    compute, calls = counting({"isolated": True})
    monkeypatch.setenv("SFTDOCTOR_CACHE", "off")
    assert cached("packing", {}, [], compute) == {"isolated": True}
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SFTDOCTOR_CACHE", str(blocker / "cache"))  # under a file: cannot be made
    assert cached("packing", {}, [], compute) == {"isolated": True}
    assert cached("packing", {}, [], compute) == {"isolated": True}
    assert len(calls) == 3


def test_a_corrupt_entry_is_probed_again(tmp_path, cache):
    compute, calls = counting({"isolated": True})
    cached("packing", {}, [], compute)
    (entry,) = (cache / "probes").iterdir()
    entry.write_text('{"isolated": tr')  # cut short by a full disk
    assert cached("packing", {}, [], compute) == {"isolated": True}
    assert len(calls) == 2
    assert json.loads(entry.read_text()) == {"isolated": True}


def test_folder_files_leave_weights_out(tmp_path):
    for name in ("config.json", "tokenizer.json", "model.safetensors", "pytorch_model.bin", "modeling_x.py"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in folder_files(tmp_path)] == ["config.json", "modeling_x.py", "tokenizer.json"]
    assert folder_files(tmp_path / "missing") == [] and folder_files(None) == []


def test_the_default_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SFTDOCTOR_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert probe_cache.cache_dir() == tmp_path / "sftdoctor"
