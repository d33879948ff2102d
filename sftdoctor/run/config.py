"""The run config (TOML) of `sftdoctor train`: typed, frozen records with the defaults in one place.

Every key is a dataclass field: its default is the default, its metadata says what it accepts. Each
section remembers which keys the user gave (`given`), so a default can be told from a choice (a busy
default port is sftdoctor's to move; a port the user set is not). Validation reports every problem at
once, one line each: file, [section].key, what was expected, and a did-you-mean for unknown names.
Paths are relative to the TOML file. Importing this module is cheap (no torch).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from sftdoctor.errors import InputError, InputErrors, did_you_mean, not_a_file, parse_problem, read_text
from sftdoctor.run import data_source
from sftdoctor.run.data_source import FILES, FOLDER, classify


@dataclass(frozen=True)
class Key:
    expected: str  # said in errors: "one of bf16, fp16, fp32, auto"
    accepts: Callable[[Any], bool]
    required: bool = False
    path: str = ""  # "file": must exist, relative to the TOML; "files": one or a list; "dir": output, relative;
    # "data": "files", or one folder laid out as a hub dataset, or a hub dataset id (run.data_source.classify)
    local_or_hub: bool = False  # a folder next to the config file if one exists, else kept (hub id)
    doc: str = ""


def key(expected: str, accepts: Callable[[Any], bool], default: Any = None, **kw: Any) -> Any:
    return field(default=default, metadata={"key": Key(expected, accepts, **kw)})


def _choice(*choices: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v in choices


def _int(low: int | None = None, high: int | None = None, auto: bool = False) -> Callable[[Any], bool]:
    def accepts(v: Any) -> bool:
        if auto and v == "auto":
            return True
        return (
            isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low) and (high is None or v <= high)
        )

    return accepts


def _float(
    low: float, high: float | None = None, low_open: bool = False, high_open: bool = False
) -> Callable[[Any], bool]:
    def accepts(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        above = v > low if low_open else v >= low
        below = high is None or (v < high if high_open else v <= high)
        return above and below

    return accepts


def _str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _strs(v: Any) -> bool:
    return _str(v) or (isinstance(v, list) and len(v) > 0 and all(_str(x) for x in v))


def _auto_or_bool(v: Any) -> bool:
    return v == "auto" or isinstance(v, bool)


@dataclass(frozen=True)
class Section:
    given: frozenset[str] = field(default=frozenset(), repr=False)  # the keys the user wrote

    def is_given(self, name: str) -> bool:
        return name in self.given


@dataclass(frozen=True)
class Model(Section):
    path: str = key(
        "a local folder or a hub id",
        _str,
        required=True,
        local_or_hub=True,
        doc="model to fine-tune: a folder with config.json (relative to this file), or a hub id (read from the "
        "local Hugging Face cache when there)",
    )
    weights: str = key(
        "one of pretrained, random",
        _choice("pretrained", "random"),
        "pretrained",
        doc="random = initialise from config.json alone (tiny examples, smoke tests)",
    )
    tokenizer: str | None = key("a local folder or a hub id", _str, local_or_hub=True, doc="default: the model path")
    precision: str = key(
        "one of auto, bf16, fp16, fp32",
        _choice("auto", "bf16", "fp16", "fp32"),
        "auto",
        doc="auto = bf16 unless a GPU lacks it (then fp16); fp32 on a machine without GPUs",
    )
    attn_implementation: str = key(
        "one of auto, flash_attention_2, sdpa, eager",
        _choice("auto", "flash_attention_2", "sdpa", "eager"),
        "auto",
        doc="auto = flash_attention_2 where installed and every GPU is Ampere or newer, else sdpa",
    )
    trust_remote_code: bool = key(
        "true or false", _bool, False, doc="let transformers run the model repository's own code"
    )
    repair_untrained_tokens: bool = key(
        "true or false",
        _bool,
        False,
        doc="set the embedding rows (and an untied head's) of the chat template's tokens that the base "
        "checkpoint never trained (all zeros) to the mean of the trained rows, "
        "at load (`sftdoctor explain untrained-tokens`)",
    )
    chat_template: str | None = key(
        "a path to a Jinja chat template (.jinja)",
        _str,
        path="file",
        doc="train (and save the model) with this template instead of the tokenizer's "
        "own; default: the tokenizer's, or a copy with {% generation %} markers "
        "that renders the same",
    )


@dataclass(frozen=True)
class Data(Section):
    train: tuple[str, ...] = key(
        "a JSONL/JSON/Parquet file or a list of them, a folder laid out as a hub dataset, or a hub dataset id "
        "(org/name)",
        _strs,
        (),
        required=True,
        path="data",
        doc="rows with `messages` (chat), `prompt`+`completion`, or `text`; a folder (relative to this file) or "
        "an org/name id is read through the datasets library (`subset`, `split`), an id from the local cache "
        "when offline (HF_HUB_OFFLINE=1)",
    )
    subset: str | None = key(
        "a subset (config) name of the hub dataset",
        _str,
        doc="with a hub dataset in `train`: its config (datasets' `name`); default: the dataset's default",
    )
    split: str = key(
        "a split name of the hub dataset", _str, "train", doc="with a hub dataset in `train`: the split trained on"
    )
    revision: str | None = key(
        "a branch, tag or commit of the hub dataset",
        _str,
        doc="with an org/name id in `train`: the revision to download (a local folder has none: refused there)",
    )
    eval_split: str | None = key(
        "a split name of the hub dataset",
        _str,
        doc="with a hub dataset in `train`: evaluate on this split of it (instead of `eval` or `eval_fraction`)",
    )
    eval: tuple[str, ...] = key(
        "a JSONL/JSON/Parquet file or a list of them",
        _strs,
        (),
        path="files",
        doc="the eval split (or `eval_fraction`, not both)",
    )
    streaming: bool = key(
        "true or false",
        _bool,
        False,
        doc="train on an IterableDataset read from the files as it goes (no Arrow copy of a large set prepared "
        "before step 0; rows shuffled within a buffer, not globally); needs [training] max_steps; every row is "
        "still checked before launch",
    )
    eval_fraction: float = key(
        "a number from 0 to 0.5",
        _float(0.0, 0.5),
        0.0,
        doc="hold out this share of train as the eval split (instead of `eval`)",
    )
    format: str = key(
        "one of auto, messages, sharegpt, alpaca, prompt_completion, text",
        _choice("auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text"),
        "auto",
        doc="auto = recognised from the first row; sharegpt (`conversations` of `from`/`value`) and alpaca "
        "(`instruction`, `input`, `output`, `system`) rows train as messages; every row is checked before launch "
        "(file and line named)",
    )
    max_length: int = key(
        "an integer from 16 to 1048576", _int(16, 2**20), 2048, doc="tokens per sample (per packed row)"
    )


@dataclass(frozen=True)
class Training(Section):
    global_batch_size: int | None = key(
        "an integer from 1 to 16777216",
        _int(1, 2**24),
        doc="sequences per optimizer step over all GPUs = per_device x accumulation x "
        "world size (default: per_device x world size)",
    )
    per_device_batch_size: int = key("an integer from 1 to 65536", _int(1, 2**16), 1)
    learning_rate: float = key("a number > 0 and <= 1", _float(0.0, 1.0, low_open=True), 2e-5)
    lr_scheduler: str = key(
        "one of cosine_with_min_lr, cosine, linear, constant_with_warmup",
        _choice("cosine_with_min_lr", "cosine", "linear", "constant_with_warmup"),
        "cosine_with_min_lr",
    )
    min_lr_rate: float = key(
        "a number from 0 to 1", _float(0.0, 1.0), 0.1, doc="cosine_with_min_lr floor as a share of learning_rate"
    )
    min_lr: float | None = key("a number >= 0", _float(0.0), doc="cosine_with_min_lr floor as an absolute rate")
    warmup_ratio: float = key(
        "a number from 0 up to (not including) 1",
        _float(0.0, 1.0, high_open=True),
        0.03,
        doc="share of the run spent warming up (unless warmup_steps)",
    )
    warmup_steps: int | None = key("an integer from 0 to 1000000000", _int(0, 10**9))
    weight_decay: float = key("a number >= 0", _float(0.0), 0.0)
    max_grad_norm: float = key("a number >= 0", _float(0.0), 1.0, doc="0 turns clipping off")
    epochs: float = key("a number > 0 and <= 10000", _float(0.0, 1e4, low_open=True), 1)
    max_steps: int | None = key("an integer from 1 to 1000000000", _int(1, 10**9), doc="overrides epochs")
    gradient_checkpointing: bool | str = key(
        'true, false or "auto"',
        _auto_or_bool,
        "auto",
        doc="non-reentrant activation checkpointing; auto = off where the "
        "memory plan fits without it (and without GPUs), else on",
    )
    packing: bool | str = key(
        'true, false or "auto"',
        _auto_or_bool,
        "auto",
        doc="auto = on with a varlen attention kernel (flash-attn) when a probe proves packed "
        "samples stay isolated; else one sample per row, batched by length; true makes unproven isolation an error",
    )
    liger_kernel: bool | str = key('true, false or "auto"', _auto_or_bool, "auto", doc="auto = on CUDA when installed")
    seed: int = key("an integer from 0 to 4294967295", _int(0, 2**32 - 1), 42, doc="also the data order")
    logging_steps: int = key("an integer from 1 to 1000000000", _int(1, 10**9), 10)
    save_steps: int = key("an integer from 1 to 1000000000", _int(1, 10**9), 500)
    save_total_limit: int = key("an integer from 1 to 1000000000", _int(1, 10**9), 2)
    eval_steps: int | None = key("an integer from 1 to 1000000000", _int(1, 10**9), doc="default: save_steps")
    output_dir: str = key("a folder path", _str, "", path="dir", doc="the run directory (default runs/<config name>)")


@dataclass(frozen=True)
class DeepSpeed(Section):
    config: str | None = key(
        "a path to a DeepSpeed JSON",
        _str,
        path="file",
        doc='use this DeepSpeed JSON as is ("auto" values are filled from the run)',
    )
    zero_stage: int | None = key("an integer 0 to 3", _int(0, 3), doc="generate a DeepSpeed JSON for this ZeRO stage")
    offload_optimizer: bool = key("true or false", _bool, False, doc="ZeRO-Offload optimizer states to CPU")
    offload_params: bool = key("true or false", _bool, False, doc="ZeRO-3: offload parameters to CPU")


@dataclass(frozen=True)
class Fsdp(Section):
    """[fsdp]: present (even empty) = shard with PyTorch's FSDP2 (fully_shard) through transformers/accelerate;
    exclusive with [deepspeed]. The layer class to wrap is the model's own (its _no_split_modules), the mixed
    precision the run's, activation checkpointing FSDP's when [training] gradient_checkpointing turns it on."""

    config: str | None = key(
        "a path to an accelerate FSDP config (YAML)",
        _str,
        path="file",
        doc="judge this accelerate config (`sftdoctor check --fsdp`) and train with its fsdp_config as is",
    )
    sharding: str = key(
        "one of full, hybrid",
        _choice("full", "hybrid"),
        "full",
        doc="full = every rank holds 1/world of the states; hybrid = shard within a node, replicate across nodes",
    )
    reshard_after_forward: bool = key(
        "true or false",
        _bool,
        True,
        doc="free each layer's gathered weights after its forward (false: keep them to the backward, ZeRO-2-like: "
        "less communication, more memory)",
    )
    offload: bool = key(
        "true or false", _bool, False, doc="keep parameters, gradients and optimizer states in host memory"
    )


@dataclass(frozen=True)
class Launch(Section):
    nproc_per_node: int | str = key(
        'an integer from 1 to 1024 or "auto"',
        _int(1, 1024, auto=True),
        "auto",
        doc="auto = every visible GPU (1 on a CPU-only machine)",
    )
    nnodes: int = key("an integer from 1 to 65536", _int(1, 2**16), 1)
    node_rank: int | str = key(
        'an integer >= 0 or "auto"',
        _int(0, auto=True),
        "auto",
        doc="this node's rank: node 0 hosts the rendezvous; auto = 0 on the host master_addr "
        "names, another rank elsewhere (torchrun assigns it), so every node runs the "
        "same config",
    )
    master_addr: str = key("a host name or address", _str, "127.0.0.1")
    master_port: int | str = key(
        'a port 1-65535 or "auto"',
        _int(1, 65535, auto=True),
        29500,
        doc="default 29500, or a free port when 29500 is taken on a single node; auto = a free port (one node "
        "only); a port you set that is taken is an error",
    )
    max_restarts: int = key(
        "an integer from 0 to 1000",
        _int(0, 1000),
        0,
        doc="torchrun restarts the worker group after a failed rank; training resumes from the newest complete "
        "checkpoint",
    )
    join_timeout_s: int = key(
        "an integer from 5 to 86400",
        _int(5, 86400),
        600,
        doc="how long the nodes wait for each other at the rendezvous (torchrun's join_timeout)",
    )
    stop_grace_s: int | str = key(
        'an integer from 1 to 86400 or "auto"',
        _int(1, 86400, auto=True),
        "auto",
        doc="after SIGTERM, the time to save a checkpoint and stop; auto = [slurm] signal_s "
        "inside a Slurm job, else 30",
    )
    distributed_check: bool = key(
        "true or false",
        _bool,
        True,
        doc="with 2+ processes, every rank runs `check --distributed` before the model loads (a few seconds): "
        "another stack on a node, two ranks on one GPU, a rank that never joins or wrong all-reduce sums stop the run",
    )
    rehearse: bool = key(
        "true or false",
        _bool,
        True,
        doc="before a multi-process or DeepSpeed run, rehearse it on the shrunk model with the same launcher, "
        "DeepSpeed config, data path and scheduler, a save and a resume (--no-rehearse skips it); a failing "
        "rehearsal stops the run with its root cause, triaged from RUN_DIR/rehearsal.log",
    )


@dataclass(frozen=True)
class Report(Section):
    to: str = key(
        "one of none, tensorboard, wandb",
        _choice("none", "tensorboard", "wandb"),
        "none",
        doc="where the trainer also logs (the backend must be installed; wandb without credentials logs offline)",
    )


@dataclass(frozen=True)
class Watch(Section):
    on_nan: str = key(
        "one of stop, skip",
        _choice("stop", "skip"),
        "stop",
        doc="stop: every rank stops, no checkpoint of poisoned weights; skip: drop that update",
    )
    max_skips: int = key(
        "an integer from 1 to 1000000", _int(1, 10**6), 10, doc="with on_nan = skip: stop after this many"
    )
    hang_timeout_s: float = key(
        "a number of seconds from 5 to 86400",
        _float(5.0, 86400.0),
        300,
        doc="no progress for this long is a hang (NCCL's own timeout is 10 minutes)",
    )
    loss_spike_factor: float = key(
        "a number > 0",
        _float(0.0, low_open=True),
        6.0,
        doc="a logged loss this many robust deviations above the recent median is a spike",
    )


def _modules(v: Any) -> bool:
    return v == "all-linear" or (isinstance(v, list) and len(v) > 0 and all(_str(x) for x in v))


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(_str(x) for x in v)


@dataclass(frozen=True)
class Lora(Section):
    """[lora]: present = train adapters (peft's LoRA) instead of every weight; absent = full fine-tune."""

    r: int = key("an integer from 1 to 4096", _int(1, 4096), 16, doc="the adapters' rank")
    alpha: float = key(
        "a number > 0", _float(0.0, low_open=True), 32, doc="scaling: alpha / r (alpha / sqrt(r) with rslora)"
    )
    dropout: float = key("a number from 0 up to (not including) 1", _float(0.0, 1.0, high_open=True), 0.05)
    target_modules: str | tuple[str, ...] = key(
        '"all-linear" or a list of module names',
        _modules,
        "all-linear",
        doc="all-linear = every linear layer but the output head (peft's rule); the lora-targets check lists "
        "the model's own",
    )
    modules_to_save: tuple[str, ...] = key(
        "a list of module names",
        _names,
        (),
        doc="trained in full and saved with the adapter (e.g. embed_tokens, lm_head)",
    )
    use_rslora: bool = key("true or false", _bool, False, doc="rank-stabilised scaling, alpha / sqrt(r) (peft 0.7+)")
    use_dora: bool = key("true or false", _bool, False, doc="weight-decomposed LoRA (DoRA; peft 0.9+)")
    quantize: str = key(
        "one of none, 4bit, 8bit",
        _choice("none", "4bit", "8bit"),
        "none",
        doc="QLoRA: the frozen base in 4-bit NF4 (double quantisation) or 8-bit, computing in the run's precision, "
        "with bitsandbytes on CUDA",
    )
    merge: bool = key(
        "true or false",
        _bool,
        False,
        doc="also write base + adapter merged into one model in final-merged/ (the run's 16-bit dtype; fp32 on a CPU)",
    )


def _task_names(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(_str(x) and "," not in x for x in v)


@dataclass(frozen=True)
class Eval(Section):
    """[eval]: present = evaluate the final model with lm-evaluation-harness when the run ends well."""

    tasks: tuple[str, ...] = key(
        "a list of lm-eval task names",
        _task_names,
        (),
        required=True,
        doc='e.g. ["mmlu", "gsm8k"], or tasks of your own in `include`',
    )
    include: str | None = key(
        "a folder of lm-eval task YAMLs",
        _str,
        path="dir",
        doc="tasks of your own, with their local data (relative to this file)",
    )
    limit: int | None = key("an integer from 1 to 100000000", _int(1, 10**8), doc="at most this many examples per task")
    num_fewshot: int | None = key("an integer from 0 to 1000", _int(0, 1000), doc="default: each task's own")
    base: bool = key("true or false", _bool, True, doc="also evaluate the base the run started from, side by side")
    every_n_checkpoints: int = key(
        "an integer from 0 to 1000000",
        _int(0, 10**6),
        0,
        doc="also evaluate every n-th complete checkpoint at the end (0: none)",
    )


_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{2}){0,2}|(\d+-)\d+")  # sbatch --time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]


def _slurm_time(v: Any) -> bool:
    return isinstance(v, str) and bool(_SLURM_TIME.fullmatch(v))


def _slurm_name(v: Any) -> bool:
    return isinstance(v, str) and bool(re.fullmatch(r"[\w.,-]+", v))


@dataclass(frozen=True)
class Slurm(Section):
    """[slurm]: what `sftdoctor train RUN.toml --sbatch` writes into the batch script (the launch itself comes
    from the allocation: nodes, node id, first host, GPUs per node)."""

    partition: str | None = key("a partition name", _slurm_name)
    account: str | None = key("an account name", _slurm_name)
    time: str | None = key(
        'a time limit as sbatch takes it ("HH:MM:SS", "D-HH:MM")',
        _slurm_time,
        doc="the job's time limit; before it the job saves a checkpoint and requeues itself",
    )
    cpus_per_task: int | None = key("an integer from 1 to 4096", _int(1, 4096))
    gpus_per_node: int | None = key(
        "an integer from 0 to 1024",
        _int(0, 1024),
        doc="default: [launch] nproc_per_node where it is a number, or the GPUs here",
    )
    signal_s: int = key(
        "an integer from 10 to 86400",
        _int(10, 86400),
        300,
        doc="SIGTERM this many seconds before the time limit: the grace to save a checkpoint",
    )


@dataclass(frozen=True)
class Checks(Section):
    """[checks]: findings turned off, in `train`'s gate, its runtime watchers and `check --config` alike (as
    `--disable`)."""

    # the ids are checked against the check registry where the checks run (sftdoctor.checks.known_ids), a layer above
    disable: tuple[str, ...] = key(
        "a list of check ids or message ids (CHECK/slug)",
        _names,
        (),
        doc='silence these: a check id silences all its findings, a message id (e.g. "nccl-env/port-busy") that one; '
        "a silenced finding is still shown, marked silenced, and never stops the run (`sftdoctor check --list`)",
    )


SECTIONS: dict[str, type[Section]] = {
    "model": Model,
    "data": Data,
    "training": Training,
    "deepspeed": DeepSpeed,
    "fsdp": Fsdp,
    "launch": Launch,
    "report": Report,
    "watch": Watch,
    "lora": Lora,
    "eval": Eval,
    "slurm": Slurm,
    "checks": Checks,
}
OPTIONAL = {"lora", "eval", "fsdp"}  # absent from the TOML: None in the RunConfig, not a section of defaults

# Other tools' names for a key, too far from ours for a spelling hint: peft's and axolotl's LoRA keys.
SYNONYMS = {
    "rank": "r",
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "lora_target_modules": "target_modules",
    "target": "target_modules",
    "load_in_4bit": "quantize",
}

# Pairs of keys of which at most one may be given.
EXCLUSIVE = (
    ("deepspeed", "config", "zero_stage"),
    ("training", "min_lr_rate", "min_lr"),
    ("training", "warmup_ratio", "warmup_steps"),
)


def keys(section: type[Section]) -> dict[str, Key]:
    return {f.name: f.metadata["key"] for f in dataclasses.fields(section) if "key" in f.metadata}


@dataclass(frozen=True)
class RunConfig:
    path: str
    model: Model
    data: Data
    training: Training
    deepspeed: DeepSpeed = DeepSpeed()
    fsdp: Fsdp | None = None
    launch: Launch = Launch()
    report: Report = Report()
    watch: Watch = Watch()
    lora: Lora | None = None
    eval: Eval | None = None
    slurm: Slurm = Slurm()
    checks: Checks = Checks()

    def given(self, section: str, name: str) -> bool:
        return getattr(self, section).is_given(name)

    def with_values(self, section: str, **values: Any) -> RunConfig:
        """A copy with these keys set as if the user had written them (plan for another machine)."""
        old = getattr(self, section)
        return dataclasses.replace(self, **{section: dataclasses.replace(old, given=old.given | set(values), **values)})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        present = [name for name in SECTIONS if getattr(self, name) is not None]
        for name in present:
            sec = getattr(self, name)
            out[name] = {k: _plain(getattr(sec, k)) for k in keys(type(sec))}
        out["given"] = {name: sorted(getattr(self, name).given) for name in present}
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunConfig:
        given = doc.get("given") or {}
        sections = {}
        for name, kind in SECTIONS.items():
            if name in OPTIONAL and name not in doc:
                continue
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in (doc.get(name) or {}).items()}
            sections[name] = kind(given=frozenset(given.get(name, ())), **values)
        return cls(path=doc["path"], **sections)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def load_run_config(path: Path) -> RunConfig:
    path = Path(path)
    text = read_text(path, "TOML run config")
    try:
        raw = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError, as is a 5000-digit integer
        raise InputError(path, f"not valid TOML: {parse_problem(exc)}") from None
    return validate(raw, path)


