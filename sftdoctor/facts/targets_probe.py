"""What the trainer will optimise: a sample of the run's own rows put through the very tokenizer, chat template,
masks, packing and collator the run uses (a real SFTTrainer over a shrunk model of the run's architecture,
built from the same Plan as the workers' by facts.trainer_inputs), read back token by token.

Runs in a child process, so `check` imports none of the training stack. Reports per sample whether its last
target is a stop token (the end-of-sequence token, or the one the chat template closes an assistant turn
with), whether a stop token is there but masked out, how many BOS tokens it starts with, how many of its tokens
are targets and whether it was cut at max_length; and the first sample decoded with its targets marked.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached, folder_files

# Plan fields the probe's answer does not depend on: it builds the trainer and collates every sampled row in one
# batch, on one CPU process, without LoRA, DeepSpeed, FSDP or any step; so neither the optimizer and schedule nor the
# batch, the world, the adapters or the watchers change what the collator gives the model.
UNSEEN = frozenset(
    {
        "train_files",
        "eval_files",
        "model_path",
        "tokenizer_path",
        "reasons",
        "master_port",
        "master_addr",
        "learning_rate",
        "lr_scheduler",
        "lr_scheduler_kwargs",
        "warmup",
        "warmup_steps",
        "weight_decay",
        "max_grad_norm",
        "epochs",
        "total_steps",
        "logging_steps",
        "save_steps",
        "save_total_limit",
        "eval_steps",
        "hang_timeout_s",
        "ddp_timeout_s",
        "stop_grace_s",
        "join_timeout_s",
        "on_nan",
        "max_skips",
        "loss_spike_factor",
        "per_device_batch_size",
        "global_batch_size",
        "gradient_accumulation_steps",
        "nearest_global_batch_sizes",
        "nproc_per_node",
        "nnodes",
        "node_rank",
        "world_size",
        "max_restarts",
        "distributed_check",
        "distributed_check_bound_s",
        "zero_stage",
        "offload_optimizer",
        "offload_params",
        "deepspeed_source",
        "fsdp",
        "fsdp_source",
        "fsdp_replicate",
        "checkpointing_arg",
        "checkpointing_reentrant",
        "load_dtype",
        "weights",
        "lora",
        "evaluation",
        "data_rows",
        "eval_fraction",
        "length_grouping",
        "rehearse",
        "rehearsal",
        "drill",
        "plugins",
        "moe",
        "liger_available",
    }
)
SAMPLE_ROWS = 64  # per data file: the first ones, plus its longest and shortest rows
SHOWN_CHARS = 1200
TIMEOUT_S = 600
NO_TEMPLATE = "chat rows and no chat template to render them"


@fact(
    "training_targets",
    "the labels the run's trainer builds: EOS, BOS, the masked prompt, generate()'s stop",
    inputs=RUN_CONFIG,
    why_missing="the run's model has no config.json and tokenizer files here to build its trainer from",
    needs=("plan",),
)
def probe_training_targets(facts, plan) -> dict[str, Any] | None:
    from sftdoctor.facts.tokenizer import tokenizer_folder

    if facts.get("data") is None or not facts.get("model_config"):
        return None
    folder = tokenizer_folder(plan.tokenizer_path)
    if folder is None or not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None  # no tokenizer here to tokenize with: nothing to prove (the worker would fail to load it)
    if plan.data_shape == "messages" and not (facts.get("chat_template") or {"has_template": True})["has_template"]:
        return {"error": NO_TEMPLATE}  # the trainer cannot be built: the chat-template check says why
    request = probe_plan(plan, "").to_json()
    files = (
        [Path(name) for name in plan.train_files]
        + folder_files(tokenizer_folder(plan.model_path))
        + folder_files(folder)
    )
    # Paths are keyed by their files' content; nothing in UNSEEN changes what the trainer's collator gives the
    # model, so every trial of a learning-rate or batch-size sweep, and a rerun on more GPUs, reads one answer back.
    keyed = {k: v for k, v in request.items() if k not in UNSEEN}
    return cached("targets", keyed, files, lambda: _child(plan))


def _child(plan) -> dict[str, Any]:
    return in_child("sftdoctor.facts.targets_probe", plan.to_json(), "the training-targets probe", TIMEOUT_S)


def sample_rows(files: tuple[str, ...]) -> list[Any]:
    """The first SAMPLE_ROWS rows of each file, and its longest and shortest (by their JSON text)."""
    from sftdoctor.facts.data import rows

    picked = []
    for name in files:
        first, longest, shortest = [], None, None
        for _, row in rows(Path(name)):
            size = len(json.dumps(row, default=str))
            if len(first) < SAMPLE_ROWS:
                first.append(row)
            if longest is None or size > longest[0]:
                longest = (size, row)
            if shortest is None or size < shortest[0]:
                shortest = (size, row)
        picked += first + [r for _, r in (longest, shortest) if r is not None and all(r is not f for f in first)]
    return picked


def probe_plan(plan, folder: str):
    """The run's plan as the probe runs it: on this CPU, for one step, writing only into `folder`."""
    return dataclasses.replace(
        plan,
        output_dir=folder,
        deepspeed=None,
        fsdp=None,  # one process: transformers refuses FSDP outside a distributed run, and sharding changes no target
        cuda=False,
        precision="fp32",
        report_to="none",
        max_steps=1,
        checkpointing=False,
        liger_kernel=False,
        data_limit=None,
        attn_implementation="sdpa" if plan.attn_implementation.startswith("flash") else plan.attn_implementation,
    )


