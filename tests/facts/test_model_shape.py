"""The model-shape probe (facts/model_shape.py): the closed form in this process for Llama/Qwen, the meta-device
count in a child process for other families only where there are GPUs, and errors as facts, never crashes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, NO_GPU, index, recorded_gpus

from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.configs import summarize_model_config
from sftdoctor.facts.model_shape import count_on_meta_device, probe_model_shape, shape_in_child

ROOT = Path(__file__).resolve().parents[2]
MODELS = FIXTURES / "model_config"
H100X8 = "h100_sxm_8x_driver550_modal_glossary.txt"
CLOSED_FORM = [e["file"] for e in index("model_config") if e["model_type"] in ("llama", "qwen2")]
# Parameter counts as published on the models' cards / as transformers builds them.
PUBLISHED = {
    "Meta-Llama-3-8B.json": 8_030_261_248,
    "Llama-2-7b-chat-hf.json": 6_738_415_616,
    "Llama-3.2-1B.json": 1_235_814_400,
    "Qwen2-0.5B.json": 494_032_768,
    "TinyLlama-1.1B-Chat-v1.0_resaved_dtype_float32.json": 1_100_048_384,
    "SmolLM2-135M_merged_transformers5_bfloat16.json": 134_515_008,
}


def summary(path: Path) -> dict:
    return summarize_model_config(path, json.loads(path.read_text(encoding="utf-8")))


def facts(path: Path, gpus: dict | None) -> Facts:
    recorded = {"model_config": summary(path)}
    if gpus is not None:
        recorded["gpus"] = gpus
    return Facts.replay(recorded)


def child_command(request: str) -> subprocess.CompletedProcess:
    """The child's side of facts/child.py: the config as JSON on stdin, one JSON object out."""
    return subprocess.run(
        [sys.executable, "-m", "sftdoctor.facts.model_shape"],
        input=request,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


# ---------------------------------------------------------------- closed form, in process


@pytest.mark.parametrize("name", CLOSED_FORM)
@pytest.mark.parametrize("gpus", ["none", "8x H100"])
def test_llama_and_qwen_configs_are_counted_in_closed_form_with_or_without_gpus(name, gpus):
    shape = probe_model_shape(facts(MODELS / name, None if gpus == "none" else recorded_gpus(H100X8)))
    assert shape["counted_by"] == "closed form"  # a child's count would say "meta device"
    assert shape["model_type"] == json.loads((MODELS / name).read_text())["model_type"]
    if name in PUBLISHED:
        assert shape["parameters"] == PUBLISHED[name]


def test_the_closed_form_needs_neither_torch_nor_a_child_process():
    code = (
        "import json, sys, subprocess\n"
        "from sftdoctor.facts import Facts\n"
        "from sftdoctor.facts.model_shape import probe_model_shape\n"
        "from sftdoctor.facts.configs import summarize_model_config\n"
        "def no_child(*a, **k): raise AssertionError('a child process was started')\n"
        "subprocess.Popen = subprocess.run = no_child\n"
        "p = sys.argv[1]\n"
        "gpus = {'devices': [{'name': 'NVIDIA H100', 'compute_capability': '9.0', 'memory_total_mib': 81559}]}\n"
        "shape = probe_model_shape(Facts.replay({'gpus': gpus,"
        " 'model_config': summarize_model_config(p, json.load(open(p)))}))\n"
        "print(json.dumps({'parameters': shape['parameters'], 'torch': 'torch' in sys.modules,"
        " 'transformers': 'transformers' in sys.modules}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(MODELS / "Meta-Llama-3-8B.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"parameters": 8_030_261_248, "torch": False, "transformers": False}


# ---------------------------------------------------------------- other families without GPUs


@pytest.mark.parametrize(
    "name",
    [
        "gpt2.json",
        "gpt2-large.json",
        "phi-2.json",
        "Phi-3-mini_merged_dtype_float16.json",
        "llava-1.5-7b-hf.json",
        "clip_DeepSpeed-VisualChat_qwen_clip.json",
    ],
)
@pytest.mark.parametrize("gpus", ["not probed", "no GPU"])
def test_other_families_are_not_counted_without_gpus(name, gpus):
    shape = probe_model_shape(facts(MODELS / name, None if gpus == "not probed" else NO_GPU))
    assert shape is None or isinstance(shape.get("error"), str)


def test_the_fact_says_why_it_is_missing_for_another_family_without_gpus():
    # a CPU box's recorded GPU facts, and a model config given now: the shape is computed from it, not replayed
    unavailable = Facts.replay({"gpus": NO_GPU}, Inputs(model_config=MODELS / "phi-2.json"))
    assert unavailable.get("model_config")["model_type"] == "phi"
    assert unavailable.get("model_shape") is None
    assert "only where there are GPUs" in unavailable.why_missing("model_shape")


def test_no_model_config_means_no_shape():
    assert probe_model_shape(Facts.replay({"gpus": recorded_gpus(H100X8)})) is None
    assert probe_model_shape(Facts.replay({"model_config": {"path": "x", "config": None}})) is None


# ---------------------------------------------------------------- other families with GPUs: the child process


@pytest.mark.slow
def test_the_child_prints_the_meta_device_count_of_gpt2():
    proc = child_command((MODELS / "gpt2.json").read_text())
    params, largest = count_on_meta_device(json.loads((MODELS / "gpt2.json").read_text()))
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"parameters": params, "largest": largest}
    assert params == 124_439_808  # GPT-2 small, tied embeddings counted once


