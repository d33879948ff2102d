"""Model states and host RAM equal DeepSpeed's own estimators, on published config.json files."""

import json

import pytest

from conftest import FIXTURES
from sftdoctor.checks.run_config import parameter_count
from sftdoctor.plan.memory import Setting, host_memory, model_states
from sftdoctor.plan.shape import shape_of

MODELS = FIXTURES / "model_config"


def config(name):
    return json.loads((MODELS / name).read_text())


@pytest.fixture(scope="module", params=["Llama-2-7b-hf_resaved_float32.json", "Meta-Llama-3-8B.json"])
def shape(request):
    return shape_of(config(request.param))


def test_meta_device_count_is_exact_for_published_models():
    """Llama-3-8B has 8,030,261,248 parameters (Meta's model card says 8.03B); Llama-2-7B 6,738,415,616."""
    assert shape_of(config("Meta-Llama-3-8B.json")).parameters == 8_030_261_248
    assert shape_of(config("Llama-2-7b-hf_resaved_float32.json")).parameters == 6_738_415_616


@pytest.mark.parametrize("name", ["Qwen2-0.5B.json", "Qwen2.5-3B-Instruct_merged_transformers5_float16.json",
                                  "Llama-3.2-1B.json", "SmolLM2-135M_merged_transformers5_bfloat16.json"])
def test_the_quick_count_of_the_preflight_check_matches_the_meta_device(name):
    """`zero-stage` counts without torch; it must agree with the model transformers builds (biases included)."""
    assert parameter_count(config(name)) == shape_of(config(name)).parameters


@pytest.mark.parametrize("gpus, nodes", [(8, 1), (4, 2), (2, 1)])
@pytest.mark.parametrize("offload", [False, True])
def test_gpu_and_host_figures_equal_deepspeeds_estimators(shape, gpus, nodes, offload):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    world = gpus * nodes
    p, largest = shape.parameters, shape.largest_layer
    for stage in (2, 3):
        s = Setting(stage, offload, True, 1, False)
        gpu = sum(t.bytes for t in model_states(shape, s, world))
        host = sum(t.bytes for t in host_memory(shape, s, world, gpus))
        if stage == 2:
            cpu_mem, gpu_mem = estimate_zero2_model_states_mem_needs(p, gpus, nodes, offload)
        else:  # sftdoctor loads the model before DeepSpeed: no zero.Init
            cpu_mem, gpu_mem, _ = estimate_zero3_model_states_mem_needs(p, largest, gpus, nodes, offload, False, False)
        assert abs(gpu - gpu_mem) <= 2, (stage, offload)  # integer division of the split terms
        assert host == cpu_mem, (stage, offload)
