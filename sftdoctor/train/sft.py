"""The recipe each training process runs: setup -> train -> cleanup.

    python -m sftdoctor.train.sft RUN_DIR/resolved.json [--resume] [--stop-after N]

A thin layer over transformers + TRL's SFTTrainer (+ DeepSpeed through TrainingArguments): resolved.json
is the Plan `sftdoctor train` resolved and checked (sftdoctor.run.Plan); this file reads nothing else and
only applies it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sftdoctor.facts.trainer_inputs import load_data, load_tokenizer, peft_config, sft_config
from sftdoctor.run import Plan
from sftdoctor.run.data_source import named
from sftdoctor.run.layout import METRICS


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


# ---------------------------------------------------------------- setup


def load_model(plan: Plan):
    """The model in the plan's load dtype. Called after the SFTConfig exists: with ZeRO-3 in it, transformers
    builds the model under deepspeed.zero.Init, so each rank only ever holds its partition."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from sftdoctor.train import adapters

    dtype = getattr(torch, plan.load_dtype)
    common = {"attn_implementation": plan.attn_implementation, "trust_remote_code": plan.trust_remote_code}
    quantized = plan.lora is not None and plan.lora["quantize"] != "none"
    if plan.rehearsal or plan.weights == "random":
        config = AutoConfig.from_pretrained(plan.model_path, trust_remote_code=plan.trust_remote_code)
        if plan.rehearsal:
            from sftdoctor.facts.unused_params import shrink_all

            shrink_all(config, vocab_size=None)  # sub-configs too: a multimodal config has no top-level widths
        torch.manual_seed(plan.seed)
        net = AutoModelForCausalLM.from_config(config, dtype=dtype, **common)
        if adapters.needs_base(plan):
            adapters.save_base(plan, net)
    if quantized:
        net = adapters.load_quantized(plan, common, dtype)
    elif not (plan.rehearsal or plan.weights == "random"):
        net = AutoModelForCausalLM.from_pretrained(plan.model_path, dtype=dtype, **common)
    net.config.use_cache = False  # no KV cache in training: it also keeps packed samples apart (see packing check)
    if plan.liger_kernel:
        # Applied to the instance ourselves: TRL 1.16 deprecates its use_liger_kernel switch in favour of hub
        # kernels an offline cluster cannot fetch. Its fused linear cross-entropy is left to TRL's own LM head.
        from sftdoctor.train.compat import apply_liger_kernels

        apply_liger_kernels(net)
    return net


def partitioned_at_load(plan: Plan) -> bool:
    """Whether the model will be built under deepspeed.zero.Init: with ZeRO-3 once the SFTConfig exists (its
    HfTrainerDeepSpeedConfig is the weak reference transformers 5.24 reads). On GPUs accelerate initialises
    deepspeed.comm itself; on CPUs (use_cpu) it starts a plain gloo group, so zero.Init would see a world of
    one and refuse the batch sizes: DeepSpeed's communicator is started here, over that group."""
    from sftdoctor.train.compat import zero3_enabled

    if plan.zero_stage != 3 or not zero3_enabled():  # no import of DeepSpeed's integration otherwise
        return False
    if not plan.cuda:
        import deepspeed

        if not deepspeed.comm.is_initialized():
            deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    return True


def load_on_rank_0(plan: Plan, args) -> None:
    """FSDP's cpu_ram_efficient_loading, as accelerate expects it at load: transformers 5.x (`is_fsdp_enabled`,
    modeling_utils) reads it from these variables once the process group is up (which the trainer's arguments
    start) and leaves the weights of every rank but each node's rank 0 to accelerate, which moves them to the meta
    device and fills the shards from rank 0's (fsdp2_load_full_state_dict). accelerate sets these only when the
    Trainer exists, after the model has loaded."""
    from sftdoctor.run.fsdp import flag

    if plan.fsdp is None or not flag(plan.fsdp, "cpu_ram_efficient_loading"):
        return
    os.environ.update(ACCELERATE_USE_FSDP="true", FSDP_CPU_RAM_EFFICIENT_LOADING="true")
    _ = args.device  # starts the process group


