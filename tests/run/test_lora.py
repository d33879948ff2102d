"""[lora]: the config section, peft's matching rule and trainable-parameter count (run/lora.py) on layer
listings of the real probe, cross-checked against real peft, and the plan's adapter decisions."""

import json
import subprocess
import sys
import warnings

import pytest
from conftest import EXAMPLES, FIXTURES, index, plan_of, recorded_gpus, run_of

from sftdoctor.errors import InputErrors
from sftdoctor.run import Plan
from sftdoctor.run.config import Lora, RunConfig, load_run_config, validate
from sftdoctor.run.lora import adapter_parameters, targeted, unmatched

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"
V100x4 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
NO_GPUS = {"devices": []}

# Llama-2-7B as meta-llama's config.json gives it; peft's print_trainable_parameters reports, for it,
# 4,194,304 trainable parameters with r=8 on q_proj,v_proj ("all params: 6,742,609,920") and 39,976,960 with
# r=16 on every linear layer but lm_head.
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
LLAMA2_7B_PARAMETERS = 6_738_415_616


def recorded(name):
    """A lora_modules fact recorded from the real probe (tests/fixtures/lora_modules/index.json says how)."""
    return json.loads((FIXTURES / "lora_modules" / name).read_text())


def lora(**given):
    """The adapter settings adapter_parameters() reads, as the plan holds them."""
    return {"r": 16, "target_modules": "all-linear", "modules_to_save": [], "use_dora": False, **given}


def write_toml(tmp_path, lora_text, name="run.toml"):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    path = tmp_path / name
    path.write_text('[model]\npath = "m"\n[data]\ntrain = "d.jsonl"\n' + lora_text)
    return path


# ---------------------------------------------------------------- the [lora] section


def test_absent_lora_is_a_full_fine_tune(tmp_path):
    assert load_run_config(write_toml(tmp_path, "")).lora is None


def test_an_empty_lora_section_is_lora_with_every_default(tmp_path):
    cfg = load_run_config(write_toml(tmp_path, "[lora]\n"))
    assert cfg.lora == Lora()
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules, cfg.lora.modules_to_save) == (
        16,
        32,
        0.05,
        "all-linear",
        (),
    )
    assert (cfg.lora.use_rslora, cfg.lora.use_dora, cfg.lora.quantize, cfg.lora.merge) == (False, False, "none", False)
    assert cfg.lora.given == frozenset()


def test_given_lora_keys_are_typed_and_remembered(tmp_path):
    cfg = load_run_config(
        write_toml(
            tmp_path,
            '[lora]\nr = 8\nalpha = 16.5\ntarget_modules = ["q_proj", "v_proj"]\n'
            'modules_to_save = ["lm_head"]\nquantize = "4bit"\nuse_dora = true\n',
        )
    )
    assert cfg.lora.r == 8 and cfg.lora.alpha == 16.5
    assert cfg.lora.target_modules == ("q_proj", "v_proj") and cfg.lora.modules_to_save == ("lm_head",)
    assert cfg.lora.quantize == "4bit" and cfg.lora.use_dora
    assert cfg.given("lora", "r") and cfg.given("lora", "target_modules") and not cfg.given("lora", "dropout")


