"""What the trainer is given, built from the Plan: the tokenizer, the datasets (only the columns SFTTrainer reads,
ShareGPT and Alpaca rows mapped to messages) and the SFTConfig. One place, read by the workers
(sftdoctor.train.sft) and by the probes that prove what the trainer will do with them (targets_probe).
Imports the training stack only inside its functions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the catalogue imports this module for every `check`: no resolver at run time
    from sftdoctor.run import Plan


def load_tokenizer(plan: Plan):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(plan.tokenizer_path, trust_remote_code=plan.trust_remote_code)
    if plan.chat_template:  # saved with the model too: final/ formats prompts as training did
        tokenizer.chat_template = Path(plan.chat_template).read_text(encoding="utf-8")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_files(files: tuple[str, ...], streaming: bool = False):
    from datasets import load_dataset

    arrow = all(f.endswith(".arrow") for f in files)  # a hub id's split, as load_dataset prepared it (hub_data)
    if arrow and not streaming:
        from datasets import Dataset, concatenate_datasets

        # memory-mapped where they lie, as load_dataset itself returns them (no copy into another cache)
        return concatenate_datasets([Dataset.from_file(f) for f in files])
    kind = "arrow" if arrow else "parquet" if all(f.endswith(".parquet") for f in files) else "json"
    return load_dataset(kind, data_files=list(files), split="train", streaming=streaming)


ROW = "sftdoctor_row"  # the column that numbers the training rows: train.rows traces a batch back to them by it
KEEP = {"messages": ["messages"], "prompt_completion": ["prompt", "completion"], "text": ["text"]}


def as_trained(dataset, plan: Plan):
    """Only the columns SFTTrainer reads; ShareGPT and Alpaca rows mapped to messages first."""
    if plan.data_format in ("sharegpt", "alpaca"):
        from sftdoctor.facts.data import to_messages

        dataset = dataset.map(lambda row: {"messages": to_messages(row, plan.data_format)})
    return dataset.select_columns(KEEP[plan.data_shape])


def load_data(plan: Plan):
    """(train, eval or None) as the trainer takes them. Each training row carries its number in the data files
    (ROW, before any split or limit): a non-finite step is traced back to its rows by it (train.rows)."""
    if plan.streaming:
        return _streamed(plan)
    train = as_trained(_load_files(plan.train_files), plan)
    train = train.add_column(ROW, list(range(len(train))))
    evaluation = None
    if plan.eval_files:
        evaluation = as_trained(_load_files(plan.eval_files), plan)
    elif plan.eval_fraction:
        from sftdoctor.facts.data import eval_split  # the count the data probe checked before the gate

        split = train.train_test_split(test_size=eval_split(len(train), plan.eval_fraction)[1], seed=plan.seed)
        train, evaluation = split["train"], split["test"]
    if plan.data_limit:
        limit = plan.data_limit
        train = train.select(range(min(limit, len(train))))
        evaluation = evaluation.select(range(min(max(2, limit // 8), len(evaluation)))) if evaluation else None
    return train, evaluation


def _streamed(plan: Plan):
    """(train, eval or None) with the training rows an IterableDataset ([data] streaming): read from the files as
    training goes, shuffled within a buffer; the eval rows (a split, not a stream) loaded whole."""
    from sftdoctor.run.data_source import STREAM_SHUFFLE_BUFFER

    train = as_trained(_load_files(plan.train_files, streaming=True), plan)
    train = train.map(lambda _, i: {ROW: i}, with_indices=True).shuffle(
        seed=plan.seed, buffer_size=STREAM_SHUFFLE_BUFFER
    )
    evaluation = as_trained(_load_files(plan.eval_files), plan) if plan.eval_files else None
    if plan.data_limit:
        train = train.take(plan.data_limit)
        evaluation = (
            evaluation.select(range(min(max(2, plan.data_limit // 8), len(evaluation)))) if evaluation else None
        )
    return train, evaluation


def sft_config(plan: Plan, has_eval: bool):
    from trl import SFTConfig

    from sftdoctor.run.fsdp import trainer_checkpointing

    steps = {"max_steps": plan.max_steps} if plan.max_steps else {"num_train_epochs": plan.epochs}
    arg = plan.checkpointing_arg
    checkpointing = trainer_checkpointing(plan)
    args = {
        "output_dir": plan.output_dir,
        "per_device_train_batch_size": plan.per_device_batch_size,
        "per_device_eval_batch_size": plan.per_device_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "learning_rate": plan.learning_rate,
        "lr_scheduler_type": plan.lr_scheduler,
        "lr_scheduler_kwargs": plan.lr_scheduler_kwargs,
        **plan.warmup,
        "weight_decay": plan.weight_decay,
        "max_grad_norm": plan.max_grad_norm,
        **steps,
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
        arg: checkpointing,
        f"{arg}_kwargs": {"use_reentrant": plan.checkpointing_reentrant} if checkpointing else None,
        "packing": plan.packing,
        "packing_strategy": "bfd",
        **plan.length_grouping,
        "max_length": plan.max_length,
        "assistant_only_loss": plan.assistant_only_loss,
        "seed": plan.seed,
        "data_seed": plan.seed,
        "logging_steps": plan.logging_steps,
        "save_strategy": "steps",
        "save_steps": plan.save_steps,
        "save_total_limit": plan.save_total_limit,
        "eval_strategy": "steps" if has_eval else "no",
        "eval_steps": plan.eval_steps if has_eval else None,
        "report_to": [] if plan.report_to == "none" else [plan.report_to],
        "deepspeed": plan.deepspeed,
        **fsdp_args(plan),
        "ddp_timeout": plan.ddp_timeout_s,
        # Decided by the plan (resolve.find_unused_parameters): on where a step can leave a trainable parameter
        # without a gradient (a VLM's vision tower on text rows, MoE experts), which DDP would otherwise wait for.
        "ddp_find_unused_parameters": plan.ddp_find_unused_parameters,
        "disable_tqdm": True,  # callbacks.progress() draws the bar on rank 0
        "dataloader_num_workers": 0,
        "use_cpu": not plan.cuda,
    }
    return SFTConfig(**args)  # no silent filtering: an argument the installed version lacks must fail loudly


def fsdp_args(plan: Plan) -> dict[str, Any]:
    """FSDP2 as TrainingArguments take it (transformers 5.x: `fsdp=True` and every setting in fsdp_config; the
    string form is deprecated), with hybrid sharding as accelerate's ParallelismConfig (accelerate 1.10+)."""
    if plan.fsdp is None:
        return {}
    args: dict[str, Any] = {"fsdp": True, "fsdp_config": dict(plan.fsdp)}
    if plan.fsdp_replicate > 1:
        from accelerate.parallelism_config import ParallelismConfig

        args["parallelism_config"] = ParallelismConfig(
            dp_replicate_size=plan.fsdp_replicate, dp_shard_size=plan.world_size // plan.fsdp_replicate
        )
    return args


