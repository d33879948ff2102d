"""The token-id scan (facts/token_ids.py) on real tokenizers and real rows: the tiny example's byte-level BPE,
grown by added tokens or given a config.json whose vocab_size is smaller than its ids. Every proof it uses instead
of tokenizing is checked against tokenizing every row."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLES

from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.token_ids import probe_token_ids, scan, scan_full

TINY = EXAMPLES / "tiny" / "model"


def chat(user, answer="ok", system=None):
    turns = [{"role": "system", "content": system}] if system else []
    return {"messages": turns + [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def make(tmp_path, rows, vocab=384, added=(), special=None, template=None, tokenizer_edit=None):
    """A run folder: the tiny model (config.json vocab_size = `vocab`), its tokenizer grown by `added` tokens (and
    `special` tokens), optionally another chat template; the rows; run.toml."""
    from transformers import AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(TINY, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": vocab}))
    if added or special or template or tokenizer_edit:
        tokenizer = AutoTokenizer.from_pretrained(model)
        if added:
            tokenizer.add_tokens(list(added))
        if special:
            tokenizer.add_special_tokens(special)
        if template:
            tokenizer.chat_template = template
        if tokenizer_edit:
            tokenizer_edit(tokenizer)
        tokenizer.save_pretrained(model)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    (tmp_path / "run.toml").write_text(
        '[model]\npath = "model"\nweights = "random"\n[data]\ntrain = "train.jsonl"\n'
        "[training]\nglobal_batch_size = 2\nper_device_batch_size = 2\n"
        "packing = false\n"
    )
    return tmp_path / "run.toml"


def request(config: Path) -> dict:
    facts = Facts(Inputs(config=config))
    plan = facts.get("plan")
    return {
        "plan": plan.to_json(),
        "vocab_size": facts.get("model_config")["vocab_size"],
        "files": [str(config.parent / "train.jsonl")],
    }


def both(config: Path):
    """The scan as it runs, and the same rows tokenized one by one: the proof must agree with the tokenizer."""
    asked = request(config)
    fast, full = scan(asked), scan_full(asked, 0.0)
    assert (fast["rows_out_of_range"], fast["found"], fast["largest_id"]) == (
        full["rows_out_of_range"],
        full["found"],
        full["largest_id"],
    )
    assert [e["where"] for e in fast["examples"]] == [e["where"] for e in full["examples"]]
    return fast


def test_a_tokenizer_whose_ids_all_fit_proves_every_row_fits_without_reading_them(tmp_path):
    found = scan(request(make(tmp_path, [chat("reverse: red cat")])))
    assert (found["mode"], found["rows"], found["rows_out_of_range"], found["tokenizer_size"]) == ("none", None, 0, 384)
    assert found["specials_out_of_range"] == {}


def test_an_added_token_past_the_embedding_is_found_in_the_rows_that_hold_it(tmp_path):
    rows = [chat("reverse: red cat"), chat("call <tool> now"), chat("no tool", "<tool>sun</tool>"), chat("x<tool")]
    found = both(make(tmp_path, rows, added=["<tool>", "</tool>"]))
    assert found["mode"] == "added" and found["tokenizer_size"] == 386
    assert (found["rows"], found["rows_out_of_range"], found["largest_id"]) == (4, 2, 385)
    assert found["found"] == {"<tool>": 2, "</tool>": 1} and found["largest_token"] == "</tool>"
    assert [(e["where"], e["confirmed"]) for e in found["examples"]] == [
        ("train.jsonl line 2", True),
        ("train.jsonl line 3", True),
    ]


def test_a_token_the_chat_template_writes_is_in_every_row_of_that_shape(tmp_path):
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}<|sys|>{% endif %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    rows = [chat("a"), chat("b", system="be brief"), chat("c"), chat("d", system="terse")]
    found = both(make(tmp_path, rows, special={"additional_special_tokens": ["<|sys|>"]}, template=template))
    assert found["mode"] == "added" and found["rows_out_of_range"] == 2
    assert found["around_content"] == {"<|sys|>": 2} and found["found"] == {"<|sys|>": 2}


def test_a_normalized_token_is_found_in_the_normalized_text(tmp_path):
    """NFC composes 'e' + U+0301 into 'é': the token 'café' (normalized) is in the text 'cafe\\u0301'."""
    rows = [chat("un cafe\u0301 noir"), chat("un café"), chat("cafe seul")]
    found = both(make(tmp_path, rows, added=["café"]))
    assert found["mode"] == "added" and found["rows_out_of_range"] == 2


def test_text_rows_hold_the_eos_the_trainer_appends(tmp_path):
    """TRL appends the EOS token to text rows: an EOS past the embedding is in every one of them."""
    rows = [{"text": "reverse: red cat\ncat red"}, {"text": "sort: b a\na b"}]

    def eos(tokenizer):
        tokenizer.add_special_tokens({"eos_token": "<|end|>"})

    found = both(make(tmp_path, rows, tokenizer_edit=eos))
    assert found["rows_out_of_range"] == 2 and found["found"] == {"<|end|>": 2}
    assert found["specials_out_of_range"] == {"eos": 384}


def test_a_pad_token_added_past_the_embedding_is_named(tmp_path):
    found = scan(request(make(tmp_path, [chat("a")], special={"pad_token": "[PAD]"})))
    assert found["specials_out_of_range"] == {"pad": 384} and found["rows_out_of_range"] == 0


def test_a_config_smaller_than_the_tokenizer_tokenizes_every_row(tmp_path):
    """Not added tokens: the tokenizer's own vocabulary is larger than the embedding (another model's tokenizer)."""
    rows = [chat("reverse: red cat"), chat("a")]
    found = scan(request(make(tmp_path, rows, vocab=300)))
    assert found["mode"] == "full" and found["vocabulary_past_vocab"] == 84
    assert found["rows_out_of_range"] == 1 and found["largest_id"] >= 300  # "a" / "ok" are ids below 300
    assert [e["where"] for e in found["examples"]] == ["train.jsonl line 1"]


def test_a_row_the_template_refuses_is_counted(tmp_path):
    template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    rows = [chat("a <x>"), {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]}]
    found = scan(request(make(tmp_path, rows, added=["<x>"], template=template)))
    assert found["refused_rows"] == 1 and found["refused"][0]["where"] == "train.jsonl line 2"
    assert "no tools" in found["refused"][0]["error"]


def test_the_probe_runs_in_a_child_and_its_answer_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("SFTDOCTOR_CACHE", str(tmp_path / "cache"))
    config = make(tmp_path, [chat("call <tool>")], added=["<tool>"])
    facts = Facts(Inputs(config=config))
    first = probe_token_ids(facts)
    assert first["rows_out_of_range"] == 1
    assert len(list((tmp_path / "cache" / "probes").glob("token-ids-*.json"))) == 1
    (tmp_path / "train.jsonl").write_text(json.dumps(chat("no tool here")) + "\n")  # new content: a new answer
    assert probe_token_ids(Facts(Inputs(config=config)))["rows_out_of_range"] == 0


@pytest.mark.parametrize("missing", ["vocab_size", "tokenizer"])
def test_without_a_vocab_size_or_tokenizer_files_there_is_nothing_to_scan(tmp_path, missing):
    config = make(tmp_path, [chat("a")])
    if missing == "vocab_size":
        path = tmp_path / "model" / "config.json"
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "vocab_size"}))
        assert probe_token_ids(Facts(Inputs(config=config))) is None
    else:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (tmp_path / "model" / name).unlink()
        assert probe_token_ids(Facts(Inputs(config=config))) is None


def test_a_token_a_json_writer_escaped_is_still_found(tmp_path):
    """JSON may escape any character: '<' as \\u003c (Go's encoder does), '/' as \\/. The row's text is the same."""
    config = make(tmp_path, [chat("a")], added=["<tool>", "</tool>"])
    (tmp_path / "train.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "call \\u003ctool>"}, {"role": "assistant", "content": "ok"}]}\n'
        '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "<\\/tool>"}]}\n'
        '{"messages": [{"role": "user", "content": "tool"}, {"role": "assistant", "content": "no"}]}\n'
    )
    found = both(config)
    assert found["rows_out_of_range"] == 2 and found["found"] == {"<tool>": 1, "</tool>": 1}