@pytest.mark.parametrize(
    "line, says",
    [
        ("r = 0", "[lora].r: expected an integer from 1 to 4096, got 0"),
        ("r = 4097", "[lora].r: expected an integer from 1 to 4096, got 4097"),
        ("r = 8.0", "[lora].r: expected an integer from 1 to 4096, got 8.0"),
        ("r = true", "[lora].r: expected an integer from 1 to 4096, got True"),
        ("alpha = -1", "[lora].alpha: expected a number > 0, got -1"),
        ("alpha = 0", "[lora].alpha: expected a number > 0, got 0"),
        ("alpha = nan", "[lora].alpha: expected a number > 0, got nan"),
        ("dropout = 1.0", "[lora].dropout: expected a number from 0 up to (not including) 1, got 1.0"),
        ("dropout = -0.1", "[lora].dropout: expected a number from 0 up to (not including) 1, got -0.1"),
        (
            'target_modules = "q_proj"',
            "[lora].target_modules: expected \"all-linear\" or a list of module names, got 'q_proj'",
        ),
        ("target_modules = []", '[lora].target_modules: expected "all-linear" or a list of module names, got []'),
        ('target_modules = ["q_proj", ""]', '[lora].target_modules: expected "all-linear" or a list of module names'),
        ('modules_to_save = "lm_head"', "[lora].modules_to_save: expected a list of module names, got 'lm_head'"),
        ('quantize = "2bit"', "[lora].quantize: expected one of none, 4bit, 8bit, got '2bit'"),
        ('use_dora = "yes"', "[lora].use_dora: expected true or false, got 'yes'"),
        ("lora_alpha = 16", "[lora].lora_alpha: unknown key (did you mean 'alpha'?)"),
        ("rank = 8", "[lora].rank: unknown key (did you mean 'r'?); known keys: r, alpha, dropout, target_modules"),
    ],
)
def test_a_bad_lora_value_is_one_line_naming_the_key_and_what_was_expected(tmp_path, line, says):
    path = write_toml(tmp_path, f"[lora]\n{line}\n")
    with pytest.raises(InputErrors) as err:
        load_run_config(path)
    [message] = str(err.value).splitlines()
    assert message.startswith(f"{path}: [lora].") and says in message


@pytest.mark.parametrize(
    "line, ours",
    [
        ("rank = 8", "r"),
        ("lora_r = 8", "r"),
        ("lora_dropout = 0.1", "dropout"),
        ('lora_target_modules = ["q_proj"]', "target_modules"),
        ("load_in_4bit = true", "quantize"),
    ],
)
def test_peft_and_axolotl_names_of_a_key_point_at_ours(tmp_path, line, ours):
    """Too far from ours for a spelling hint (difflib finds nothing close to `r` in `rank`), yet a copied config's."""
    with pytest.raises(InputErrors) as err:
        load_run_config(write_toml(tmp_path, f"[lora]\n{line}\n"))
    [message] = str(err.value).splitlines()
    assert f"unknown key (did you mean {ours!r}?)" in message


def test_every_lora_problem_is_reported_at_once(tmp_path):
    path = write_toml(
        tmp_path, '[lora]\nr = 0\nalpha = -1\ndropout = 1.0\ntarget_modules = "q_proj"\nquantize = "2bit"\n'
    )
    with pytest.raises(InputErrors) as err:
        load_run_config(path)
    keys = [line.split(": ")[1] for line in str(err.value).splitlines()]
    assert keys == ["[lora].r", "[lora].alpha", "[lora].dropout", "[lora].target_modules", "[lora].quantize"]


def test_lora_that_is_not_a_table_is_one_error(tmp_path):
    with pytest.raises(InputErrors) as err:
        validate({"model": {"path": "m"}, "data": {"train": "d.jsonl"}, "lora": 8}, write_toml(tmp_path, ""))
    [message] = str(err.value).splitlines()
    assert "lora: expected a table" in message


@pytest.mark.parametrize(
    "line, says",
    [
        ("r = 0", "[lora].r: expected an integer from 1 to 4096, got 0"),
        ('quantize = "2bit"', "[lora].quantize: expected one of none, 4bit, 8bit, got '2bit'"),
    ],
)
def test_the_cli_refuses_a_bad_lora_section_in_one_line_with_exit_2(tmp_path, line, says):
    path = write_toml(tmp_path, f"[lora]\n{line}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [f"sftdoctor: error: {path}: {says}"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "lora_text",
    [
        "",
        "[lora]\n",
        (
            '[lora]\nr = 4\ntarget_modules = ["q_proj"]\n'
            'modules_to_save = ["embed_tokens", "lm_head"]\nquantize = "8bit"\n'
        ),
    ],
)
def test_run_config_json_round_trip_keeps_lora_or_its_absence(tmp_path, lora_text):
    cfg = load_run_config(write_toml(tmp_path, lora_text))
    doc = json.loads(json.dumps(cfg.to_json()))  # what resolved.json / a facts snapshot keep
    back = RunConfig.from_json(doc)
    assert back == cfg
    assert ("lora" in doc) == (cfg.lora is not None)
    if cfg.lora is not None:
        assert back.lora.given == cfg.lora.given and isinstance(back.lora.target_modules, type(cfg.lora.target_modules))


