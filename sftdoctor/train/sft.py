"""The recipe each training process runs: setup -> train -> cleanup.

    python -m sftdoctor.train.sft RUN_DIR/resolved.json     (started by `sftdoctor train`, or by torchrun)

A thin layer over transformers + TRL's SFTTrainer (+ DeepSpeed through TrainingArguments): the
settings come from the plan `sftdoctor train` resolved and checked; this file only applies them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


# ---------------------------------------------------------------- setup

def load_tokenizer(model: dict[str, Any]):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model.get("tokenizer") or model["path"],
                                              trust_remote_code=model["trust_remote_code"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_files(files: list[str]):
    from datasets import load_dataset

    kind = "parquet" if all(f.endswith(".parquet") for f in files) else "json"
    return load_dataset(kind, data_files=files, split="train")


def load_data(data: dict[str, Any], shape: str, seed: int, limit: int | None = None):
    """(train, eval or None) with only the columns of the row shape SFTTrainer reads."""
    keep = {"messages": ["messages"], "prompt_completion": ["prompt", "completion"], "text": ["text"]}[shape]
    train = _load_files(data["train"])
    train = train.remove_columns([c for c in train.column_names if c not in keep])
    evaluation = None
    if data.get("eval"):
        evaluation = _load_files(data["eval"])
        evaluation = evaluation.remove_columns([c for c in evaluation.column_names if c not in keep])
    elif data.get("eval_fraction"):
        split = train.train_test_split(test_size=data["eval_fraction"], seed=seed)
        train, evaluation = split["train"], split["test"]
    if limit:
        train = train.select(range(min(limit, len(train))))
        evaluation = evaluation.select(range(min(max(2, limit // 8), len(evaluation)))) if evaluation else None
    return train, evaluation


DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def load_model(model: dict[str, Any], plan: dict[str, Any], smoke: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    # DeepSpeed keeps fp32 master weights itself, so bf16 weights load at half the host memory. Without it,
    # bf16/fp16 are AMP over fp32 weights: AdamW in pure bf16 would round small updates away.
    dtype = getattr(torch, "bfloat16" if plan["precision"] == "bf16" and plan["deepspeed"] else "float32")
    common = {"attn_implementation": plan["attn_implementation"], "trust_remote_code": model["trust_remote_code"]}
    if smoke or model["weights"] == "random":
        config = AutoConfig.from_pretrained(model["path"], trust_remote_code=model["trust_remote_code"])
        if smoke:
            from sftdoctor.facts.packing_probe import shrink

            shrink(config, vocab_size=None)
        torch.manual_seed(plan["seed"])
        net = AutoModelForCausalLM.from_config(config, dtype=dtype, **common)
    else:
        net = AutoModelForCausalLM.from_pretrained(model["path"], dtype=dtype, **common)
    net.config.use_cache = False  # no KV cache in training: it also keeps packed samples apart (see packing check)
    if plan["liger_kernel"]:
        # Applied to the instance ourselves: TRL 1.16 deprecates its use_liger_kernel switch in favour of hub
        # kernels an offline cluster cannot fetch. Its fused linear cross-entropy is left to TRL's own LM head.
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=net, fused_linear_cross_entropy=False, cross_entropy=False)
    return net


def sft_config(run: dict[str, Any], plan: dict[str, Any], run_dir: Path, has_eval: bool, shape: str, tokenizer):
    from trl import SFTConfig

    training, fields = run["training"], {f.name for f in dataclasses.fields(SFTConfig)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    steps = {"max_steps": plan["max_steps"]} if plan.get("max_steps") else {"num_train_epochs": training["epochs"]}
    eval_steps = training.get("eval_steps") or plan["save_steps"]
    report = run["report"]["to"]
    args = {
        "output_dir": str(run_dir),
        "per_device_train_batch_size": plan["per_device_batch_size"],
        "per_device_eval_batch_size": plan["per_device_batch_size"],
        "gradient_accumulation_steps": plan["gradient_accumulation_steps"],
        "learning_rate": training["learning_rate"],
        "lr_scheduler_type": training["lr_scheduler"],
        "lr_scheduler_kwargs": plan["lr_scheduler_kwargs"],
        **plan["warmup"],
        "weight_decay": training["weight_decay"],
        "max_grad_norm": training["max_grad_norm"],
        **steps,
        "bf16": plan["precision"] == "bf16",
        "fp16": plan["precision"] == "fp16",
        checkpointing: training["gradient_checkpointing"],
        f"{checkpointing}_kwargs": {"use_reentrant": False} if training["gradient_checkpointing"] else None,
        "packing": plan["packing"],
        "packing_strategy": "bfd",
        "max_length": plan["max_length"],
        "assistant_only_loss": shape == "messages" and _assistant_mask_possible(tokenizer),
        "seed": plan["seed"],
        "data_seed": plan["seed"],
        "logging_steps": plan["logging_steps"],
        "save_strategy": "steps",
        "save_steps": plan["save_steps"],
        "save_total_limit": training["save_total_limit"],
        "eval_strategy": "steps" if has_eval else "no",
        "eval_steps": eval_steps if has_eval else None,
        "report_to": [] if report == "none" else [report],
        "deepspeed": plan.get("deepspeed_path"),
        "ddp_timeout": plan.get("ddp_timeout_s", 1800),
        # Dense decoders use every parameter in every step; only mixture-of-experts models can skip some.
        "ddp_find_unused_parameters": plan.get("moe", False),
        "disable_tqdm": True,  # callbacks.progress() draws the bar on rank 0
        "dataloader_num_workers": 0,
        "use_cpu": not plan.get("cuda", False),
    }
    if "use_cpu" not in fields:  # transformers < 4.37 called it no_cuda
        args["no_cuda"] = args.pop("use_cpu")
    return SFTConfig(**args)  # no silent filtering: an argument the installed version lacks must fail loudly


def _assistant_mask_possible(tokenizer) -> bool:
    """Loss on assistant turns needs {% generation %} markers, present or patchable by TRL."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if template and has_generation_markers(template):
        return True
    try:
        return get_training_chat_template(tokenizer) is not None
    except (ValueError, TypeError):
        return False


