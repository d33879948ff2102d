"""Every fact a check can ask for, declared once: its name, the phase whose checks receive it, what its value
is, and, for a fact of the machine or of the run's configs, the probe that reads it.

A check asks for facts by naming them as its parameters. The check registry holds each check to this table
when it loads (as pluggy holds a hook implementation to its spec): a check that names a fact that does not
exist, or one that only another phase receives, is refused with a did-you-mean instead of never running.

Probes are named "module:function" under sftdoctor.facts and imported when a fact is first asked for, so
that reading this table costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("preflight", "runtime", "distributed", "postrun")
RUN_CONFIG = ("config",)
MODEL = ("config", "model_config")
DEEPSPEED = ("config", "deepspeed")


@dataclass(frozen=True)
class Fact:
    doc: str  # what the value is, one line
    phase: str = "preflight"  # the checks that receive it: preflight (`check`, the gate of `train`), runtime (the
    # watchers, during a run), distributed (`check --distributed`) or postrun (the curve readers)
    probe: str | None = None  # "module:function" under sftdoctor.facts, for a preflight fact
    inputs: tuple[str, ...] = ()  # Inputs fields it derives from: with one given, computed even in a replay
    why_missing: str = "not available on this machine"
    is_object: bool = True  # a JSON object when recorded (a replayed snapshot is held to it)


CATALOGUE: dict[str, Fact] = {
    # ---- the machine and its stack (recorded by `sftdoctor facts`, replayed with --facts)
    "packages": Fact("installed distributions: name -> version", probe="packages:probe_packages"),
    "package_requires": Fact(
        "what trl, transformers, peft and accelerate declare they need (Requires-Dist): name -> requirement strings",
        probe="requirements:probe_package_requires",
        why_missing="none of trl, transformers, peft, accelerate is installed",
    ),
    "torch_build": Fact(
        "torch's version and the CUDA/HIP it was built for",
        probe="packages:probe_torch_build",
        why_missing="torch is not installed",
    ),
    "deepspeed_defaults": Fact(
        "the installed DeepSpeed's version and its defaults the checks compare with",
        probe="packages:probe_deepspeed_defaults",
        why_missing="deepspeed is not installed",
    ),
    "flash_attn": Fact("flash-attn: installed, importable, its wheel", probe="packages:probe_flash_attn"),
    "bitsandbytes": Fact("bitsandbytes: installed, importable, its CUDA library", probe="packages:probe_bitsandbytes"),
    "gpus": Fact("the driver, its CUDA, and each GPU (NVML or nvidia-smi)", probe="gpus:probe_gpus"),
    "topology": Fact(
        "the GPU/NIC link matrix of `nvidia-smi topo -m`",
        probe="topology:probe_topology",
        inputs=("topology",),
        why_missing="no `nvidia-smi topo -m` available (give a saved one with --topology)",
    ),
    "nics": Fact(
        "InfiniBand/RoCE ports (`ibstat`)",
        probe="nics:probe_nics",
        why_missing="no `ibstat` (InfiniBand/RoCE tools) on this machine",
    ),
    "toolkit": Fact("CUDA_HOME and the nvcc found there", probe="system:probe_toolkit"),
    "env": Fact("the NCCL_*, TORCH_*, CUDA_* and launcher variables set", probe="system:probe_env"),
    "rendezvous": Fact(
        "the master address and port a launch would use, taken or free, and a free port",
        probe="system:probe_rendezvous",
    ),
    # Derived from the run config's output_dir and measured where the command runs (a replay of another machine's
    # facts judges the disk here: the one the run will write to when it is launched from here).
    "disk_space": Fact(
        "free and total bytes of the filesystem [training] output_dir will be on (statvfs)",
        probe="disk:probe_disk_space",
        inputs=RUN_CONFIG,
        why_missing="no run config given (--config), so no output_dir",
    ),
    "slurm": Fact(
        "the Slurm allocation this runs in: job, nodes, hosts",
        probe="slurm:probe_slurm",
        why_missing="not inside a Slurm allocation (SLURM_JOB_ID is not set)",
    ),
    "transformers_features": Fact(
        "what the installed transformers supports (by feature)",
        probe="stack:probe_transformers_features",
        why_missing="transformers is not installed",
    ),
    # ---- the run's configs (computed from the inputs given, replay or not)
    "run": Fact(
        "the run config (RunConfig)",
        probe="configs:probe_run_config",
        inputs=RUN_CONFIG,
        why_missing="no run config given (--config)",
        is_object=False,
    ),
    "model_config": Fact(
        "the model's config.json, summarised",
        probe="configs:probe_model_config",
        inputs=MODEL,
        why_missing="no model config given (--model-config, or [model].path in --config)",
    ),
    "deepspeed_config": Fact(
        "the DeepSpeed JSON",
        probe="configs:probe_deepspeed_config",
        inputs=DEEPSPEED,
        why_missing="no DeepSpeed config given (--deepspeed, or [deepspeed] config in --config)",
    ),
    "data": Fact(
        "the run's data files: rows, formats, problems",
        probe="data:probe_data",
        inputs=RUN_CONFIG,
        why_missing="no run config given (--config)",
    ),
    "chat_template": Fact(
        "the tokenizer's chat template, rendered",
        probe="tokenizer:probe_chat_template",
        inputs=RUN_CONFIG,
        why_missing="no run config, or its tokenizer has no files here",
    ),
    "packing_probe": Fact(
        "packed batches built by the real collator: isolated or not",
        probe="packing_probe:probe_packing",
        inputs=RUN_CONFIG,
        why_missing="packing is off, or no run config / model config to probe",
    ),
    "model_shape": Fact(
        "parameters and largest tensor, counted on the meta device",
        probe="model_shape:probe_model_shape",
        inputs=MODEL,
        why_missing="no model config, or an architecture sftdoctor counts only where there are GPUs",
    ),
    "lora_modules": Fact(
        "the model's linear layers as peft sees them, and the adapters [lora] builds",
        probe="lora_modules:probe_lora_modules",
        inputs=MODEL,
        why_missing="no [lora] in the run config, or no model config.json to list its layers from",
    ),
    "unused_parameters": Fact(
        "the trainable parameters one text-only training step on the shrunk model leaves "
        "without a gradient (what DDP's reducer would wait for)",
        probe="unused_params:probe_unused_parameters",
        inputs=MODEL,
        why_missing="not a DDP run (one process, or DeepSpeed), or no model config.json to build the model from",
    ),
    "token_rows": Fact(
        "the base checkpoint's embedding rows of the tokens the chat template writes (safetensors slices)",
        probe="token_rows:probe_token_rows",
        inputs=MODEL,
        why_missing="needs a run config whose model has pretrained safetensors weights here and a "
        "chat template that writes added tokens",
    ),
    "contamination": Fact(
        "the training rows' n-gram overlap (13 words; 25 or 50 characters in scripts without "
        "spaces) with the [eval] tasks' documents and the eval files",
        probe="contamination:probe_contamination",
        inputs=RUN_CONFIG,
        why_missing="needs a run config with [eval] tasks or a [data] eval file",
    ),
    "token_ids": Fact(
        "the token ids of every training and eval row, as the run's tokenizer and chat template give "
        "them, against the model's vocab_size (embedding rows)",
        probe="token_ids:probe_token_ids",
        inputs=RUN_CONFIG,
        why_missing="needs a run config whose model config.json (vocab_size) and tokenizer files are here",
    ),
    "data_prep": Fact(
        "the time rank 0 spends preparing the data (TRL's SFTTrainer on a sample of the rows, extrapolated)",
        probe="data_prep:probe_data_prep",
        inputs=RUN_CONFIG,
        why_missing="needs a run config of 2+ processes whose model has a config.json and tokenizer here",
    ),
    "eval_tasks": Fact(
        "the [eval] tasks, found in lm-eval's registry",
        probe="eval_tasks:probe_eval_tasks",
        inputs=RUN_CONFIG,
        why_missing="no [eval] in the run config (or no --config)",
    ),
    "launch_inputs": Fact(
        "what `train` needs beyond the config's keys, refused before anything runs: the run "
        "directory can be made, the [report] backend is installed, hub models are cached or reachable",
        probe="launch_inputs:probe_launch_inputs",
        inputs=RUN_CONFIG,
        why_missing="no run config given (--config)",
    ),
    "plan": Fact(
        "the run's settings, decided once (run.resolve's Plan)",
        probe="configs:probe_plan",
        inputs=RUN_CONFIG,
        why_missing="no run config given (--config)",
        is_object=False,
    ),
    "training_targets": Fact(
        "the labels the run's trainer builds: EOS, BOS, the masked prompt, generate()'s stop",
        probe="targets_probe:probe_training_targets",
        inputs=RUN_CONFIG,
        why_missing="the run's model has no config.json and tokenizer files here to build its trainer from",
    ),
    "resume_checkpoint": Fact(
        "the checkpoint --resume would load: its DeepSpeed world size and ZeRO stage (file names)",
        probe="resume_checkpoint:probe_resume_checkpoint",
        inputs=RUN_CONFIG,
        why_missing="no complete checkpoint in the run's output_dir: nothing to resume",
    ),
    # ---- one moment of a run (sftdoctor.train.watch passes them to the runtime checks)
    "step_stats": Fact(
        "one optimizer step, before it is taken: finite or not, loss, gradient norm, ranks; when a "
        "non-finite one stops the run, its rows and their fp32 re-runs",
        phase="runtime",
    ),
    "log_stats": Fact("a logged loss with its recent history", phase="runtime"),
    "scale_stats": Fact("fp16 dynamic loss scaling: the scale and the steps it skipped", phase="runtime"),
    "hang": Fact(
        "the watchdog's report of a stall: each rank's step, phase and stack, and the flight recorder's "
        "dumps read by torch's analyzer",
        phase="runtime",
    ),
    # ---- every rank of a job (`check --distributed`)
    "cluster": Fact(
        "each rank's record, who joined, and the all-reduce sweep",
        phase="distributed",
        why_missing="only under `sftdoctor check --distributed` (every rank of a job)",
    ),
    # ---- a finished or stopped run (`sftdoctor report`, the end of `train`)
    "curves": Fact("a run's logged series, its schedule and checkpoints (facts.run_records)", phase="postrun"),
}


def fact_names(phase: str) -> list[str]:
    return [name for name, fact in CATALOGUE.items() if fact.phase == phase]


def unavailable_to(name: str, phase: str) -> str | None:
    """Why a check of `phase` cannot ask for the fact `name`, or None."""
    from sftdoctor.errors import did_you_mean

    fact = CATALOGUE.get(name)
    if fact is None:
        return f"asks for the fact {name!r}, which does not exist{did_you_mean(name, CATALOGUE)}"
    if fact.phase != phase:
        return f"asks for the fact {name!r}, which only {fact.phase} checks receive, not {phase} ones"
    return None