# ---------------------------------------------------------------- peft's rule on recorded listings


def test_recorded_listings_say_how_they_were_made():
    entries = index("lora_modules")
    assert {e["file"] for e in entries} == {p.name for p in (FIXTURES / "lora_modules").glob("*.json")} - {"index.json"}
    for e in entries:
        assert e["produced_by"] == f"python -m sftdoctor.facts.lora_modules {e['config']}"
        assert recorded(e["file"])["parameters"] == e["parameters"]


def test_llama2_7b_adapters_train_what_peft_reports():
    llama = recorded("Llama-2-7b-chat-hf.json")
    assert adapter_parameters(llama, lora(r=16)) == 39_976_960
    assert adapter_parameters(llama, lora(r=8, target_modules=("q_proj", "v_proj"))) == 4_194_304
    assert llama["parameters"] == LLAMA2_7B_PARAMETERS


def test_all_linear_wraps_every_linear_layer_but_the_output_head():
    llama = recorded("Llama-2-7b-chat-hf.json")
    wrapped = {e["pattern"] for e in targeted(llama, "all-linear")}
    assert "lm_head" not in wrapped and len(wrapped) == 7
    assert sum(e["count"] for e in targeted(llama, "all-linear")) == 7 * 32
    named = targeted(llama, ("q_proj", "lm_head"))  # named explicitly, peft wraps the head too
    assert [e["pattern"] for e in named] == ["lm_head", "model.layers.*.self_attn.q_proj"]


def test_dora_adds_a_magnitude_vector_per_wrapped_layer():
    llama = recorded("Llama-2-7b-chat-hf.json")
    extra = adapter_parameters(llama, lora(r=8, use_dora=True)) - adapter_parameters(llama, lora(r=8))
    assert extra == 32 * (4 * 4096 + 2 * 11008 + 4096)


def test_modules_to_save_are_trained_in_full():
    llama = recorded("Llama-2-7b-chat-hf.json")
    base = adapter_parameters(llama, lora(r=8))
    assert adapter_parameters(llama, lora(r=8, modules_to_save=["embed_tokens"])) - base == 32000 * 4096
    assert adapter_parameters(llama, lora(r=8, modules_to_save=["embed_tokens", "lm_head"])) - base == 2 * 32000 * 4096


def test_names_are_matched_as_peft_does_whole_path_suffixes():
    llama = recorded("Llama-2-7b-chat-hf.json")
    assert unmatched(llama, ("self_attn.q_proj", "mlp.down_proj")) == []
    assert unmatched(llama, ("proj", "attn.q_proj", "mlp.q_proj")) == ["proj", "attn.q_proj", "mlp.q_proj"]
    assert unmatched(llama, "all-linear") == []


def test_llama_names_on_gpt2_match_nothing_and_conv1d_layers_count():
    gpt2 = recorded("gpt2.json")
    assert unmatched(gpt2, ("q_proj", "v_proj")) == ["q_proj", "v_proj"]
    assert adapter_parameters(gpt2, lora(r=8, target_modules=("q_proj", "v_proj"))) == 0
    assert unmatched(gpt2, ("c_attn", "q_proj")) == ["q_proj"]
    # c_attn 768 -> 2304 in each of 12 blocks
    assert adapter_parameters(gpt2, lora(r=8, target_modules=("c_attn",))) == 12 * 8 * (768 + 2304)


