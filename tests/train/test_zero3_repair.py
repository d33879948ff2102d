"""sftdoctor's own recipe under ZeRO-3 touches a partitioned parameter in one place: the repair of untrained
embedding rows ([model] repair_untrained_tokens) at load. It must do so inside a gather (deepspeed.zero.
GatheredParameters), or rank 0 reads a weight of shape [0] (`sftdoctor explain zero3-gather`)."""

import shutil

import pytest
from trainrun import config, train

pytestmark = pytest.mark.slow  # a checkpoint saved and a real 2-rank ZeRO-3 run

OFFSET = 1.0  # every trained row is shifted by it, so the mean the repair writes is told apart from zeros


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_data):
    """tiny_data's model as a pretrained checkpoint whose <|im_start|> (1) and <|im_end|> (2) rows are zeros and
    whose other rows sit around OFFSET."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    source = tiny_data["messages"] / "model"
    folder = tmp_path_factory.mktemp("zero3-base")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight += OFFSET
        weight[[1, 2]] = 0.0
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


def test_the_repair_of_untrained_rows_gathers_the_partitioned_embedding(tmp_path, tiny_data, base):
    cfg = config(
        tmp_path,
        tiny_data["messages"],
        launch={"nproc_per_node": 2},
        deepspeed={"zero_stage": 3},
        training={"max_steps": 2, "save_steps": 2, "learning_rate": 1e-4},
        extra={"model": {"path": str(base), "weights": "pretrained", "repair_untrained_tokens": True}},
    )
    proc = train(cfg, "--no-rehearse")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ZeRO-3 partitioned the weights at load" in proc.stdout
    assert "untrained embedding rows of token ids [1, 2] set to the mean" in proc.stdout
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out" / "final" / "model.safetensors"), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    # Two steps at 1e-4 move a row by about 2e-4: the repaired rows are the mean of the others, not zeros.
    assert abs(float(emb[1].mean()) - OFFSET) < 0.05 and abs(float(emb[2].mean()) - OFFSET) < 0.05
