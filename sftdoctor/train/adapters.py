"""LoRA and QLoRA around the recipe (sft.py): the base an adapter belongs to, the quantized load, and what
is written at the end (the adapter in peft's format in final/, and with merge = true the merged model in
final-merged/). peft does the work (through TRL's peft_config); this module only places the files.

A base initialised at random (`[model] weights = "random"`) exists nowhere on disk, so its weights are saved
once into RUN_DIR/base and the adapter names that folder: `PeftModel.from_pretrained(base, final)` then
rebuilds the trained model anywhere. QLoRA loads the base through bitsandbytes, which quantizes only on
`from_pretrained`, so a random base is loaded back from RUN_DIR/base.
"""

from __future__ import annotations

import os
from pathlib import Path

from sftdoctor.run import Plan
from sftdoctor.run.resolve import base_path

MERGED = "final-merged"
KINDS = {"none": "LoRA", "4bit": "QLoRA (4-bit NF4 base)", "8bit": "LoRA over an 8-bit base"}  # by [lora] quantize


def describe(lora: dict) -> str:
    """ "LoRA r 16, alpha 32 on all-linear": the adapters in the words the plan lines and the model card use."""
    targets = lora["target_modules"] if isinstance(lora["target_modules"], str) else ", ".join(lora["target_modules"])
    return f"{KINDS[lora['quantize']]} r {lora['r']}, alpha {lora['alpha']:g} on {targets}"


def needs_base(plan: Plan) -> bool:
    """A random base must be on disk for an adapter to load onto, or for the evaluation to compare with."""
    return plan.lora is not None or bool((plan.evaluation or {}).get("base"))


def save_base(plan: Plan, model) -> None:
    """Rank 0 writes a random base's weights once (a resume reuses them); every rank waits for them."""
    target = Path(base_path(plan))
    if int(os.environ.get("RANK", "0")) == 0 and not (target / "config.json").is_file():
        model.save_pretrained(str(target))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def load_quantized(plan: Plan, common: dict, dtype):
    """The frozen base in 4 or 8 bits, on this rank's GPU (ZeRO-3 places it itself), made trainable the way peft
    prescribes for k-bit models: norms in fp32, inputs requiring grad, checkpointing as the plan says."""
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    from sftdoctor.facts.trainer_inputs import quantization_config

    placement = {} if plan.zero_stage == 3 else {"device_map": {"": int(os.environ.get("LOCAL_RANK", "0"))}}
    net = AutoModelForCausalLM.from_pretrained(
        base_path(plan), dtype=dtype, quantization_config=quantization_config(plan), **placement, **common
    )
    return prepare_model_for_kbit_training(
        net,
        use_gradient_checkpointing=plan.checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": plan.checkpointing_reentrant},
    )


def save_adapter(trainer, plan: Plan, final: Path) -> None:
    """The adapter in peft's format, naming the base it was trained on."""
    model = trainer.model
    for config in getattr(model, "peft_config", {}).values():
        config.base_model_name_or_path = base_path(plan)
    trainer.save_model(str(final))
    if trainer.is_world_process_zero() and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(final))  # where generate() stops: peft saves none


def merge(plan: Plan, final: Path) -> Path:
    """base + adapter as one model in the run's 16-bit dtype (fp32 on CPU runs), loadable with plain
    AutoModelForCausalLM.from_pretrained: merged on the CPU from the saved files, so it works the same after
    ZeRO-3 or QLoRA (the base is loaded unquantized) and leaves the GPUs alone."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, plan.lora["compute_dtype"])
    base = AutoModelForCausalLM.from_pretrained(base_path(plan), dtype=dtype, trust_remote_code=plan.trust_remote_code)
    merged = PeftModel.from_pretrained(base, str(final)).merge_and_unload()
    if (final / "generation_config.json").is_file():
        from transformers import GenerationConfig

        merged.generation_config = GenerationConfig.from_pretrained(str(final))
    out = Path(plan.output_dir) / MERGED
    merged.save_pretrained(str(out))
    return out


def trainable_in_fp32(model, plan: Plan) -> None:
    """Without DeepSpeed (which keeps its own fp32 master copy), every trained parameter must be fp32 under
    AMP: peft casts the adapters (autocast_adapter_dtype) but leaves modules_to_save copies in the base's
    16-bit dtype, and GradScaler refuses them at the first step ("Attempting to unscale FP16 gradients")."""
    if plan.deepspeed is not None or plan.load_dtype == "float32":
        return
    import torch

    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
