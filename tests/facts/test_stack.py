"""What the installed transformers can do (facts/stack.py), read from its source and checked against the
installed transformers itself; and the same reading of a 4.x-style source tree and of no transformers at all."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sftdoctor.facts import Facts
from sftdoctor.facts.stack import probe_transformers_features

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = {
    "cosine_with_min_lr": True,
    "min_lr_rate": True,
    "min_lr": True,
    "checkpointing_arg": "activation_checkpointing",
    "warmup_ratio": False,
    "non_padding_token_count": True,
    "length_grouping_arg": "train_sampling_strategy",
}


VERIFIED = ("5.24.", "5.25.")  # the minors these features were read from (and pyproject's cap admits)


def test_the_installed_transformers_reads_as_its_features():
    import transformers

    assert transformers.__version__.startswith(VERIFIED), (
        f"transformers {transformers.__version__} was not read yet: check its source, then add it to VERIFIED "
        "and to the cap in pyproject.toml"
    )
    assert probe_transformers_features(Facts()) == INSTALLED
    assert Facts().get("transformers_features") == INSTALLED


def test_the_features_match_the_installed_schedule_signature():
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    params = inspect.signature(get_cosine_with_min_lr_schedule_with_warmup).parameters
    features = probe_transformers_features(Facts())
    assert features["min_lr_rate"] == ("min_lr_rate" in params)
    assert features["min_lr"] == ("min_lr" in params)


def test_the_min_lr_rate_the_plan_passes_is_the_floor_the_installed_schedule_reaches():
    import torch
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = get_cosine_with_min_lr_schedule_with_warmup(optimizer, 2, 10, min_lr_rate=0.1)
    for _ in range(10):
        optimizer.step()
        schedule.step()
    assert schedule.get_last_lr()[0] == pytest.approx(1e-4)


def test_the_features_match_the_installed_training_arguments(tmp_path):
    import transformers

    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    features = probe_transformers_features(Facts())
    assert features["checkpointing_arg"] in fields
    assert features["length_grouping_arg"] in fields and "group_by_length" not in fields  # 5.x dropped the old name
    assert features["warmup_ratio"] == ("warmup_ratio" in fields)
    with pytest.raises(TypeError):  # 5.x really rejects it: a warmup_ratio passed through would crash the run
        transformers.TrainingArguments(output_dir=str(tmp_path), warmup_ratio=0.1)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        report_to="none",
        use_cpu=True,
        warmup_steps=0.1,
        include_num_input_tokens_seen="non_padding",
        **{features["checkpointing_arg"]: True},
    )
    assert getattr(args, features["checkpointing_arg"]) is True
    assert args.include_num_input_tokens_seen == "non_padding"


def probe_in_child(path_entries: list[Path]) -> dict | None:
    """The probe in a fresh interpreter without site-packages, with these folders on its path."""
    code = "import json; from sftdoctor.facts.stack import probe_transformers_features as p; print(json.dumps(p(None)))"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": ":".join(str(p) for p in path_entries)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_transformers_4_source_reads_as_the_older_features(tmp_path):
    package = tmp_path / "transformers"
    package.mkdir()
    (package / "__init__.py").write_text('__version__ = "4.46.3"\n')
    (package / "optimization.py").write_text(
        textwrap.dedent('''
        def get_cosine_with_min_lr_schedule_with_warmup(
            optimizer: Optimizer,
            num_warmup_steps: int,
            num_training_steps: int,
            num_cycles: float = 0.5,
            last_epoch: int = -1,
            min_lr: float = None,
            min_lr_rate: float = None,
        ):
            """Create a schedule ... to min_lr."""
    ''')
    )
    (package / "training_args.py").write_text(
        textwrap.dedent("""
        @dataclass
        class TrainingArguments:
            warmup_ratio: float = field(
                default=0.0, metadata={"help": "Linear warmup over warmup_ratio fraction of total steps."}
            )
            gradient_checkpointing: bool = field(
                default=False,
                metadata={"help": "If True, use gradient checkpointing to save memory at the expense of slower backward pass."},
            )
            include_num_input_tokens_seen: Optional[bool] = field(default=False)
            group_by_length: bool = field(default=False)
    """)  # noqa: E501 - transformers' training_args.py as it was written
    )
    assert probe_in_child([ROOT, tmp_path]) == {
        "cosine_with_min_lr": True,
        "min_lr_rate": True,
        "min_lr": True,
        "checkpointing_arg": "gradient_checkpointing",
        "warmup_ratio": True,
        "non_padding_token_count": False,
        "length_grouping_arg": "group_by_length",
    }


def test_without_transformers_the_fact_is_unavailable():
    assert probe_in_child([ROOT]) is None
