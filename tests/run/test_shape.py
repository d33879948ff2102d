"""The closed-form parameter count against the model transformers builds on the meta device."""

import json

import pytest
from conftest import FIXTURES, index, meta_shape

from sftdoctor.run.shape import NEEDED, closed_form, dimension_problem, dimensions

MODELS = FIXTURES / "model_config"


def config(name):
    return json.loads((MODELS / name).read_text())


def test_published_counts():
    """Llama-3-8B has 8,030,261,248 parameters (Meta's model card says 8.03B); Llama-2-7B 6,738,415,616."""
    assert closed_form(config("Meta-Llama-3-8B.json")).parameters == 8_030_261_248
    assert closed_form(config("Llama-2-7b-hf_resaved_float32.json")).parameters == 6_738_415_616


@pytest.mark.parametrize("entry", index("model_config"), ids=lambda e: e["file"])
def test_the_closed_form_equals_the_meta_device_wherever_it_answers(entry):
    cfg = config(entry["file"])
    quick = closed_form(cfg)
    if quick is None:  # another family: counted on the meta device (in a child process) instead
        assert cfg.get("model_type") not in {"llama", "qwen2", "qwen3", "mistral"} or dimensions(cfg) is None
        return
    exact = meta_shape(cfg)
    assert (quick.parameters, quick.largest_layer) == (exact.parameters, exact.largest_layer)


@pytest.mark.parametrize(
    "broken",
    [
        {"hidden_size": "4096"},
        {"num_hidden_layers": 0},
        {"vocab_size": -1},
        {"num_attention_heads": 7},
        {"hidden_size": None},
        {"num_key_value_heads": 3},
    ],
)
def test_a_config_with_impossible_dimensions_has_no_shape(broken):
    cfg = {**config("Meta-Llama-3-8B.json"), **broken}
    assert closed_form(cfg) is None


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

VALUES = st.none() | st.booleans() | st.integers(-3, 10**7) | st.floats(allow_nan=True) | st.text(max_size=6)
KEYS = [
    "model_type",
    *NEEDED,
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
    "attention_bias",
    "n_embd",
    "text_config",
]


@given(
    st.dictionaries(st.sampled_from(KEYS), VALUES | st.sampled_from(["llama", "qwen2", "qwen3", "gpt2"]), max_size=10)
)
@settings(max_examples=400, deadline=None)
def test_any_config_gives_a_shape_or_a_named_problem_never_a_crash(config):
    problem = dimension_problem(config)
    shape = closed_form(config)
    assert problem is None or any(key in problem for key in KEYS)
    if shape is not None:
        assert problem is None and shape.parameters > 0 and shape.largest_layer > 0


def test_a_named_problem_says_which_key(tmp_path):
    cfg = {**config("Meta-Llama-3-8B.json"), "hidden_size": "4096"}
    assert dimension_problem(cfg) == "hidden_size is '4096'; expected a positive integer"
    assert dimension_problem(config("Meta-Llama-3-8B.json")) is None
