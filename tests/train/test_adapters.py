"""train/adapters.py: where an adapter's base lives, and the dtype of what LoRA trains under AMP."""

import dataclasses
import warnings

import pytest
from conftest import EXAMPLES, plan_of, run_of


def lora_plan(**lora):
    return plan_of(run_of(lora=lora, model={"weights": "random"}))


def test_a_random_base_is_saved_for_an_adapter_or_an_evaluation_only():
    from sftdoctor.train.adapters import needs_base

    assert needs_base(lora_plan())
    assert needs_base(plan_of(run_of(eval={"tasks": ("t",)}, model={"weights": "random"})))
    assert not needs_base(plan_of(run_of(eval={"tasks": ("t",), "base": False}, model={"weights": "random"})))
    assert not needs_base(plan_of(run_of(model={"weights": "random"})))


@pytest.mark.parametrize("deepspeed", [None, {"zero_optimization": {"stage": 2}}])
def test_modules_to_save_train_in_fp32_under_amp_unless_deepspeed_keeps_the_master_copy(deepspeed):
    """peft 0.21 keeps modules_to_save in the base's 16-bit dtype: GradScaler would refuse their gradients."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from sftdoctor.train.adapters import trainable_in_fp32

    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(EXAMPLES / "tiny" / "model"), dtype=torch.float16
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32, torch.float16}
    plan = dataclasses.replace(lora_plan(modules_to_save=("lm_head",)), load_dtype="float16", deepspeed=deepspeed)
    trainable_in_fp32(model, plan)
    expected = {torch.float32} if deepspeed is None else {torch.float32, torch.float16}
    assert {p.dtype for p in model.parameters() if p.requires_grad} == expected
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.float16}  # the frozen base stays