def model_card(plan: Plan) -> str:
    """README.md of the run directory and of final/: what it was trained from, on what, and how to load it."""
    from sftdoctor.facts.configs import is_hub_id

    base = (
        f"initialised at random from the config of `{plan.model_path}`"
        if plan.weights == "random"
        else f"fine-tuned from `{plan.model_path}`"
    )
    front = ["---", "library_name: transformers", "tags: [trl, sft, sftdoctor]"]
    if plan.weights != "random" and is_hub_id(plan.model_path):
        front.append(f"base_model: {plan.model_path}")
    source = plan.data_source
    if source and source["kind"] == "hub":  # the card's link to the dataset on the hub
        front.append(f"datasets: [{source['name']}]")
    trained_on = named(source) if source else ", ".join(f"`{f}`" for f in plan.train_files)
    final = os.path.join(os.path.normpath(plan.output_dir), "final")
    return "\n".join(
        [
            *front,
            "---",
            "",
            f"# {Path(plan.output_dir).name}",
            "",
            f"A causal LM {base} by supervised fine-tuning (TRL SFTTrainer, run by sftdoctor): "
            f"{plan.precision}, global batch {plan.global_batch_size}, learning rate {plan.learning_rate:g} "
            f"({plan.lr_scheduler}), max_length {plan.max_length}, on {trained_on}.",
            *(_adapter_lines(plan) if plan.lora else []),
            "",
            "```python",
            *(["from peft import AutoPeftModelForCausalLM"] if plan.lora else []),
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f"model = {'AutoPeftModelForCausalLM' if plan.lora else 'AutoModelForCausalLM'}.from_pretrained({final!r})",
            f"tokenizer = AutoTokenizer.from_pretrained({final!r})",
            "```",
            "",
        ]
    )


def _adapter_lines(plan: Plan) -> list[str]:
    from sftdoctor.run.resolve import base_path
    from sftdoctor.train.adapters import MERGED, describe

    lines = ["", f"{describe(plan.lora)} over `{base_path(plan)}`: `final/` holds the adapter in peft's format."]
    if plan.lora["merge"]:
        lines.append(f"`{MERGED}/` holds base + adapter merged, for `AutoModelForCausalLM`.")
    return lines


def fires(drill: dict | None, kind: str, step: int) -> bool:
    """Whether a drill of this kind is asked for at this step (the one being computed) on this rank."""
    return bool(drill) and drill["kind"] == kind and step == drill["step"] and drill["rank"] in (None, rank())


def watched_trainer_class(drill: dict | None):
    """SFTTrainer that keeps the last micro-batch's loss and the step's inputs (no sync: references only) for
    the watchers, times each rank's batch fetches (train.stragglers), and injects the nan-loss and nan-row drills."""
    from trl import SFTTrainer

    from sftdoctor.train import callbacks, stragglers
    from sftdoctor.train.rows import keep

    class WatchedSFTTrainer(callbacks.MetricsInLogs, stragglers.TimedBatches, SFTTrainer):
        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            from sftdoctor.train.compat import fsdp_without_a_gpu

            if fsdp_without_a_gpu(self) and rank() == 0:
                print(
                    "sftdoctor: FSDP2 on CPU ranks: accelerate enables FSDP only on GPUs, so sftdoctor turned its "
                    "plugin on (fully_shard over gloo)",
                    flush=True,
                )

        def create_model_card(self, model_name=None, dataset_name=None, tags=None):
            # TRL 1.16 names a local or randomly initialised base "[None](https://huggingface.co/None)".
            if self.is_world_process_zero():
                Path(self.args.output_dir, "README.md").write_text(model_card(self.sftdoctor_plan), encoding="utf-8")

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:  # the step's micro-batches, for tracing a non-finite step to its rows
                keep(self, inputs)
                if fires(drill, "nan-row", self.state.global_step + 1) and len(self.sftdoctor_step_inputs) == 1:
                    self.poison_first_sequence(inputs)
            result = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
            loss = result[0] if return_outputs else result
            if model.training and fires(drill, "nan-loss", self.state.global_step + 1):
                loss = loss * float("nan")
                result = (loss, result[1]) if return_outputs else loss
            if model.training:
                self.sftdoctor_last_loss, self.sftdoctor_last_inputs = loss.detach(), inputs
                self.sftdoctor_tokens.add(inputs)
            return result

        def poison_first_sequence(self, inputs):
            """The nan-row drill: the first sequence of this micro-batch poisoned wherever it goes (watch.py);
            its tokens kept in RUN_DIR/drill-row.json, for a test to find its row on its own."""
            from sftdoctor.train.rows import sequences
            from sftdoctor.train.watch import poison_sequence

            _, tokens, _ = sequences(inputs)[0]
            poison_sequence(self.model, tokens)
            Path(self.args.output_dir, "drill-row.json").write_text(
                json.dumps({"rank": rank(), "tokens": tokens.tolist()})
            )
            print(
                f"sftdoctor: drill: rank {rank()}'s first sequence of step {self.state.global_step + 1} "
                f"({len(tokens)} tokens) poisoned: inf in its input embeddings",
                flush=True,
            )

    return WatchedSFTTrainer