@pytest.mark.slow
def test_phi_2_is_counted_on_the_meta_device_in_a_child_where_there_are_gpus():
    path = MODELS / "phi-2.json"
    shape = probe_model_shape(facts(path, recorded_gpus(H100X8)))
    params, largest = count_on_meta_device(json.loads(path.read_text()))
    assert shape["counted_by"] == "meta device"
    assert (shape["parameters"], shape["largest_layer"]) == (params, largest) == (2_779_683_840, 131_072_000)
    assert (shape["hidden"], shape["layers"], shape["heads"]) == (2560, 32, 32)


@pytest.mark.slow
def test_gpt2_is_counted_in_a_child_where_there_are_gpus():
    path = MODELS / "gpt2.json"
    shape = probe_model_shape(facts(path, recorded_gpus(H100X8)))
    params, _ = count_on_meta_device(json.loads(path.read_text()))
    assert "parameters" in shape, shape
    assert shape["parameters"] == params and shape["counted_by"] == "meta device"


# ---------------------------------------------------------------- broken configs: errors, not crashes


def test_counting_a_config_without_model_type_is_a_value_error():
    with pytest.raises(ValueError, match="no model_type"):
        count_on_meta_device({"hidden_size": 16})


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"model_type": "gpt2", "n_embd": 768,', "not valid JSON"),  # fails before torch is imported: quick
        ('{"model_type": "gpt2", "n_embd": NaN}', "n_embd: expected a finite number, got NaN"),
        pytest.param('{"n_embd": 768}', "no model_type", marks=pytest.mark.slow),
        pytest.param('{"model_type": "not-a-real-architecture"}', "not-a-real-architecture", marks=pytest.mark.slow),
    ],
)
def test_a_broken_config_json_gives_an_error_string(tmp_path, text, says):
    path = tmp_path / "config.json"
    path.write_text(text)
    shape, why = shape_in_child(str(path))
    assert shape is None
    assert isinstance(why, str) and says in why


@pytest.mark.slow
def test_the_probe_reports_a_child_failure_as_an_error_fact(tmp_path):
    path = tmp_path / "config.json"
    config = {"model_type": "not-a-real-architecture", "hidden_size": 64}
    path.write_text(json.dumps(config))
    shape = probe_model_shape(
        Facts.replay({"gpus": recorded_gpus(H100X8), "model_config": summarize_model_config(path, config)})
    )
    assert set(shape) == {"error"} and "not-a-real-architecture" in shape["error"]


def test_a_missing_config_json_gives_an_error_string():
    missing = ROOT / "no-such-folder" / "config.json"
    shape, why = shape_in_child(str(missing))
    assert shape is None and why == "model config.json not found"
    proc = child_command("{not json")
    assert proc.returncode == 0 and set(json.loads(proc.stdout)) == {"error"}


def test_ten_million_layers_are_counted_from_two_in_a_moment_and_exactly(monkeypatch):
    """Found by tests/test_cli_fuzz.py: a non-gated family (GPT-2) of 10^7 layers took 300 s and 4 GB."""
    from sftdoctor.facts import model_shape

    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 128, "n_positions": 64}
    deep = {**gpt2, "n_layer": 9}
    built = model_shape._count(deep)
    monkeypatch.setattr(model_shape, "MAX_BUILT_LAYERS", 8)
    assert count_on_meta_device(deep) == built  # the extrapolation is exact for a uniform stack
    counted, real = [], model_shape._count
    monkeypatch.setattr(model_shape, "_count", lambda config: counted.append(config["n_layer"]) or real(config))
    params, _ = count_on_meta_device({**gpt2, "n_layer": 10**7})
    assert counted == [1, 2]  # two small models built, not ten million layers
    assert params == built[0] + (10**7 - 9) * (
        model_shape._count({**gpt2, "n_layer": 2})[0] - model_shape._count({**gpt2, "n_layer": 1})[0]
    )


def test_a_model_type_that_is_not_a_string_is_named():
    from sftdoctor.run.shape import closed_form, dimension_problem

    config = {
        "model_type": ["llama"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "vocab_size": 100,
        "num_attention_heads": 4,
        "intermediate_size": 128,
    }
    assert dimension_problem(config) == "model_type is ['llama']; expected a string naming the architecture"
    assert closed_form(config) is None
