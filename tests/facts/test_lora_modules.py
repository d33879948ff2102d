"""The lora_modules probe: a model's linear layers listed on the meta device in a child process, from a run
config with [lora] and the tiny example's model folder; extrapolated for deep stacks; failing soft; cached."""

import json
import shutil
import subprocess
import sys

import pytest
from conftest import EXAMPLES, FIXTURES

from sftdoctor.checks import load_checks, run_checks
from sftdoctor.facts import Facts, Inputs, lora_modules
from sftdoctor.facts.lora_modules import _listed, list_modules
from sftdoctor.facts.model_shape import MAX_BUILT_LAYERS
from sftdoctor.run.lora import adapter_parameters

TINY_MODEL = EXAMPLES / "tiny" / "model"
QWEN2_PATTERNS = [
    "lm_head",
    "model.layers.*.mlp.down_proj",
    "model.layers.*.mlp.gate_proj",
    "model.layers.*.mlp.up_proj",
    "model.layers.*.self_attn.k_proj",
    "model.layers.*.self_attn.o_proj",
    "model.layers.*.self_attn.q_proj",
    "model.layers.*.self_attn.v_proj",
]


def write_run(tmp_path, model, lora="[lora]\n"):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    path = tmp_path / "run.toml"
    path.write_text(
        f'[model]\npath = "{model}"\nweights = "random"\n[data]\ntrain = "d.jsonl"\n[training]\npacking = false\n{lora}'
    )  # no packing probe: only the layers' listing is built
    return path


def probed(config):
    return Facts(Inputs(config=config)).get("lora_modules")


def model_copy(tmp_path, **changes):
    folder = tmp_path / "model"
    shutil.copytree(TINY_MODEL, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("SFTDOCTOR_CACHE", str(folder))
    return folder


def kept(cache):
    return sorted((cache / "probes").glob("lora-modules-*.json")) if (cache / "probes").is_dir() else []


def no_child(*args):
    raise AssertionError("the probe ran its child process again")


def test_a_full_fine_tune_lists_nothing_and_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(lora_modules, "_child", no_child)
    facts = Facts(Inputs(config=write_run(tmp_path, TINY_MODEL, lora="")))
    assert facts.get("lora_modules") is None
    assert "no [lora]" in facts.why_missing("lora_modules")


def test_a_hub_id_without_a_local_config_lists_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(lora_modules, "_child", no_child)
    assert probed(write_run(tmp_path, "Qwen/Qwen2-0.5B")) is None


@pytest.mark.slow
def test_the_tiny_qwen2_is_listed_as_peft_will_see_it(tmp_path):
    found = probed(write_run(tmp_path, TINY_MODEL))
    assert [e["pattern"] for e in found["linear"]] == QWEN2_PATTERNS
    assert [e["pattern"] for e in found["linear"] if e["output"]] == ["lm_head"]
    shapes = {e["pattern"].rsplit(".", 1)[-1]: (e["count"], e["in"], e["out"]) for e in found["linear"]}
    assert shapes == {
        "lm_head": (1, 64, 384),
        "down_proj": (2, 192, 64),
        "gate_proj": (2, 64, 192),
        "up_proj": (2, 64, 192),
        "k_proj": (2, 64, 32),
        "o_proj": (2, 64, 64),
        "q_proj": (2, 64, 64),
        "v_proj": (2, 64, 32),
    }
    # per leaf name, over every layer: q_proj carries a bias in qwen2; lm_head is tied to embed_tokens
    assert (found["modules"]["q_proj"], found["modules"]["embed_tokens"], found["modules"]["lm_head"]) == (
        2 * (64 * 64 + 64),
        384 * 64,
        384 * 64,
    )
    assert found["parameters"] == 123_456 and found["model_type"] == "qwen2"
    listing = {k: v for k, v in found.items() if k != "adapters"}
    assert listing == json.loads((FIXTURES / "lora_modules" / "tiny_qwen2.json").read_text())
    # and what peft built for the run's [lora] (defaults: r 16 on all-linear): 7 layers x 2, as peft counts them
    adapters = found["adapters"]
    assert adapters["settings"]["r"] == 16 and adapters["unmatched"] == []
    assert adapters["trainable"] == 2 * 16 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 192) * 2 + (192 + 64))
    assert sorted(e["pattern"].rsplit(".", 1)[-1] for e in adapters["wrapped"]) == sorted(
        ["down_proj", "gate_proj", "up_proj", "k_proj", "o_proj", "q_proj", "v_proj"]
    )