# ---------------------------------------------------------------- train

DISTRIBUTED_CHECK_SECONDS = 3.0
SIGTERM_EXIT = 143  # the shell's 128 + 15, what the launcher returns too


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sftdoctor.train.sft")
    parser.add_argument("resolved", type=Path)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--stop-after", type=int)
    options = parser.parse_args(argv)
    plan = Plan.from_json(json.loads(options.resolved.read_text()))
    run_dir = Path(plan.output_dir)
    if not ranks_ready(plan, run_dir, options.resume):
        return 1
    setup(plan)
    tokenizer = load_tokenizer(plan)
    trainer, stopper = build_trainer(plan, run_dir, tokenizer, options.stop_after)
    code = train(trainer, stopper, run_dir, options.resume)
    if code is not None:
        return code
    if not options.stop_after:
        save(trainer, plan, tokenizer, run_dir / "final")
    shut_down()
    return 0


def ranks_ready(plan: Plan, run_dir: Path, resume: bool) -> bool:
    """Every rank, before the model loads: the same stack, a GPU each, all joined, exact all-reduces (the
    rehearsal's resume skips it: its first launch checked the same ranks seconds before)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not plan.distributed_check or (plan.rehearsal and resume):
        return True
    from sftdoctor.distributed.command import main as distributed_check

    return not distributed_check(
        plan.distributed_check_bound_s,
        DISTRIBUTED_CHECK_SECONDS,
        run_dir / "distributed",
        None,
        False,
        None,
        plugins=plan.plugins,
    )


def setup(plan: Plan) -> None:
    """The stack's logging (rank 0 warns, the others only err; no progress bars: ours draws one) and the seed."""
    import datasets
    import transformers
    from transformers import set_seed

    transformers.logging.set_verbosity_warning() if rank() == 0 else transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    set_seed(plan.seed)


def build_trainer(plan: Plan, run_dir: Path, tokenizer, stop_after: int | None):
    """(the SFTTrainer of the plan with sftdoctor's callbacks, the SIGTERM stopper among them)."""
    from sftdoctor.train import adapters, compat, noise

    train_rows, evaluation = load_data(plan)
    args = sft_config(plan, evaluation is not None)  # first, and kept: with ZeRO-3 the model loads partitioned
    partitioned = partitioned_at_load(plan)
    load_on_rank_0(plan, args)
    model = load_model(plan)
    noise.quiet_worker(model)
    if plan.repair_token_ids:
        from sftdoctor.train.embeddings import repair

        repair(model, plan.repair_token_ids, partitioned)
        if rank() == 0:
            print(
                f"sftdoctor: the untrained embedding rows of token ids {list(plan.repair_token_ids)} set to the mean "
                "of the trained rows ([model] repair_untrained_tokens)",
                flush=True,
            )
    if partitioned and rank() == 0:
        held = sum(getattr(p, "ds_tensor", p).numel() for p in model.parameters())  # p itself is empty now
        total = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        print(
            f"sftdoctor: ZeRO-3 partitioned the weights at load (zero.Init): rank 0 holds {held:,} of {total:,} "
            "parameters until DeepSpeed starts",
            flush=True,
        )
    if plan.data_shape == "messages" and not plan.assistant_only_loss and rank() == 0:
        print(
            "sftdoctor: the chat template has no {% generation %} markers and TRL cannot patch it: the loss "
            "covers every turn, not only the assistant's",
            flush=True,
        )
    with compat.capture_pack_input([]) as packed:
        trainer = watched_trainer_class(plan.drill)(
            model=model,
            args=args,
            train_dataset=train_rows,
            eval_dataset=evaluation,
            processing_class=tokenizer,
            peft_config=peft_config(plan),
        )
    # a batch's sequences trace back to these rows (train.rows); a stream is read once, in order: not traced
    trainer.sftdoctor_raw_rows = None if plan.streaming else train_rows
    trainer.sftdoctor_packed_from = packed[0] if plan.packing and packed else None
    if plan.lora is not None:
        adapters.trainable_in_fp32(trainer.model, plan)
    return trainer, add_callbacks(trainer, plan, run_dir, stop_after)


