"""The rename table: arguments, attributes and importable names that trl, transformers, peft and accelerate renamed
or removed, with the release that deprecated each and the release that removed it, read from the libraries' own
history. Both the preflight check (`checks/api_renames.py`: does the installed stack hold a pair where one library
still uses a name the other removed?) and the log triage (`kb/topics/api-renames.md`: which rename is this
`unexpected keyword argument` / `cannot import name` / `has no attribute`?) read this one table.

How each row was verified (December 2026):
- trl: the git history of huggingface/trl (`git log -S`, `git describe --contains` on the commit that added the
  deprecation and the one that removed it), and trl 1.16.0 installed here.
- transformers: the released wheels of the versions either side of a change (pip download, read
  training_args.py / trainer.py / modeling_utils.py / __init__.py), MIGRATION_GUIDE_V5.md, and 5.25.0 installed here.
- accelerate, peft: the git history of huggingface/accelerate and huggingface/peft.
- "raises here" below: the installed stack (transformers 5.25, trl 1.16, accelerate 1.16, peft 0.21.2) raised the
  TypeError/ImportError/AttributeError when called with the old name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sftdoctor.run.gpus import version_tuple

ARGUMENT, IMPORT, ATTRIBUTE = "argument", "import", "attribute"

# Who raises a keyword argument's TypeError, by the qualified name Python (>= 3.10) puts before `__init__()`: the class
# that defines the __init__, so a subclass that does not define one (LLaVATrainer, a user's TrainingArguments
# dataclass keeps its own name) reports the class it inherits it from. A class of another library with its own
# __init__ (ArgillaTrainer) is not one of these.
TRL_CONFIGS = r"(?:SFT|DPO|GRPO|ORPO|CPO|KTO|BCO|GKD|PPO|RLOO|Reward|OnlineDPO|XPO|NashMD|PRM)Config"
TRAINING_ARGS = rf"\w*TrainingArguments|{TRL_CONFIGS}"  # TRL's configs subclass TrainingArguments
HF_TRAINER = r"(?:Seq2Seq)?Trainer"
TRL_TRAINER = r"(?:SFT|DPO|ORPO|CPO|KTO|BCO|GKD|PPO|RLOO|GRPO|Reward|OnlineDPO|XPO|NashMD|PRM|IterativeSFT)Trainer"
MODEL = r"\w+(?:For\w+|Model|LM)"  # what from_pretrained() passes unknown keyword arguments on to
CONFIG = r"\w*Config"


@dataclass(frozen=True)
class Rename:
    library: str  # the distribution that renamed or removed it
    owner: str  # the class or function it belongs to, or the module it was imported from
    kind: str  # ARGUMENT (a keyword argument), IMPORT (a name imported from `owner`), ATTRIBUTE
    old: str
    new: str | None  # what to write instead; None: removed without a drop-in (see `note`)
    deprecated: str | None  # the first release that warned (or that had the new name); None: not recorded here (no
    # deprecation cycle, or one older than the releases read)
    removed: str | None  # the first release that raises; None: still accepted (deprecated only)
    source: str  # where this was read: a PR, a commit, a changelog section
    raised_by: str = ""  # regex for the class name in the TypeError/AttributeError; "" for an import
    note: str = ""  # how to migrate, when it is not a rename

    @property
    def replacement(self) -> str:
        return self.new or self.note or "no replacement"


_V5_GUIDE = "transformers MIGRATION_GUIDE_V5.md; raises here"
_V5_UNANNOUNCED = "transformers MIGRATION_GUIDE_V5.md ('without deprecation cycle'); raises here"


def _args(library, owner, raised_by, olds, new, deprecated, removed, source, note=""):
    return [Rename(library, owner, ARGUMENT, old, new, deprecated, removed, source, raised_by, note) for old in olds]


def _training_args(olds, new, deprecated, removed, source, note=""):
    """Arguments of TrainingArguments, which every TRL config subclasses (TRAINING_ARGS names them all)."""
    return _args("transformers", "TrainingArguments", TRAINING_ARGS, olds, new, deprecated, removed, source, note)


def _dropped_in_v5(olds, note, source=_V5_GUIDE):
    """TrainingArguments that transformers 5.0 removed with nothing in their place: `note` says what to do."""
    return _training_args(olds, None, None, "5.0.0", source, note)


def _imports(library, module, olds, new, deprecated, removed, source, note=""):
    return [
        Rename(library, module, IMPORT, old, new(old) if callable(new) else new, deprecated, removed, source, "", note)
        for old in olds
    ]


_SFT_MOVED = (
    "dataset_text_field",
    "packing",
    "dataset_num_proc",
    "dataset_batch_size",
    "neftune_noise_alpha",
    "model_init_kwargs",
    "dataset_kwargs",
    "eval_packing",
    "num_of_sequences",
    "chars_per_token",
    "infinite",
)
_EXPERIMENTAL = {
    "PPO": "ppo",
    "ORPO": "orpo",
    "CPO": "cpo",
    "BCO": "bco",
    "XPO": "xpo",
    "PRM": "prm",
    "GKD": "gkd",
    "NashMD": "nash_md",
    "OnlineDPO": "online_dpo",
}

RENAMES: tuple[Rename, ...] = tuple(
    [
        # ---- trl
        *_args(
            "trl",
            "SFTTrainer",
            TRL_TRAINER,
            ["tokenizer"],
            "processing_class",
            "0.12.0",
            "0.16.0",
            "trl PR #2162 (47d08a96, v0.12.0) renamed it; PR #2894 (6aaf379a, v0.16.0) removed the alias; raises here",
        ),
        # SFTTrainer's dataset arguments moved to SFTConfig (SFTConfig: PR #1530, v0.9.3); PR #2306 (5e906828, v0.13.0)
        # dropped them from SFTTrainer.__init__.
        *_args(
            "trl",
            "SFTTrainer",
            r"(?:SFT|IterativeSFT)Trainer",
            _SFT_MOVED,
            None,
            "0.9.3",
            "0.13.0",
            "trl PR #1530 (f30daa42, v0.9.3) moved them to SFTConfig; PR #2306 (5e906828, v0.13.0) removed them from "
            "SFTTrainer; raises here",
            note="set it in SFTConfig(...) and pass args=that config",
        ),
        *_args(
            "trl",
            "SFTTrainer",
            r"(?:SFT|IterativeSFT)Trainer",
            ["max_seq_length"],
            None,
            "0.9.3",
            "0.13.0",
            "trl PR #2306 (5e906828, v0.13.0) removed it from SFTTrainer; raises here",
            note="SFTConfig(max_length=...) (SFTConfig.max_seq_length until trl 0.20)",
        ),
        *_args(
            "trl",
            "SFTConfig",
            TRL_CONFIGS,
            ["max_seq_length"],
            "max_length",
            "0.16.0",
            "0.20.0",
            "trl PR #2895 (be1e3400, v0.16.0) renamed it; PR #3704 (e102ac8d, v0.20.0) removed the alias; raises here",
        ),
        *_imports(
            "trl",
            "trl",
            ["DataCollatorForCompletionOnlyLM"],
            None,
            "0.17.0",
            "0.20.0",
            "trl PR #3328 (9ee6c3aa, v0.17.0) deprecated it; PR #3704 (e102ac8d, v0.20.0) removed it; raises here",
            note="SFTConfig(completion_only_loss=True) on prompt/completion rows, or assistant_only_loss=True on "
            "messages",
        ),
        *_imports(
            "trl",
            "trl",
            ["ConstantLengthDataset"],
            None,
            "0.17.0",
            "0.20.0",
            "trl PR #3242 (a5a46725, v0.17.0) deprecated it; PR #3704 (e102ac8d, v0.20.0) removed it; raises here",
            note="SFTConfig(packing=True)",
        ),
        *_imports(
            "trl",
            "trl",
            ["setup_chat_format"],
            "clone_chat_template",
            "0.22.0",
            "0.26.0",
            "trl PR #3929 (48d7ecc6, v0.22.0) deprecated it; PR #4607 (de343cda, v0.26.0) removed it; raises here",
        ),
        *_imports(
            "trl",
            "trl",
            ["IterativeSFTTrainer"],
            None,
            None,
            "0.24.0",
            "trl PR #4068 (78f1a928, v0.24.0) removed it; raises here",
            note="SFTTrainer",
        ),
        *_imports(
            "trl",
            "trl",
            [f"{name}{kind}" for name in _EXPERIMENTAL for kind in ("Trainer", "Config")],
            lambda old: f"from trl.experimental.{_EXPERIMENTAL[re.sub('(Trainer|Config)$', '', old)]} import {old}",
            "0.26.0",
            "0.29.0",
            "trl PRs #4470-#4575 (v0.25.0-v0.26.0) moved them to trl.experimental; PRs "
            "#5044-#5055 (v0.29.0) removed the old import path; raises here",
        ),
        *_imports(
            "trl",
            "trl",
            ["AutoModelForCausalLMWithValueHead", "AutoModelForSeq2SeqLMWithValueHead"],
            lambda old: f"from trl.experimental.ppo import {old}",
            "0.27.0",
            "0.29.0",
            "trl PR #4654 (ad02d98c, v0.27.0) moved them to trl.experimental; PR #5044 (v0.29.0) removed the old "
            "path; raises here",
        ),
        *_args(
            "trl",
            "GRPOConfig",
            TRL_CONFIGS,
            ["use_liger_loss"],
            "use_liger_kernel",
            None,
            "0.28.0",
            "trl PR #4847 (89070d24, v0.28.0) removed the deprecated alias; raises here",
        ),
        *_args(
            "trl",
            "GRPOConfig",
            r"(?:GRPO|RLOO)Config",
            ["max_prompt_length"],
            None,
            None,
            "0.28.0",
            "trl PR #4847 (89070d24, v0.28.0) removed it from GRPOConfig (RLOOConfig: PR #5056, v0.29.0); raises here",
            note="truncate the prompts in the dataset before training",
        ),
        # ---- transformers: TrainingArguments (and every TRL config, which subclass it)
        *_training_args(
            ["evaluation_strategy"],
            "eval_strategy",
            "4.41.0",
            "4.51.0",
            "transformers PR #30190 (v4.41.0) renamed it; present in the 4.50.0 wheel, absent from 4.51.0; raises here",
        ),
        *_training_args(
            ["no_cuda"],
            "use_cpu",
            None,
            "5.0.0",
            "4.37.2 already warns 'no_cuda is deprecated'; MIGRATION_GUIDE_V5.md, 'Removing deprecated arguments in "
            "TrainingArguments'; raises here",
        ),
        *_training_args(["per_gpu_train_batch_size"], "per_device_train_batch_size", None, "5.0.0", _V5_GUIDE),
        *_training_args(["per_gpu_eval_batch_size"], "per_device_eval_batch_size", None, "5.0.0", _V5_GUIDE),
        *_training_args(["push_to_hub_token"], "hub_token", None, "5.0.0", _V5_GUIDE),
        *_training_args(["include_inputs_for_metrics"], "include_for_metrics", None, "5.0.0", _V5_GUIDE),
        *_dropped_in_v5(["fp16_backend", "half_precision_backend"], "drop it: torch.amp is the only backend"),
        *_dropped_in_v5(["use_mps_device"], "drop it: MPS is used when present"),
        *_dropped_in_v5(["overwrite_output_dir"], "drop it; resume with resume_from_checkpoint", _V5_UNANNOUNCED),
        *_dropped_in_v5(["logging_dir"], "set the TENSORBOARD_LOGGING_DIR environment variable", _V5_UNANNOUNCED),
        *_training_args(
            ["group_by_length"],
            None,
            None,
            "5.2.0",
            "present in the 5.1.0 wheel, absent from 5.2.0; raises here",
            note='train_sampling_strategy="group_by_length"',
        ),
        *_training_args(
            ["warmup_ratio"],
            "warmup_steps",
            "5.0.0",
            "5.15.0",
            "5.0.0 warns 'warmup_ratio is deprecated'; present in the 5.14.0 wheel, absent from 5.15.0; raises here "
            "(a warmup_steps below 1 is a ratio)",
        ),
        *_training_args(
            ["dispatch_batches", "split_batches"],
            None,
            "4.38.0",
            "4.51.0",
            "absent from the 4.37.2 wheel's warnings, deprecated in 4.38.2 ('Pass {'dispatch_batches':VALUE} "
            "to accelerator_config'); present in the 4.50.0 wheel, absent from 4.51.0; raises here",
            note='accelerator_config={"dispatch_batches": ..., "split_batches": ...}',
        ),
        *_training_args(
            ["gradient_checkpointing"],
            "activation_checkpointing",
            "5.24.0",
            None,
            "transformers 5.24 training_args.py: a deprecated alias, 'will be removed in v6'",
        ),
        # ---- transformers: Trainer
        *_args(
            "transformers",
            "Trainer",
            HF_TRAINER,
            ["tokenizer"],
            "processing_class",
            "4.46.0",
            "5.0.0",
            "transformers PR #32385 (v4.46.0) renamed it; MIGRATION_GUIDE_V5.md 'Removing deprecated arguments in "
            "Trainer'; raises here",
        ),
        Rename(
            "transformers",
            "Trainer",
            ATTRIBUTE,
            "tokenizer",
            "processing_class",
            "4.46.0",
            "5.0.0",
            "transformers PR #32385 (v4.46.0) deprecated Trainer.tokenizer; "
            "absent from 5.0.0's trainer.py; raises here",
            r"\w*Trainer",
        ),  # an AttributeError names the object's own class: any subclass
        # ---- transformers: from_pretrained (an unknown keyword reaches the model class's __init__)
        *_args(
            "transformers",
            "from_pretrained",
            MODEL,
            ["use_auth_token"],
            "token",
            None,
            "5.0.0",
            "transformers PR #41666 (MIGRATION_GUIDE_V5.md 'use_auth_token'); 4.37.2 and 4.57.6 warn 'will be removed "
            "in v5'; "
            "raises here",
        ),
        *_args(
            "transformers",
            "from_pretrained",
            MODEL,
            ["load_in_4bit", "load_in_8bit"],
            None,
            None,
            "5.0.0",
            "transformers PR #41287 (MIGRATION_GUIDE_V5.md 'Quantization changes'); raises here",
            note="quantization_config=BitsAndBytesConfig(load_in_4bit=True)",
        ),
        *_args(
            "transformers",
            "from_pretrained",
            MODEL,
            ["use_flash_attention_2"],
            None,
            None,
            "4.53.0",
            "4.37.2 already warns 'deprecated'; present in the 4.52.1 wheel (warns 'deprecated'), absent from 4.53.0; "
            "raises here",
            note='attn_implementation="flash_attention_2"',
        ),
        *_args(
            "transformers",
            "from_pretrained",
            MODEL,
            ["torch_dtype"],
            "dtype",
            "4.56.0",
            None,
            "transformers PR #39782 (v4.56.0); 5.25 still accepts it with a warning",
        ),
        Rename(
            "transformers",
            "PretrainedConfig",
            ATTRIBUTE,
            "rope_theta",
            None,
            None,
            "5.0.0",
            "transformers PRs #39847 and #42255 (MIGRATION_GUIDE_V5.md 'Configuration'); raises here",
            CONFIG,
            'config.rope_parameters["rope_theta"]',
        ),
        # ---- transformers: importable names
        *_imports(
            "transformers",
            "transformers",
            ["top_k_top_p_filtering"],
            None,
            None,
            "4.39.0",
            "present in the 4.38.2 wheel, absent from 4.39.0; raises here",
            note="upgrade the library that imports it (trl >= 0.8.0 carries its own copy)",
        ),
        *_imports(
            "transformers",
            "transformers",
            ["is_torch_tpu_available"],
            "is_torch_xla_available",
            "4.39.0",
            "4.51.0",
            "4.50.0 warns 'is deprecated'; absent from the 4.51.0 wheel; raises here",
        ),
        # ---- accelerate
        *_args(
            "accelerate",
            "Accelerator",
            r"Accelerator",
            ["dispatch_batches", "even_batches", "use_seedable_sampler"],
            None,
            "0.28.0",
            "1.0.0",
            "accelerate PR #2441 (164193fa, v0.28.0) deprecated them; PR #3098 (79a84264, "
            "v1.0.0) removed them; raises here",
            note="Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=...))",
        ),
        *_args(
            "accelerate",
            "Accelerator",
            r"Accelerator",
            ["logging_dir"],
            "project_dir",
            "0.16.0",
            "0.20.0",
            "accelerate PR #916 (f002ce2a, v0.16.0) added project_dir; PR #1537 (62357f21, v0.20.0) removed "
            "logging_dir; raises here",
        ),
        # ---- peft
        *_imports(
            "peft",
            "peft",
            ["prepare_model_for_int8_training"],
            "prepare_model_for_kbit_training",
            "0.4.0",
            "0.10.0",
            "peft PR #483 (3714aa2f, v0.4.0) deprecated it; the v0.10.0 release (PR #1573) removed it; raises here",
        ),
    ]
)


@dataclass(frozen=True)
class Pair:
    """A library (the consumer) whose releases before `fixed_in` still use a name another (the provider) removed."""

    consumer: str
    fixed_in: str  # the consumer's first release that no longer uses the old name
    rename: Rename
    how: str  # how the consumer uses it, in words
    source: str


def _row(library: str, kind: str, old: str, owner: str) -> Rename:
    return next(r for r in RENAMES if (r.library, r.kind, r.old, r.owner) == (library, kind, old, owner))


PAIRS: tuple[Pair, ...] = (
    Pair(
        "trl",
        "0.8.0",
        _row("transformers", IMPORT, "top_k_top_p_filtering", "transformers"),
        "trl/core.py imports transformers.top_k_top_p_filtering",
        "trl v0.7.11 core.py line 25; trl PR #1415 (7630f877, v0.8.0) copied the function into trl",
    ),
    Pair(
        "trl",
        "0.12.0",
        _row("transformers", ARGUMENT, "tokenizer", "Trainer"),
        "SFTTrainer/DPOTrainer pass tokenizer= to transformers' Trainer.__init__",
        "trl v0.11.4 sft_trainer.py super().__init__(..., tokenizer=tokenizer); trl PR #2162 (v0.12.0) "
        "switched to processing_class",
    ),
    Pair(
        "transformers",
        "4.40.0",
        _row("accelerate", ARGUMENT, "dispatch_batches", "Accelerator"),
        "Trainer.create_accelerator_and_postprocess passes dispatch_batches to Accelerator(...)",
        "transformers 4.37.2 trainer.py Accelerator(dispatch_batches=...), 4.38/4.39 via "
        "AcceleratorConfig.to_dict(); 4.40.0 builds a DataLoaderConfiguration",
    ),
)

STACK = ("trl", "transformers", "peft", "accelerate")  # the libraries the table covers


def before(version: str | None, release: str | None) -> bool:
    """True when `version` is older than `release` (False when either is unknown)."""
    have, cut = version_tuple(version), version_tuple(release)
    return have is not None and cut is not None and have < cut


def lookup(kind: str, name: str, owner: str | None = None, module: str | None = None) -> tuple[Rename, str] | None:
    """The row a log's error names, and whether the name is the row's "old" one (the code is newer than the
    library) or its "new" one (the library is older than the code). An owner or module the error names must be
    the row's; a keyword argument's error without a class (Python < 3.10) is taken on the name alone. A config
    dataclass's field is also its attribute (`'SFTConfig' object has no attribute 'max_seq_length'`)."""
    for side in ("old", "new"):
        for row in RENAMES:
            if getattr(row, side) != name or not _kind_fits(row, kind):
                continue
            if kind == IMPORT and module is not None and module.split(".")[0] != row.owner.split(".")[0]:
                continue
            if kind != IMPORT and owner is not None and not re.fullmatch(row.raised_by, owner):
                continue
            if kind == ATTRIBUTE and owner is None:
                continue
            if side == "new" and (row.kind == IMPORT or row.deprecated is None):
                continue  # when the new name arrived is not recorded, an old release cannot be named
            return row, side
    return None


def _kind_fits(row: Rename, kind: str) -> bool:
    return row.kind == kind or (kind == ATTRIBUTE and row.kind == ARGUMENT and row.owner in FIELDS)


FIELDS = ("TrainingArguments", "SFTConfig", "GRPOConfig")  # dataclasses: an argument is also an attribute


def broken_pairs(packages: dict[str, str | None]) -> list[tuple[Pair, str, str]]:
    """(pair, consumer version, provider version) for each pair the installed versions make."""
    found = []
    for pair in PAIRS:
        consumer, provider = packages.get(pair.consumer), packages.get(pair.rename.library)
        if before(consumer, pair.fixed_in) and not before(provider, pair.rename.removed) and version_tuple(provider):
            found.append((pair, consumer, provider))
    return found
