"""The baseline: a plain TRL SFTTrainer with its defaults on the suite's model and data, as a user would write it.

    python bench/gpu/children/trl_baseline.py MODEL_DIR DATA.jsonl OUT_DIR STEPS BATCH MAX_LENGTH RESULT.json

TRL's defaults (TRL 1.16): bf16 mixed precision over fp32 weights, gradient checkpointing on, sdpa attention
(transformers' default), no packing (each batch padded to its longest row), AdamW (fused), linear schedule.
Set here, as every run of the suite does: the step count, the micro-batch, max_length, a log every step and no
checkpoint or reporting; on a CPU bf16 is off (TRL's default refuses to start there).

Real (non-padding) tokens are counted where the trainer consumes them, as sftdoctor's TokenCounter does: a
device tensor read only when a step is logged. RESULT.json gets every logged step (time, real tokens so far,
loss), the settings, and torch.cuda.max_memory_allocated.
"""

import json
import sys
import time


def main(model_dir, data, out, steps, batch, max_length, result):
    import torch
    from datasets import load_dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    dataset = load_dataset("json", data_files=data, split="train")
    args = SFTConfig(
        output_dir=out,
        max_steps=int(steps),
        per_device_train_batch_size=int(batch),
        max_length=int(max_length),
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **({} if cuda else {"bf16": False}),
    )
    records, state = [], {"real": 0, "slots": 0}

    Counting, Steps = instrumented(records, state)

    trainer = Counting(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.add_callback(Steps())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    for before, after in zip(records, records[1:]):
        after["step_time_s"] = after["time"] - before["time"]
    done = {
        "records": records,
        "bf16": bool(args.bf16),
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "packing": bool(args.packing),
        "padding_free": bool(args.padding_free),
        "optim": str(getattr(args.optim, "value", args.optim)),
        "dtype": str(model.dtype),
        "parameters": sum(p.numel() for p in model.parameters()),
        "padding_fraction": 1 - float(state["real"]) / max(1, state["slots"]),
        "max_memory_allocated": torch.cuda.max_memory_allocated() if cuda else None,
    }
    with open(result, "w") as handle:
        json.dump(done, handle)


def instrumented(records: list, state: dict):
    """An SFTTrainer class that counts the real tokens and the padded slots it trains on (into `state`), and a
    callback that records each logged step with those counts (into `records`)."""
    from transformers import TrainerCallback
    from trl import SFTTrainer

    class Counting(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                ids, mask = inputs["input_ids"], inputs.get("attention_mask")
                state["real"] = state["real"] + (mask.sum() if mask is not None else ids.numel())
                state["slots"] += ids.numel()
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )

    class Steps(TrainerCallback):
        def on_log(self, args, st, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                records.append(
                    {
                        "step": st.global_step,
                        "time": time.time(),
                        "tokens_seen": float(state["real"]),
                        "slots": state["slots"],
                        "loss": logs["loss"],
                    }
                )

    return Counting, Steps


if __name__ == "__main__":
    main(*sys.argv[1:8])
