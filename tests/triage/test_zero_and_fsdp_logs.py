"""Sharded parameters and sharded checkpoints: a ZeRO-3 parameter read outside its gather (zero3-gather), a ZeRO
checkpoint resumed on another world size (zero-resume), FSDP's flat-parameter and DTensor errors (fsdp-flat-param).
Real logs of public reports (tests/fixtures/logs/index.json cites each), pasted as users paste them; and the same
messages raised here by the installed torch and DeepSpeed, so that the signatures follow the stack's own words."""

import io
import subprocess
import sys
from types import SimpleNamespace

import pytest
from triage.helpers import LOGS, ONE_RANK_MESH, log_bytes, problems, raised

from sftdoctor.triage import diagnose

TOPICS = ("zero3-gather", "zero-resume", "fsdp-flat-param")
MINE = [entry for entry in LOGS if set(entry["expect"]) & set(TOPICS)]
RANKLESS = ("rank",)  # a wrap can move the message off the line that carries the launcher's prefix


def root_of(text: str):
    return diagnose(io.BytesIO(text.encode())).root


def test_the_specifics_are_in_the_title():
    titles = {entry["file"]: problems_title(entry) for entry in MINE}
    assert titles["zero-resume-world-size-8-to-16-megatron-deepspeed.log"].startswith(
        "the ZeRO checkpoint was saved by 8 data-parallel ranks and this run has 16"
    )
    assert titles["fsdp-flat-param-uniform-dtype-peft-lora-dpo.log"] == (
        "FSDP cannot flatten one unit's parameters: torch.bfloat16 and torch.float32 mixed"
    )
    assert titles["fsdp-flat-param-mixed-dtensor-ray-prefix-verl.log"].startswith("aten.mm.default got a plain tensor")


def problems_title(entry) -> str:
    return root_of(log_bytes(entry["file"]).decode("utf-8")).finding.title


# ---- the installed stack's own messages (torch 2.13 CPU, DeepSpeed 0.19.8)


def test_torchs_messages_for_a_partitioned_parameter_are_named():
    import torch
    import torch.nn.functional as F

    empty = torch.empty(0)  # what a ZeRO-3 parameter holds outside a gather
    embedding = root_of(raised(lambda: F.embedding(torch.tensor([[1, 2]]), empty))).finding
    assert embedding.evidence["signature"] == "zero3-weight-not-2d"
    norm = root_of(raised(lambda: F.layer_norm(torch.ones(2, 8), (8,), empty, empty))).finding
    assert norm.evidence["signature"] == "zero3-norm-weight-empty" and norm.evidence["normalized"] == "8"
    # An empty batch raises these too: not named as ZeRO-3 without the context of a parameter.
    for text in (raised(lambda: empty.view(10, 8)), raised(lambda: empty + torch.ones(5))):
        root = root_of(text)
        assert root is None or root.finding.id != "zero3-gather", text


def test_a_real_traceback_of_a_zero_vocab_size_is_named(tmp_path):
    """The model's own line, as Python prints it in a traceback, then torch's view error."""
    (tmp_path / "loss.py").write_text(
        "import torch\n\ndef loss(shift_logits, self):\n"
        "    shift_logits = shift_logits.view(-1, self.config.vocab_size)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import loss
        import torch

        text = raised(lambda: loss.loss(torch.ones(2, 3, 4), SimpleNamespace(config=SimpleNamespace(vocab_size=0))))
    finally:
        sys.path.remove(str(tmp_path))
    finding = root_of(text).finding
    assert finding.evidence["signature"] == "zero3-vocab-size-zero" and finding.evidence["size"] == "24"
    bare = root_of("RuntimeError: shape '[-1, 0]' is invalid for input of size 1750\n")  # position_ids, not ZeRO-3
    assert bare is None or bare.finding.id != "zero3-gather"


@pytest.mark.parametrize(
    "tensors, signature",
    [
        (
            lambda torch: [torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16)), torch.nn.Parameter(torch.ones(2))],
            "fsdp-mixed-dtype",
        ),
        (
            lambda torch: [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2), requires_grad=False)],
            "fsdp-mixed-requires-grad",
        ),
        (
            lambda torch: [torch.nn.Parameter(torch.ones(2, dtype=torch.uint8), requires_grad=False)],
            "fsdp-integer-params",
        ),
    ],
)
def test_fsdps_flat_parameter_messages_are_named(tensors, signature):
    import torch
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    handle = SimpleNamespace(_use_orig_params=False)
    text = raised(lambda: FlatParamHandle._validate_tensors_to_flatten(handle, tensors(torch)))
    root = root_of(text)
    assert root.finding.id == "fsdp-flat-param" and root.finding.evidence["signature"] == signature, text


def test_dtensors_mixing_message_is_named():
    """A one-process gloo mesh in a child process: a DTensor times a plain tensor."""
    code = ONE_RANK_MESH + (
        "w = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])\ntorch.mm(torch.ones(4, 4), w)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "got mixed torch.Tensor and DTensor" in proc.stderr, proc.stderr[-2000:]
    root = root_of(proc.stderr)
    assert root.finding.evidence["signature"] == "fsdp2-mixed-dtensor"
    assert root.finding.evidence["op"] == "aten.mm.default"


def test_deepspeeds_world_size_refusal_is_named():
    """DeepSpeed 0.19.8's engine raises it in _load_zero_checkpoint, read through the engine's own method."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    engine = SimpleNamespace(
        _config=SimpleNamespace(zero_config=SimpleNamespace(pipeline_loading_checkpoint=False)),
        load_universal_checkpoint=lambda: False,
        seq_dp_world_size=16,
        loaded_checkpoint_dp_world_size=8,
    )
    text = raised(lambda: DeepSpeedEngine._load_zero_checkpoint(engine, "ckpt", "global_step2"))
    root = root_of(text)
    assert root.finding.id == "zero-resume" and (root.finding.evidence["saved"], root.finding.evidence["current"]) == (
        "8",
        "16",
    ), text
    assert problems(diagnose(io.BytesIO(text.encode()))).keys() == {"zero-resume"}


def test_a_message_pasted_outside_a_code_block_loses_its_backticks_and_is_still_named():
    """GitHub renders `x` as code and a copy drops the backticks: huggingface/peft#1702's title reads so."""
    import torch
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2), requires_grad=False)]
    text = raised(lambda: FlatParamHandle._validate_tensors_to_flatten(SimpleNamespace(_use_orig_params=False), params))
    assert "`requires_grad`" in text
    root = root_of(text.replace("`", ""))
    assert root.finding.evidence["signature"] == "fsdp-mixed-requires-grad"