def test_no_listing_wraps_nothing():
    assert targeted({}, "all-linear") == [] and adapter_parameters({}, lora()) == 0


# ---------------------------------------------------------------- the real probe and real peft


def write_config(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.slow
def test_llama2_7b_built_on_the_meta_device_trains_what_peft_reports(tmp_path):
    from sftdoctor.facts.lora_modules import list_modules

    listing = list_modules(str(write_config(tmp_path, LLAMA2_7B)), False)
    assert listing["parameters"] == LLAMA2_7B_PARAMETERS and listing["model_type"] == "llama"
    assert adapter_parameters(listing, lora(r=16)) == 39_976_960
    assert adapter_parameters(listing, lora(r=8, target_modules=("q_proj", "v_proj"))) == 4_194_304
    assert {e["pattern"]: (e["count"], e["in"], e["out"]) for e in listing["linear"]}[
        "model.layers.*.mlp.down_proj"
    ] == (32, 11008, 4096)


def llama_like(c: dict) -> tuple[int, dict[str, tuple[int, int, int]]]:
    """Parameters and linear shapes of a llama/qwen2 decoder from its config, by hand: the oracle the recorded
    listings (written by the probe under test) are held to."""
    h, i, layers, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    head = h // c["num_attention_heads"]
    kv = c.get("num_key_value_heads", c["num_attention_heads"]) * head
    bias = c["model_type"] == "qwen2"  # qwen2's q, k and v carry biases
    attention = h * h + 2 * h * kv + h * h + (h + 2 * kv if bias else 0)
    per_layer = attention + 3 * h * i + 2 * h  # + the two RMSNorm weights
    tied = c.get("tie_word_embeddings", False)
    total = v * h * (1 if tied else 2) + layers * per_layer + h
    shapes = {
        "q_proj": (layers, h, h),
        "k_proj": (layers, h, kv),
        "v_proj": (layers, h, kv),
        "o_proj": (layers, h, h),
        "gate_proj": (layers, h, i),
        "up_proj": (layers, h, i),
        "down_proj": (layers, i, h),
        "lm_head": (1, h, v),
    }
    return total, shapes


def gpt2_like(c: dict) -> tuple[int, dict[str, tuple[int, int, int]]]:
    h, layers, v, p = c["n_embd"], c["n_layer"], c["vocab_size"], c["n_positions"]
    inner = c.get("n_inner") or 4 * h
    per_layer = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * inner + inner) + (inner * h + h)
    total = v * h + p * h + layers * per_layer + 2 * h  # lm_head tied to wte
    return total, {"c_attn": (layers, h, 3 * h), "c_fc": (layers, h, inner), "lm_head": (1, h, v)}


# Published totals: Llama-2-7b, 6,738,415,616 (peft's print_trainable_parameters for r=8 on q_proj,v_proj prints
# "trainable params: 4,194,304 || all params: 6,742,609,920"); GPT-2 small, 124,439,808.
PUBLISHED = {"Llama-2-7b-chat-hf.json": 6_738_415_616, "gpt2.json": 124_439_808}


@pytest.mark.parametrize("entry", index("lora_modules"), ids=lambda e: e["file"])
def test_the_recorded_listings_hold_the_counts_worked_out_by_hand(entry):
    config = json.loads((EXAMPLES.parent / entry["config"]).read_text())
    total, shapes = (gpt2_like if config["model_type"] == "gpt2" else llama_like)(config)
    listing = recorded(entry["file"])
    assert listing["parameters"] == total == PUBLISHED.get(entry["file"], total)
    found = {e["pattern"].rsplit(".", 1)[-1]: (e["count"], e["in"], e["out"]) for e in listing["linear"]}
    assert {k: found[k] for k in shapes} == shapes