def watched_trainer_class(drill: dict[str, Any] | None):
    """SFTTrainer that keeps the last micro-batch's loss and inputs (no sync: references only) for the
    watchers, and injects a nan-loss drill."""
    from trl import SFTTrainer

    class WatchedSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            result = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                          num_items_in_batch=num_items_in_batch)
            loss = result[0] if return_outputs else result
            if (drill and drill["kind"] == "nan-loss" and model.training
                    and self.state.global_step + 1 == drill["step"] and drill["rank"] in (None, rank())):
                loss = loss * float("nan")
                result = (loss, result[1]) if return_outputs else loss
            if model.training:
                self.sftdoctor_last_loss, self.sftdoctor_last_inputs = loss.detach(), inputs
                self.sftdoctor_tokens.add(inputs)
            return result

    return WatchedSFTTrainer


# ---------------------------------------------------------------- train

DISTRIBUTED_CHECK_SECONDS = 3.0


def main(argv: list[str]) -> int:
    resolved_path = Path(argv[0])
    resolved = json.loads(resolved_path.read_text())
    run, plan = resolved["run_config"], resolved["plan"]
    run_dir = Path(plan["output_dir"])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and run["launch"].get("distributed_check", True):
        from sftdoctor.cluster.run import main as distributed_check

        # Every rank, before the model loads: the same stack, a GPU each, all joined, exact all-reduces.
        bound = min(float(plan["watch"]["hang_timeout_s"]), 120.0)
        if distributed_check(bound, DISTRIBUTED_CHECK_SECONDS, run_dir / "distributed", None, False, None):
            return 1

    import datasets
    import transformers

    transformers.logging.set_verbosity_warning() if rank() == 0 else transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    from transformers import set_seed
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from sftdoctor.train import callbacks, watch
    from sftdoctor.train.checkpoints import newest_complete

    set_seed(plan["seed"])
    tokenizer = load_tokenizer(run["model"])
    train, evaluation = load_data(run["data"], plan["shape"], plan["seed"], limit=plan.get("data_limit"))
    model = load_model(run["model"], plan, smoke=resolved.get("smoke", False))
    args = sft_config(run, plan, run_dir, evaluation is not None, plan["shape"], tokenizer)
    if plan["shape"] == "messages" and not args.assistant_only_loss and rank() == 0:
        print("sftdoctor: the chat template has no {% generation %} markers and TRL cannot patch it: the loss "
              "covers every turn, not only the assistant's", flush=True)
    trainer = watched_trainer_class(plan.get("drill"))(
        model=model, args=args, train_dataset=train, eval_dataset=evaluation, processing_class=tokenizer)
    trainer.sftdoctor_tokens = callbacks.TokenCounter()
    trainer.add_callback(callbacks.Metrics(trainer.sftdoctor_tokens, run_dir / "metrics.jsonl"))
    trainer.remove_callback(PrinterCallback)  # prints raw log dicts; ours print one line instead
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(callbacks.progress())
    trainer.add_callback(callbacks.CompleteCheckpoints())
    if resolved.get("stop_after_step"):
        trainer.add_callback(callbacks.StopAfter(resolved["stop_after_step"]))
    if not os.environ.get("SFTDOCTOR_NO_WATCH"):  # only for bench/watch_overhead.py's "off" runs
        guard = watch.Guard(trainer, plan["watch"], plan, run_dir)
        trainer.add_callback(guard)
        if (plan.get("drill") or {}).get("kind") == "hang":
            trainer.add_callback(watch.HangDrill(plan["drill"], guard.watchdog))

    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    checkpoint = newest_complete(run_dir) if resolved.get("resume") or restarted else None
    if checkpoint and rank() == 0:
        print(f"sftdoctor: resuming from {checkpoint}", flush=True)
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except watch.RunStopped as stop:
        return stop.code  # every rank stops here, before the optimizer step and before any save

    # ------------------------------------------------------------ cleanup
    if not resolved.get("stop_after_step"):
        trainer.save_model(str(run_dir / "final"))
        if rank() == 0:
            tokenizer.save_pretrained(str(run_dir / "final"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