def row_text(row: dict[str, Any], tokenizer, shape: str) -> str:
    """The text the trainer tokenizes of a row of `shape` (the plan's): other keys of the row are not trained."""
    if shape == "messages":
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(row["messages"], tokenize=False)
        return "\n".join(str(m.get("content", "")) for m in row["messages"])
    if shape == "prompt_completion":
        prompt, completion = row["prompt"], row.get("completion", "")
        if isinstance(prompt, list):  # TRL's conversational prompt-completion: lists of messages
            turns = prompt + (completion if isinstance(completion, list) else [])
            return row_text({"messages": turns}, tokenizer, "messages")
        return f"{prompt}{completion}"
    return str(row.get("text", ""))


def end_of_turn(tokenizer) -> int | None:
    """The token the chat template closes an assistant turn with: the first special token after its content."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    content = "sftdoctor-probe-answer"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}], tokenize=False
        )
    except Exception:  # a template that needs other roles or keys: no answer here
        return None
    after = text[text.rfind(content) + len(content) :] if content in text else ""
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    return next((i for i in ids if i in special), None)


def peft_config(plan: Plan):
    """peft's LoraConfig for the plan's adapters (None: a full fine-tune), handed to SFTTrainer, which wraps the
    model with get_peft_model and, with checkpointing on, enable_input_require_grads (TRL 1.16), so gradients
    reach the adapters through the frozen embeddings."""
    if plan.lora is None:
        return None
    from peft import LoraConfig

    lora = plan.lora
    return LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["target_modules"],
        modules_to_save=lora["modules_to_save"] or None,
        use_rslora=lora["use_rslora"],
        use_dora=lora["use_dora"],
        bias="none",
        task_type="CAUSAL_LM",
    )


def quantization_config(plan: Plan):
    """bitsandbytes' config for QLoRA's frozen base (None without quantize): NF4 with double quantisation,
    computing in the run's precision (Dettmers et al., 2023), or LLM.int8()."""
    quantize = (plan.lora or {}).get("quantize", "none")
    if quantize == "none":
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if quantize == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=getattr(torch, plan.lora["compute_dtype"]),
        bnb_4bit_quant_storage=getattr(torch, plan.lora["quant_storage"]),
    )