@pytest.mark.slow
@pytest.mark.parametrize("entry", index("lora_modules"), ids=lambda e: e["file"])
def test_the_recorded_listings_are_what_the_probe_lists_today(entry):
    from sftdoctor.facts.lora_modules import list_modules

    config = EXAMPLES.parent / entry["config"]
    assert list_modules(str(config), False) == recorded(entry["file"])


TINY = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 320,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 384,
        "tie_word_embeddings": True,
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 320,
        "n_positions": 128,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    # transformers 5 fuses a MoE block's experts into 3-D parameters (MixtralExperts) and its router is no nn.Linear
    "mixtral": {
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 320,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
}
PEFT_CASES = [
    ("llama", {"r": 8, "target_modules": "all-linear"}),
    ("llama", {"r": 4, "target_modules": ["q_proj", "v_proj"]}),
    ("llama", {"r": 4, "target_modules": ["self_attn.o_proj", "down_proj"], "use_dora": True}),
    ("llama", {"r": 8, "target_modules": "all-linear", "modules_to_save": ["lm_head"]}),
    ("llama", {"r": 8, "target_modules": "all-linear", "modules_to_save": ["embed_tokens"]}),
    ("llama", {"r": 4, "target_modules": ["q_proj", "lm_head"]}),
    ("qwen2", {"r": 8, "target_modules": "all-linear"}),
    ("qwen2", {"r": 16, "target_modules": "all-linear", "use_dora": True}),
    ("qwen2", {"r": 4, "target_modules": ["k_proj", "v_proj", "gate_proj"], "modules_to_save": ["embed_tokens"]}),
    ("qwen2", {"r": 8, "target_modules": "all-linear", "modules_to_save": ["lm_head"]}),  # tied to embed_tokens
    ("gpt2", {"r": 8, "target_modules": "all-linear"}),
    ("gpt2", {"r": 4, "target_modules": ["c_attn", "c_proj", "c_fc"]}),
    ("gpt2", {"r": 4, "target_modules": ["c_attn"], "use_dora": True, "modules_to_save": ["wte"]}),
    ("gpt2", {"r": 4, "target_modules": ["c_attn", "q_proj"]}),  # q_proj matches nothing: peft skips it
    ("mixtral", {"r": 4, "target_modules": ["q_proj", "v_proj", "o_proj"]}),
    ("mixtral", {"r": 4, "target_modules": ["q_proj", "gate_up_proj"]}),  # fused experts: no module, peft skips it
]


@pytest.fixture(scope="module")
def tiny_configs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return {name: str(write_config(folder / name, config)) for name, config in TINY.items()}


@pytest.fixture(scope="module")
def tiny_listings(tiny_configs):
    """The listing alone (no [lora] to build): what the rule-based estimate reads."""
    from sftdoctor.facts.lora_modules import list_modules

    return {name: list_modules(path, False) for name, path in tiny_configs.items()}


@pytest.fixture(scope="module")
def probed(tiny_configs):
    """The probe as the run asks it: the listing and what peft builds for these [lora] settings."""
    from sftdoctor.facts.lora_modules import list_modules

    return lambda arch, config: list_modules(tiny_configs[arch], False, lora(**config))


def peft_trainable(arch, config):
    """What peft really trains: sum of requires_grad parameters after get_peft_model."""
    import peft
    import torch
    import transformers

    fields = {k: v for k, v in TINY[arch].items() if k != "model_type"}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(TINY[arch]["model_type"], **fields)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", **config))
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


