"""The packing probe on the installed stack: isolation proven, and the comparison able to see leakage."""

import json

import pytest
from conftest import FIXTURES

from sftdoctor.facts.packing_probe import TOLERANCE, max_packed_diff, measure, shrink


@pytest.mark.slow
@pytest.mark.parametrize("config", ["Meta-Llama-3-8B.json", "Qwen2-0.5B.json"])
def test_packed_samples_stay_isolated_with_sdpa_on_this_stack(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text((FIXTURES / "model_config" / config).read_text())
    result = measure({"config": str(path), "attn_implementation": "sdpa"})
    assert result["isolated"] is True and result["max_abs_diff"] <= TOLERANCE
    assert "position_ids" in result["batch_keys"] and "attention_mask" not in result["batch_keys"]


def test_the_comparison_sees_leakage_when_a_mask_spans_the_packed_row():
    """Negative control: an all-ones attention mask over the packed row (what a naive packer sends) lets
    tokens attend across samples, and the same comparison must report it."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config()
    shrink(config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    samples = [[5, 6, 7, 8], [9, 10, 11]]
    flat = torch.tensor([samples[0] + samples[1]])
    batch = {
        "input_ids": flat,
        "attention_mask": torch.ones_like(flat),
        "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2]]),
    }
    assert max_packed_diff(model, samples, batch, "cpu") > 100 * TOLERANCE


def test_flash_attention_cannot_be_probed_without_a_gpu(tmp_path):
    path = tmp_path / "config.json"
    path.write_text((FIXTURES / "model_config" / "Qwen2-0.5B.json").read_text())
    result = measure({"config": str(path), "attn_implementation": "flash_attention_2"})
    assert result["isolated"] is None and "CUDA" in result["error"]
    json.dumps(result)


def test_trls_padding_free_collator_packs_as_the_probe_assumes():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}]
    )
    assert sorted(batch) == [
        "cu_seq_lens_k",
        "cu_seq_lens_q",
        "input_ids",
        "labels",
        "max_length_k",
        "max_length_q",
        "position_ids",
        "seq_idx",
    ]
    assert "attention_mask" not in batch  # with one, attention would ignore the restarting positions
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5] and batch["max_length_q"] == 3