def samples(batch) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) of each sample of a collated batch: one per row, or split at the position ids'
    restarts when the rows are packed padding-free."""
    ids, labels = batch["input_ids"].tolist(), batch["labels"].tolist()
    out = []
    if "position_ids" in batch and "attention_mask" not in batch:
        for row_ids, row_labels, positions in zip(ids, labels, batch["position_ids"].tolist()):
            starts = [i for i, p in enumerate(positions) if p == 0] + [len(positions)]
            out += [(row_ids[a:b], row_labels[a:b]) for a, b in zip(starts, starts[1:]) if b > a]
        return out
    masks = batch["attention_mask"].tolist()
    for row_ids, row_labels, mask in zip(ids, labels, masks):
        n = sum(mask)
        out.append((row_ids[:n], row_labels[:n]))
    return out


def marked(tokenizer, ids: list[int], labels: list[int]) -> str:
    """The sample decoded with its target spans in [[ ]]."""
    parts, span, target = [], [], None
    for token, label in zip(ids, labels):
        is_target = label != -100
        if target is not None and is_target != target:
            text = tokenizer.decode(span)
            parts.append(f"[[{text}]]" if target else text)
            span = []
        span.append(token)
        target = is_target
    if span:
        text = tokenizer.decode(span)
        parts.append(f"[[{text}]]" if target else text)
    return "".join(parts)[:SHOWN_CHARS]


def full_length(tokenizer, row: dict[str, Any], shape: str) -> int:
    """Tokens of a row before truncation (what max_length cuts)."""
    from sftdoctor.facts.trainer_inputs import row_text

    return len(tokenizer(row_text(row, tokenizer, shape), add_special_tokens=False)["input_ids"]) + 1


def targets(plan_json: dict[str, Any]) -> dict[str, Any]:
    import tempfile  # here: the catalogue imports this module for every `check`

    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl import SFTTrainer

    from sftdoctor.facts.packing_probe import shrink
    from sftdoctor.facts.tokenizer import read_template
    from sftdoctor.facts.trainer_inputs import as_trained, end_of_turn, load_tokenizer, sft_config
    from sftdoctor.run import Plan

    plan = Plan.from_json(plan_json)
    tokenizer = load_tokenizer(plan)
    rows = as_trained(Dataset.from_list(sample_rows(plan.train_files)), plan)
    lengths = [full_length(tokenizer, row, plan.data_shape) for row in rows]
    config = AutoConfig.from_pretrained(plan.model_path, trust_remote_code=plan.trust_remote_code)
    shrink(config, vocab_size=None)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        probe = probe_plan(plan, folder)
        args = sft_config(probe, has_eval=False)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=probe.attn_implementation)
        trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer)
        processed = trainer.train_dataset
        batch = trainer.data_collator([processed[i] for i in range(len(processed))])
        tokenizer = trainer.processing_class
        tokenizer.save_pretrained(Path(folder) / "saved")  # as sft.py saves it into final/
        saved = read_template(Path(folder) / "saved")
    templates = _templates(plan, tokenizer, rows, saved)
    answers = _answers(rows, plan.data_shape)
    eot, eos = end_of_turn(tokenizer), tokenizer.eos_token_id
    stops = sorted({i for i in (eos, eot) if i is not None})
    collated = samples(batch)
    found = [_sample(tokenizer, ids, labels, stops, answers) for ids, labels in collated]
    first_ids, first_labels = collated[0] if collated else ([], [])
    return {
        "samples": found,
        "rows": len(rows),
        "max_length": plan.max_length,
        "packed": plan.packing,
        "shape": plan.data_shape,
        "assistant_only_loss": plan.assistant_only_loss,
        "eos_token": tokenizer.eos_token,
        "eos_token_id": eos,
        "pad_token_id": tokenizer.pad_token_id,
        "end_of_turn_id": eot,
        "end_of_turn": tokenizer.convert_ids_to_tokens(eot) if eot is not None else None,
        "bos_token_id": tokenizer.bos_token_id,
        "full_lengths": lengths,
        "generation_eos": _generation_eos(plan.model_path),
        "first_sample": marked(tokenizer, first_ids, first_labels),
        "chat_template": plan.chat_template,
        **templates,
    }


def _sample(tokenizer, ids: list[int], labels: list[int], stops: list[int], answers) -> dict[str, Any]:
    """What the collator made of one sample: its tokens and targets, and how its answer ends."""
    targets = [i for i, label in enumerate(labels) if label != -100]
    # the last target that is not whitespace: a template may train the newline after its end-of-turn token
    last = next((i for i in reversed(targets) if ids[i] in stops or tokenizer.decode([ids[i]]).strip()), -1)
    return {
        "tokens": len(ids),
        "targets": len(targets),
        "last_target_is_stop": last >= 0 and ids[last] in stops,
        # a stop token after the answer that is not a target: masked (pad = eos masked by id)
        "stop_masked": any(token in stops for token in ids[last + 1 :]),
        "leading_bos": _leading(ids, tokenizer.bos_token_id),
        "stray_targets": _stray(tokenizer, ids, labels, answers) if answers else [],
    }


def _templates(plan, tokenizer, rows, saved: str | None) -> dict[str, Any]:
    """Chat rows rendered with the template the trainer tokenized them with, against the one saved with the
    model (what inference will use) and, when the plan trains with another template, the tokenizer's own:
    how many rows differ."""
    if plan.data_shape != "messages" or not tokenizer.chat_template:
        return {}
    from trl.chat_template_utils import get_training_chat_template  # public API (TRL 1.16)

    from sftdoctor.facts.tokenizer import GENERATION, marked_templates, read_template, tokenizer_folder

    trained = tokenizer.chat_template
    if plan.assistant_only_loss and not GENERATION.search(trained):
        trained = get_training_chat_template(tokenizer) or trained  # what TRL tokenizes with instead

    def differ(template: str | None) -> int:
        if template is None:
            return len(rows)
        return sum(
            tokenizer.apply_chat_template(row["messages"], chat_template=template, tokenize=False)
            != tokenizer.apply_chat_template(row["messages"], chat_template=trained, tokenize=False)
            for row in rows
        )

    found = {"saved_template_differs": differ(saved)}
    if trained != tokenizer.chat_template:  # the training template's file, for the fix to name
        found["trained_template"] = next(
            (str(path) for _, _, path in marked_templates() if path.read_text(encoding="utf-8") == trained), None
        )
    if plan.chat_template:
        folder = tokenizer_folder(plan.tokenizer_path)
        found["own_template_differs"] = differ(read_template(folder) if folder else None)
    return found


def _answers(rows, shape: str) -> list[str]:
    """What the loss should cover, as text: the assistant turns (messages) or the completions."""
    out = []
    for row in rows:
        turns = row.get("messages") or (row.get("completion") if isinstance(row.get("completion"), list) else None)
        if turns:
            out += [t.get("content") or "" for t in turns if t.get("role") == "assistant"]
        elif shape == "prompt_completion" and isinstance(row.get("completion"), str):
            out.append(row["completion"])
    return out if shape != "text" else []


def _stray(tokenizer, ids: list[int], labels: list[int], answers: list[str]) -> list[str]:
    """Target spans (special tokens left out) that neither lie in an answer nor hold one (a reasoning scaffold
    around the answer, like Qwen3's empty <think></think>, is the assistant's to write): text the loss should
    not cover."""
    spans, span = [], []
    for token, label in zip(ids + [None], labels + [-100]):
        if label != -100:
            span.append(token)
        elif span:
            spans.append(span)
            span = []
    stray = []
    for span in spans:
        text = tokenizer.decode(span, skip_special_tokens=True).strip()
        if text and not any(text in answer or answer in text for answer in answers if answer):
            stray.append(text[:80])
    return stray[:3]


def _leading(ids: list[int], bos: int | None) -> int:
    count = 0
    while bos is not None and count < len(ids) and ids[count] == bos:
        count += 1
    return count


def _generation_eos(model_path: str) -> list[int] | None:
    """eos_token_id of the model's generation_config.json, as generate() reads it (an int or a list)."""
    from sftdoctor.facts.tokenizer import tokenizer_folder

    folder = tokenizer_folder(model_path)
    try:
        value = json.loads((folder / "generation_config.json").read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return [value] if isinstance(value, int) else value if isinstance(value, list) else None


if __name__ == "__main__":
    serve(targets)