def _probe_path(full: Path, test) -> bool | str:
    """`test(full)` (exists, is_file), or why the path cannot even be looked at (a name over 255 bytes)."""
    try:
        return test(full)
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL
        return getattr(exc, "strerror", None) or str(exc)


def _unreadable_entries(folder: Path) -> list[tuple[Path, str]]:
    """The entries of a model folder that are neither folders nor readable files (a FIFO, a device, a broken
    symlink): transformers would block on one, or read /dev/zero until memory runs out."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []  # the folder itself unreadable: the config's own reader says so
    return [(e, why) for e in entries if not _probe_path(e, Path.is_dir) and (why := not_a_file(e))]


def _resolve_path(spec: Key, value: Any, folder: Path, errors: list[InputError], path: Path, where: str) -> Any:
    if spec.local_or_hub:
        local = folder / Path(value).expanduser()
        found = _probe_path(local, Path.exists)
        if isinstance(found, str):
            errors.append(InputError(path, f"not a usable path: {value} ({found})", key=where))
            return value
        if found:
            if local.is_dir():  # every file a probe or the trainer will open: one line each, before any child
                errors.extend(
                    InputError(path, f"{value}: {entry.name} cannot be read as a file ({why})", key=where)
                    for entry, why in _unreadable_entries(local)
                )
            return str(local)
        if value.startswith((".", "/", "~")) or value.count("/") > 1:  # a path, not an org/name hub id
            errors.append(
                InputError(
                    path,
                    f"folder not found: {value} (looked for {local}); expected a local folder or a hub id (org/name)",
                    key=where,
                )
            )
        return value
    if spec.path == "dir":
        return str(folder / value)
    if spec.path == "data":
        kind, values = classify(value, folder)
        if kind == FOLDER:
            errors.extend(
                InputError(path, f"{value}: {entry.name} cannot be read as a file ({why})", key=where)
                for entry, why in _unreadable_entries(Path(values[0]))
            )
        if kind != FILES:
            return values
    if spec.path in ("file", "files", "data"):
        files = [value] if isinstance(value, str) else value
        resolved = [folder / f for f in files]
        for given, full in zip(files, resolved):
            found = _probe_path(full, Path.is_file)
            if isinstance(found, str):
                errors.append(InputError(path, f"not a usable path: {given} ({found})", key=where))
            elif found and (why := not_a_file(full)):
                errors.append(InputError(path, f"cannot read {given}: {why}", key=where))
            elif not found and os.path.lexists(full) and (why := not_a_file(full)):  # a FIFO, a broken link
                errors.append(InputError(path, f"{given} is not a file ({why})", key=where))
            elif not found:
                expected = "; expected a data file, a folder laid out as a hub dataset, or a hub id (org/name)"
                errors.append(
                    InputError(
                        path,
                        f"file not found: {given} (looked for {full}){expected if spec.path == 'data' else ''}",
                        key=where,
                    )
                )
        out = [str(f) for f in resolved]
        return out[0] if spec.path == "file" else tuple(out)
    return tuple(value) if isinstance(value, list) else value


def unknown_key(name: str, specs: dict[str, Key]) -> str:
    """What to say of a key a section does not have: a did-you-mean (other tools' names too), the known keys."""
    hint = f" (did you mean {SYNONYMS[name]!r}?)" if SYNONYMS.get(name) in specs else did_you_mean(name, specs)
    return f"unknown key{hint}; known keys: {', '.join(specs)}"


def unknown_section(name: str) -> str:
    return f"unknown section; expected one of {', '.join(SECTIONS)}{did_you_mean(name, SECTIONS)}"


def read_section(
    kind: type[Section], name: str, given: dict[str, Any], path: Path, errors: list[InputError]
) -> Section:
    """One table of a TOML file read into `kind`: each key checked against its Key, paths resolved relative to
    `path`; every problem appended to `errors` (the section of another file, a sweep's, reads the same way)."""
    specs = keys(kind)
    values: dict[str, Any] = {}
    for k, value in given.items():
        spec, where = specs.get(k), f"[{name}].{k}"
        if spec is None:
            errors.append(InputError(path, unknown_key(k, specs), key=where))
        elif not spec.accepts(value):
            errors.append(InputError(path, f"expected {spec.expected}, got {value!r}", key=where))
        else:
            values[k] = _resolve_path(spec, value, path.parent, errors, path, where)
    for k, spec in specs.items():
        if spec.required and k not in given:
            errors.append(InputError(path, f"missing; expected {spec.expected}", key=f"[{name}].{k}"))
    return kind(given=frozenset(values), **values)


def validate(raw: dict[str, Any], path: Path) -> RunConfig:
    """Check every section and key; return the typed config (defaults filled, paths resolved)."""
    path = Path(path)
    errors: list[InputError] = []
    for name, value in raw.items():
        if name not in SECTIONS:
            errors.append(InputError(path, unknown_section(name), key=f"[{name}]"))
        elif not isinstance(value, dict):
            errors.append(InputError(path, "expected a table ([section] with keys)", key=name))
    sections = {
        name: read_section(kind, name, raw[name] if isinstance(raw.get(name), dict) else {}, path, errors)
        for name, kind in SECTIONS.items()
        if name not in OPTIONAL or name in raw
    }
    for name, a, b in EXCLUSIVE:
        if name in sections and sections[name].is_given(a) and sections[name].is_given(b):
            errors.append(InputError(path, f"give either {a} or {b}, not both", key=f"[{name}]"))
    errors += _cross_checks(sections, path)
    if errors:
        raise InputErrors(errors)
    training = sections["training"]
    if not training.is_given("output_dir"):  # a default, so not marked as given
        sections["training"] = dataclasses.replace(training, output_dir=str(path.parent / "runs" / path.stem))
    return RunConfig(path=str(path), **sections)


def _cross_checks(s: dict[str, Any], path: Path) -> list[InputError]:
    errors = []
    evaluation = s.get("eval")
    if evaluation is not None and evaluation.include and _probe_path(Path(evaluation.include), Path.is_dir) is not True:
        errors.append(InputError(path, f"folder not found: {evaluation.include}", key="[eval].include"))
    training, data, launch, ds = s["training"], s["data"], s["launch"], s["deepspeed"]
    floor = training.is_given("min_lr_rate") or training.is_given("min_lr")
    if floor and training.lr_scheduler != "cosine_with_min_lr":
        errors.append(
            InputError(
                path,
                'a learning-rate floor needs lr_scheduler = "cosine_with_min_lr" '
                f"(the {training.lr_scheduler} schedule has none)",
                key="[training]",
            )
        )
    if data.is_given("eval") and data.eval_fraction:
        errors.append(InputError(path, "give either eval (files) or eval_fraction, not both", key="[data]"))
    errors += [InputError(path, why, key=where) for where, why in data_source.problems(data)]
    errors += [InputError(path, why, key=where) for where, why in data_source.streaming_problems(data, training)]
    if launch.nnodes > 1 and launch.master_port == "auto":
        errors.append(
            InputError(
                path,
                'master_port = "auto" works on one node only: every node must be given the same port',
                key="[launch].master_port",
            )
        )
    if launch.node_rank != "auto" and launch.node_rank >= launch.nnodes:
        errors.append(
            InputError(
                path, f"node_rank {launch.node_rank} must be below nnodes {launch.nnodes}", key="[launch].node_rank"
            )
        )
    errors += _fsdp_checks(s.get("fsdp"), ds, evaluation, path)
    if ds.offload_params and ds.zero_stage != 3:
        errors.append(InputError(path, "offload_params needs zero_stage = 3", key="[deepspeed].offload_params"))
    if (ds.offload_optimizer or ds.offload_params) and ds.config is not None:
        errors.append(
            InputError(
                path, "offload settings go with zero_stage; put them in the JSON given as config", key="[deepspeed]"
            )
        )
    return errors


def _fsdp_checks(fsdp: Fsdp | None, ds: DeepSpeed, evaluation: Eval | None, path: Path) -> list[InputError]:
    """One sharding engine per run; a given accelerate config is used as is; FSDP's checkpoints are each rank's
    shard (torch.distributed.checkpoint), which lm-eval cannot load."""
    if fsdp is None:
        return []
    errors = []
    if evaluation is not None and evaluation.every_n_checkpoints:
        errors.append(
            InputError(
                path,
                "FSDP's checkpoints hold each rank's shard, not a model lm-eval can load: evaluate the final model "
                "(every_n_checkpoints = 0), or merge a checkpoint first (accelerate merge-weights CHECKPOINT/"
                "pytorch_model_fsdp_0 OUT)",
                key="[eval].every_n_checkpoints",
            )
        )
    if ds.config is not None or ds.zero_stage is not None:
        errors.append(
            InputError(path, "[fsdp] and [deepspeed] both shard the model: keep one of the two sections", key="[fsdp]")
        )
    tuned = [name for name in ("sharding", "reshard_after_forward", "offload") if fsdp.is_given(name)]
    if fsdp.config is not None and tuned:
        errors.append(
            InputError(
                path,
                f"{', '.join(tuned)} go with the settings sftdoctor decides; put them in the accelerate config "
                "given as config",
                key="[fsdp]",
            )
        )
    return errors