@pytest.mark.slow
@pytest.mark.parametrize("arch, config", PEFT_CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(PEFT_CASES)])
def test_adapter_parameters_equal_what_peft_trains(tiny_listings, probed, arch, config):
    assert adapter_parameters(probed(arch, config), lora(**config)) == peft_trainable(arch, config)
    if arch != "mixtral":  # the estimate from the linear layers alone agrees where no experts are fused
        assert adapter_parameters(tiny_listings[arch], lora(**config)) == peft_trainable(arch, config)


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch, names",
    [
        ("llama", ["q_proj", "v_proj"]),
        ("gpt2", ["q_proj", "v_proj"]),
        ("qwen2", ["c_attn", "down_proj"]),
        ("gpt2", ["c_attn", "wte_proj", "mlp.c_proj"]),
    ],
)
def test_unmatched_names_exactly_what_peft_does_not_wrap(probed, arch, names):
    import peft
    import transformers

    fields = {k: v for k, v in TINY[arch].items() if k != "model_type"}
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(TINY[arch]["model_type"], **fields)
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wrapped = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=names))
    except ValueError as exc:  # peft refuses a list that matches nothing at all
        assert "not found in the base model" in str(exc)
        wrapped_paths = []
    else:
        wrapped_paths = [n.removesuffix(".lora_A") for n, _ in wrapped.named_modules() if n.endswith(".lora_A")]
    peft_missing = [n for n in names if not any(p == n or p.endswith("." + n) for p in wrapped_paths)]
    found = probed(arch, {"r": 4, "target_modules": list(names)})
    assert unmatched(found, tuple(names)) == peft_missing
    assert (peft_missing == names) == (targeted(found, tuple(names)) == [])


@pytest.mark.slow
def test_an_embedding_in_target_modules_is_wrapped_as_peft_does(probed):
    config = {"r": 4, "target_modules": ["q_proj", "embed_tokens"]}
    found = probed("llama", config)
    assert unmatched(found, ("q_proj", "embed_tokens")) == []
    assert adapter_parameters(found, lora(**config)) == peft_trainable("llama", config)


@pytest.mark.slow
def test_all_linear_on_a_moe_model_counts_the_router_and_experts_as_peft_does(probed, tiny_listings):
    """transformers 5 fuses the experts into 3-D parameters, which peft 0.21 trains as target_parameters:
    the estimate from linear layers misses them, peft's own count on the meta device does not."""
    config = {"r": 4, "target_modules": "all-linear"}
    assert adapter_parameters(probed("mixtral", config), lora(**config)) == peft_trainable("mixtral", config)
    assert adapter_parameters(tiny_listings["mixtral"], lora(**config)) < peft_trainable("mixtral", config)


@pytest.mark.slow
@pytest.mark.parametrize("names", [("q_proj", "gate"), ("w1", "w2", "w3")])
def test_moe_names_peft_converts_are_not_reported_missing(probed, names):
    assert peft_trainable("mixtral", {"r": 4, "target_modules": list(names)}) > 0
    assert unmatched(probed("mixtral", {"r": 4, "target_modules": list(names)}), names) == []


@pytest.mark.slow
def test_a_name_with_a_layer_index_wraps_that_layer_only(probed):
    config = {"r": 4, "target_modules": ["layers.0.self_attn.q_proj"]}
    found = probed("llama", config)
    assert adapter_parameters(found, lora(**config)) == peft_trainable("llama", config)
    assert [e["count"] for e in targeted(found, ("layers.0.self_attn.q_proj",))] == [1]


@pytest.mark.slow
def test_a_module_both_targeted_and_saved_trains_in_full_only(probed):
    config = {"r": 4, "target_modules": ["q_proj", "k_proj"], "modules_to_save": ["k_proj"]}
    assert adapter_parameters(probed("llama", config), lora(**config)) == peft_trainable("llama", config)


# ---------------------------------------------------------------- the plan


def adapters_plan(lora_given=None, gpus=H100x8, modules="Llama-2-7b-chat-hf.json", **sections):
    facts = {"gpus": recorded_gpus(gpus) if gpus else NO_GPUS}
    if modules:
        facts["lora_modules"] = recorded(modules) if isinstance(modules, str) else modules
    return plan_of(run_of(**({"lora": lora_given} if lora_given is not None else {}), **sections), **facts)