def add_callbacks(trainer, plan: Plan, run_dir: Path, stop_after: int | None):
    """Metrics, the one-line progress, complete checkpoints, the watchers, and last the SIGTERM stopper."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from sftdoctor.train import callbacks, stopping, stragglers, watch

    watching = not os.environ.get("SFTDOCTOR_NO_WATCH")  # off only for bench/watch_overhead.py's "off" runs
    trainer.sftdoctor_tokens, trainer.sftdoctor_plan = callbacks.TokenCounter(), plan
    trainer.sftdoctor_clock = clock = stragglers.RankClock(plan, rank()) if watching else None
    trainer.sftdoctor_metrics = callbacks.Metrics(trainer.sftdoctor_tokens, run_dir / METRICS, trainer, clock)
    trainer.add_callback(trainer.sftdoctor_metrics)
    trainer.remove_callback(PrinterCallback)  # prints raw log dicts; ours print one line instead
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(callbacks.progress())
    trainer.add_callback(callbacks.CompleteCheckpoints())
    if stop_after:
        trainer.add_callback(callbacks.StopAfter(stop_after))
    if watching:
        guard = watch.Guard(trainer, plan, run_dir)
        trainer.add_callback(guard)
        trainer.add_callback(clock)
        trainer.add_callback(stragglers.StragglerWatch(guard.reporter, trainer.sftdoctor_metrics, clock))
        if (plan.drill or {}).get("kind") in ("hang", "desync"):
            trainer.add_callback(watch.HangDrill(plan.drill, guard.watchdog))
    stopper = stopping.SaveOnSignal(trainer, plan)  # last: it reads the save time CompleteCheckpoints' barrier ends
    trainer.add_callback(stopper)
    return stopper


def train(trainer, stopper, run_dir: Path, resume: bool) -> int | None:
    """Training from the newest complete checkpoint on --resume or a restart; the exit code when it stopped
    early (a watcher, SIGTERM), None when it ran to its end."""
    from sftdoctor.run.checkpoints import newest_complete
    from sftdoctor.train import watch

    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    checkpoint = newest_complete(run_dir) if resume or restarted else None
    if checkpoint and rank() == 0:
        print(f"sftdoctor: resuming from {checkpoint}", flush=True)
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except watch.RunStopped as stop:
        return stop.code  # every rank stops here, before the optimizer step and before any save
    if stopper.stopped:  # SIGTERM: the checkpoint (if one fitted the grace) is the run's state, not a final model
        shut_down()
        return SIGTERM_EXIT
    return None


def save(trainer, plan: Plan, tokenizer, final: Path) -> None:
    """The final model (or adapter), its tokenizer and model card, and the merged model when asked for."""
    from sftdoctor.train import adapters

    stop_at_end_of_turn(trainer.model, trainer.processing_class)
    if plan.fsdp is not None:  # checkpoints stay sharded; the final model is gathered whole on rank 0
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    if plan.lora is not None:
        adapters.save_adapter(trainer, plan, final)
    else:
        trainer.save_model(str(final))
    if rank() == 0:
        tokenizer.save_pretrained(str(final))
        (final / "README.md").write_text(model_card(plan), encoding="utf-8")
        if plan.lora is not None and plan.lora["merge"]:
            merged = adapters.merge(plan, final)
            tokenizer.save_pretrained(str(merged))
            print(f"sftdoctor: base + adapter merged into {merged}", flush=True)


def stop_at_end_of_turn(model, tokenizer) -> None:
    """generate() stops where training taught the model to: the chat template's end-of-turn token joins
    generation_config's eos_token_id (a base model's is often <|endoftext|> while its turns end <|im_end|>)."""
    from sftdoctor.facts.trainer_inputs import end_of_turn

    config = getattr(model, "generation_config", None)
    eot = end_of_turn(tokenizer)
    if config is None or eot is None:
        return
    ids = (
        config.eos_token_id
        if isinstance(config.eos_token_id, list)
        else [config.eos_token_id]
        if config.eos_token_id is not None
        else []
    )
    if eot not in ids:
        config.eos_token_id = [*ids, eot]


def shut_down() -> None:
    """Every rank leaves the process group together: torn down by the interpreter's exit instead, gloo's and
    DeepSpeed's shared-memory threads can abort a finished rank ("terminate called without an active
    exception", exit -6, seen under ZeRO-3 on CPU)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def leave(code: int) -> None:
    """Exit without the interpreter's teardown. The work is done and written (the process group left, files
    closed and flushed); what teardown would still do is destroy gloo's, the TCPStore's and DeepSpeed's C++
    threads in whatever order the garbage collector picks, which aborts a finished rank now and then
    ("terminate called without an active exception", exit -6: seen after a rehearsal's last step under load)."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