@pytest.mark.slow
def test_the_second_probe_is_answered_from_the_cache_until_the_config_changes(tmp_path, cache, monkeypatch):
    folder = model_copy(tmp_path)
    config = write_run(tmp_path, folder)
    first = probed(config)
    assert "error" not in first and len(kept(cache)) == 1
    with monkeypatch.context() as patch:
        patch.setattr(lora_modules, "_child", no_child)
        assert probed(config) == first
    assert len(kept(cache)) == 1
    (folder / "config.json").write_text(
        json.dumps({**json.loads((folder / "config.json").read_text()), "num_hidden_layers": 3})
    )
    third = probed(config)
    assert {e["count"] for e in third["linear"] if not e["output"]} == {3}
    assert len(kept(cache)) == 2


@pytest.mark.slow
def test_a_config_json_without_model_type_is_an_error_fact_and_not_kept(tmp_path, cache):
    facts = Facts(Inputs(config=write_run(tmp_path, model_copy(tmp_path, model_type=None))))
    found = facts.get("lora_modules")
    assert set(found) == {"error"}
    assert found["error"] == "ValueError: config.json has no model_type naming the architecture"
    assert kept(cache) == []
    findings, skipped = run_checks(load_checks(plugins=False).select(["lora-targets"]), facts)
    assert [f.severity.value for f in findings] == ["warning"] and not skipped
    assert "could not be listed (ValueError: config.json has no model_type" in findings[0].title


@pytest.mark.slow
def test_an_unknown_architecture_is_an_error_fact(tmp_path, cache):
    found = probed(write_run(tmp_path, model_copy(tmp_path, model_type="not-a-model")))
    assert set(found) == {"error"} and "not-a-model" in found["error"]


@pytest.mark.slow
def test_the_tiny_example_through_check_reports_what_the_adapters_train(tmp_path):
    config = write_run(tmp_path, TINY_MODEL, lora='[lora]\nr = 8\ntarget_modules = ["q_proj", "v_proj"]\n')
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--config", str(config), "--select", "lora-targets", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    doc = json.loads(proc.stdout)
    [finding] = [f for f in doc["findings"] if f["id"] == "lora-targets"]
    assert finding["severity"] == "ok", finding
    assert finding["title"].startswith(f"adapters of rank 8 on 4 layers train {2 * 8 * (128 + 96):,} parameters")


# ---------------------------------------------------------------- deep stacks: extrapolated from 1 and 2 layers

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 320,
    "tie_word_embeddings": False,
}
GPT2 = {
    "model_type": "gpt2",
    "n_embd": 32,
    "n_head": 4,
    "vocab_size": 320,
    "n_positions": 64,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def write_config(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "config.json"


@pytest.mark.slow
@pytest.mark.parametrize("base, key", [(LLAMA, "num_hidden_layers"), (GPT2, "n_layer")])
def test_an_extrapolated_listing_is_exactly_the_built_one(tmp_path, base, key):
    config = {**base, key: 300}
    assert MAX_BUILT_LAYERS < 300
    built = _listed(config, str(tmp_path), False)
    extrapolated = list_modules(str(write_config(tmp_path, config)), False)
    assert extrapolated == built
    assert {e["count"] for e in built["linear"] if not e["output"]} == {300}


@pytest.mark.slow
def test_a_million_layers_are_listed_with_exact_counts(tmp_path):
    """Built layer by layer they would outlast the probe's timeout (no listing at all): extrapolated from two."""
    layers = 10**6
    config = write_run(tmp_path, write_config(tmp_path / "deep", {**LLAMA, "num_hidden_layers": layers}).parent)
    found = probed(config)
    h, i, kv, v = 64, 160, 64 // 4 * 2, 320
    assert {e["pattern"]: e["count"] for e in found["linear"]} == {
        "lm_head": 1,
        **{
            f"model.layers.*.{p}": layers
            for p in (
                "mlp.down_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
                "self_attn.k_proj",
                "self_attn.o_proj",
                "self_attn.q_proj",
                "self_attn.v_proj",
            )
        },
    }
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # attention, MLP, two RMSNorms
    assert found["parameters"] == v * h + layers * per_layer + h + v * h
    assert found["modules"]["q_proj"] == layers * h * h and found["modules"]["lm_head"] == v * h
    assert adapter_parameters(found, {"r": 8, "target_modules": ("q_proj",)}) == layers * 8 * (h + h)