@pytest.mark.parametrize(
    "gpus, precision, dtype", [(H100x8, "bf16", "bfloat16"), (V100x4, "fp16", "float16"), (None, "fp32", "float32")]
)
def test_lora_loads_the_frozen_base_in_16_bits_without_deepspeed(gpus, precision, dtype):
    plan = adapters_plan({}, gpus=gpus)
    assert (plan.precision, plan.load_dtype) == (precision, dtype)
    full = adapters_plan(None, gpus=gpus)
    assert full.lora is None and full.load_dtype == "float32"  # a full fine-tune keeps fp32 master weights (AMP)


@pytest.mark.parametrize(
    "stage, quantize, gpus, storage",
    [
        (3, "4bit", H100x8, "bfloat16"),
        (3, "4bit", V100x4, "float16"),
        (2, "4bit", H100x8, "uint8"),
        (None, "4bit", H100x8, "uint8"),
        (3, "8bit", H100x8, "uint8"),
        (3, "none", H100x8, "uint8"),
    ],
)
def test_4bit_weights_are_stored_in_the_compute_dtype_only_under_zero3(stage, quantize, gpus, storage):
    ds = {"deepspeed": {"zero_stage": stage}} if stage is not None else {}
    plan = adapters_plan({"quantize": quantize}, gpus=gpus, **ds)
    assert plan.lora["quant_storage"] == storage
    assert plan.lora["compute_dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[plan.precision]
    assert plan.zero_stage == (stage or 0)


@pytest.mark.parametrize(
    "lora_given, stage, checkpointing, reentrant",
    [
        ({}, 3, True, True),
        ({}, 3, False, False),
        ({}, 2, True, False),
        ({}, None, True, False),
        (None, 3, True, False),
    ],
)
def test_reentrant_checkpointing_only_for_lora_under_zero3(lora_given, stage, checkpointing, reentrant):
    ds = {"deepspeed": {"zero_stage": stage}} if stage is not None else {}
    plan = adapters_plan(lora_given, training={"gradient_checkpointing": checkpointing}, **ds)
    assert plan.checkpointing is checkpointing and plan.checkpointing_reentrant is reentrant


def test_trainable_and_base_parameters_come_from_the_listing():
    plan = adapters_plan({"r": 8, "target_modules": ["q_proj", "v_proj"]})
    assert plan.lora["trainable_params"] == 4_194_304 and plan.lora["base_params"] == LLAMA2_7B_PARAMETERS
    assert plan.lora["target_modules"] == ["q_proj", "v_proj"]
    assert adapters_plan({}).lora["trainable_params"] == 39_976_960


@pytest.mark.parametrize("modules", [None, {"error": "listing the model's layers failed: ImportError"}])
def test_without_a_listing_the_counts_are_unknown_not_zero(modules):
    plan = adapters_plan({}, modules=modules)
    assert plan.lora["trainable_params"] is None and plan.lora["base_params"] is None
    assert plan.lora["r"] == 16 and plan.lora["target_modules"] == "all-linear"


def test_the_plan_of_a_toml_lora_section_survives_resolved_json(tmp_path):
    cfg = load_run_config(
        write_toml(
            tmp_path,
            '[lora]\nr = 8\nalpha = 16\ntarget_modules = ["q_proj", "v_proj"]\n'
            'modules_to_save = ["lm_head"]\nuse_rslora = true\nmerge = true\n',
        )
    )
    plan = plan_of(cfg, gpus=recorded_gpus(H100x8), lora_modules=recorded("Llama-2-7b-chat-hf.json"))
    assert plan.lora == {
        "r": 8,
        "alpha": 16,
        "dropout": 0.05,
        "target_modules": ["q_proj", "v_proj"],
        "modules_to_save": ["lm_head"],
        "use_rslora": True,
        "use_dora": False,
        "quantize": "none",
        "merge": True,
        "compute_dtype": "bfloat16",
        "quant_storage": "uint8",
        "trainable_params": 4_194_304 + 32000 * 4096,
        "base_params": LLAMA2_7B_PARAMETERS,
    }
    back = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back == plan and back.lora == plan.lora
