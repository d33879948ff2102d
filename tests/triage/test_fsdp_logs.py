"""FSDP (FSDP1 and FSDP2, through accelerate and transformers) failures named as well as DeepSpeed's: a wrap class the
model lacks, a Trainer `fsdp` option transformers refuses, a torch too old for FSDP2, FSDP2's prepare refusals,
gradient clipping over DTensor and plain gradients (kb topics fsdp-config and fsdp-flat-param), and FSDP's hung
all-gather or reduce-scatter named with its op (nccl-timeout). Real logs of public reports (tests/fixtures/logs/
index.json cites each), logs of accelerate's refusals of the other FSDP version's options recorded here on two CPU
processes (index.json says how); and the same messages raised here by the installed accelerate 1.16, transformers 5.25
and torch 2.13."""

import ast
import inspect
import io
import subprocess
import sys
import textwrap

import pytest
from triage.helpers import LOGS, ONE_RANK_MESH, by_file, log_bytes, problems, quoted, raised

from sftdoctor import triage
from sftdoctor.triage import diagnose
from sftdoctor.triage.signatures import signatures

NEW = {
    "fsdp-wrap-class-missing",
    "fsdp-wrap-class-missing-legacy",
    "fsdp-trainer-option-unknown",
    "fsdp2-torch-missing-api",
    "fsdp2-torch-missing-hf-storage",
    "fsdp2-prepare-unsupported",
    "fsdp2-clip-grad-mixed",
    "fsdp-option-other-version",
    "fsdp2-reshard-strategy-name",
}
# Each real log: its root finding's topic, signature and title.
NAMED = {
    "fsdp-config-wrap-class-missing-qwen-image-accelerate.log": (
        "fsdp-config",
        "fsdp-wrap-class-missing",
        "FSDP's TRANSFORMER_BASED_WRAP names a layer class the model does not have: QwenImageTransformerBlock",
    ),
    "fsdp-config-wrap-class-legacy-trainer-stanford-alpaca.log": (
        "fsdp-config",
        "fsdp-wrap-class-missing-legacy",
        "FSDP's TRANSFORMER_BASED_WRAP names a layer class the model does not have (this version does not say which)",
    ),
    "fsdp-config-fsdp-option-fsdp2-ms-swift.log": (
        "fsdp-config",
        "fsdp-trainer-option-unknown",
        "TrainingArguments' fsdp got fsdp2: not an option this transformers' FSDP integration takes",
    ),
    "fsdp-config-fsdp2-torch-too-old-imports-transformers.log": (
        "fsdp-config",
        "fsdp2-torch-missing-api",
        "this torch has no torch.distributed.fsdp.CPUOffloadPolicy: FSDP2 needs torch >= 2.6",
    ),
    "fsdp-config-fsdp2-prepare-optimizer-apart-nd-parallel-transformers.log": (
        "fsdp-config",
        "fsdp2-prepare-unsupported",
        "accelerate cannot prepare this for FSDP2: When using FSDP2, a model and optimizer must be passed together",
    ),
    "fsdp-flat-param-clip-grad-foreach-mul-ktransformers.log": (
        "fsdp-flat-param",
        "fsdp2-clip-grad-mixed",
        "gradient clipping (aten._foreach_mul_.Tensor) over DTensor and plain gradients: a trained parameter outside "
        "FSDP2's fully_shard",
    ),
}
REAL = [entry for entry in LOGS if entry["file"] in NAMED]
# Logs recorded here (index.json's source says how): the installed accelerate 1.16 on two CPU processes.
RECORDED_NAMED = {
    "fsdp-config-fsdp2-reshard-full-shard-recorded-cpu.log": (
        "fsdp-config",
        "fsdp2-reshard-strategy-name",
        "FSDP2's reshard_after_forward got the FSDP1 sharding strategy full_shard: it takes true or false",
    ),
    "fsdp-config-fsdp2-local-state-dict-recorded-cpu.log": (
        "fsdp-config",
        "fsdp-option-other-version",
        "accelerate's FSDP plugin refused LOCAL_STATE_DICT: a setting of the other FSDP version (fsdp_version 1 vs 2)",
    ),
    "fsdp-config-fsdp2-forward-prefetch-recorded-cpu.log": (
        "fsdp-config",
        "fsdp-option-other-version",
        "accelerate's FSDP plugin refused forward_prefetch: a setting of the other FSDP version (fsdp_version 1 vs 2)",
    ),
}
RECORDED = [entry for entry in LOGS if entry["file"] in RECORDED_NAMED]


def root_of(text: str):
    return diagnose(io.BytesIO(text.encode())).root


def test_every_named_log_is_in_the_cited_corpus():
    assert {entry["file"] for entry in REAL} == set(NAMED)
    assert all(entry["source"].startswith("https://github.com/") for entry in REAL)


def test_every_recorded_log_is_in_the_corpus_saying_how_it_was_recorded():
    assert {entry["file"] for entry in RECORDED} == set(RECORDED_NAMED)
    for entry in RECORDED:
        assert entry["project"] == "recorded" and entry["source"].startswith("recorded on "), entry["file"]
        assert "accelerate 1.16.0" in entry["source"] and "command" in entry["source"], entry["file"]


@pytest.mark.parametrize("entry", REAL + RECORDED, ids=by_file(REAL + RECORDED))
def test_each_real_log_is_named_with_its_signature_and_title(entry):
    topic, signature, title = {**NAMED, **RECORDED_NAMED}[entry["file"]]
    root = root_of(log_bytes(entry["file"]).decode("utf-8")).finding
    assert (root.id, root.evidence["signature"], root.title) == (topic, signature, title)
    assert f"sftdoctor explain {topic}" in root.fix


@pytest.mark.parametrize("entry", REAL + RECORDED, ids=by_file(REAL + RECORDED))
def test_without_its_signature_the_log_is_not_named_so(entry, monkeypatch):
    """The finding comes from the new signature: with it removed, the same log no longer gets that title."""
    topic, signature, title = {**NAMED, **RECORDED_NAMED}[entry["file"]]
    kept = tuple(s for s in signatures() if s.id != signature)
    monkeypatch.setattr(triage, "signatures", lambda: kept)
    diagnosis = diagnose(io.BytesIO(log_bytes(entry["file"])))
    assert all(loc.finding.title != title for loc in diagnosis.findings)
    assert all(loc.finding.evidence.get("signature") != signature for loc in diagnosis.findings)


@pytest.mark.parametrize("form", ["markdown quote", "wrapped at 80"])
@pytest.mark.parametrize("entry", REAL + RECORDED, ids=by_file(REAL + RECORDED))
def test_a_log_pasted_into_an_issue_is_named_alike(entry, form):
    text = log_bytes(entry["file"]).decode("utf-8")
    pasted = quoted(text) if form == "markdown quote" else _wrapped(text)
    topic, signature, _ = {**NAMED, **RECORDED_NAMED}[entry["file"]]
    found = problems(diagnose(io.BytesIO(pasted.encode())))
    assert found[topic]["signature"] == signature, (form, found)


def _wrapped(text: str, width: int = 80) -> str:
    return "".join((textwrap.fill(line, width, break_on_hyphens=False) or "") + "\n" for line in text.splitlines())


def test_the_second_traceback_of_the_too_old_torch_log_is_named_too():
    found = diagnose(io.BytesIO(log_bytes("fsdp-config-fsdp2-torch-too-old-imports-transformers.log"))).findings
    assert [loc.finding.evidence["signature"] for loc in found] == [
        "fsdp2-torch-missing-api",
        "fsdp2-torch-missing-hf-storage",
    ]


def test_the_quoted_raise_line_of_a_traceback_is_not_taken_for_the_message():
    """The forward_prefetch traceback quotes `raise ValueError("forward_prefetch is not yet implemented ...")` on the
    line above the message: the finding reads the message, once per rank."""
    root = root_of(log_bytes("fsdp-config-fsdp2-forward-prefetch-recorded-cpu.log").decode("utf-8"))
    assert root.finding.evidence["text"].startswith("ValueError: forward_prefetch is not yet implemented in FSDP2")
    assert root.finding.evidence["count"] == 2


def test_the_new_signatures_are_declared_and_point_to_fsdp_topics():
    declared = {s.id: s for s in signatures()}
    assert set(declared) >= NEW
    for sig_id in NEW:
        assert "`sftdoctor explain fsdp-" in declared[sig_id].fix, sig_id
        assert declared[sig_id].topic in ("fsdp-config", "fsdp-flat-param"), sig_id


# ---- FSDP's hung collectives: the watchdog names the op


def test_an_fsdp_reduce_scatter_hang_names_each_ranks_op():
    """accelerate#3250: rank 0 in FSDP's gradient reduce-scatter, rank 1 already in the next all-gather."""
    diagnosis = diagnose(io.BytesIO(log_bytes("dist-nccl-timeout-fsdp-reduce-scatter-vs-allgather-accelerate.log")))
    finding = diagnosis.root.finding
    assert finding.id == "nccl-timeout"
    assert (finding.evidence["op"], finding.evidence["seq"], finding.evidence["desync"]) == (
        "_ALLGATHER_BASE",
        126,
        [0],
    )
    assert finding.title == "NCCL collective timed out: _ALLGATHER_BASE SeqNum=126 after 600 s on ranks 0-1"
    assert "rank 0 at _REDUCE_SCATTER_BASE SeqNum=122" in finding.detail


def test_an_fsdp_allgather_hang_of_the_legacy_format_names_its_op():
    diagnosis = diagnose(io.BytesIO(log_bytes("dist-nccl-timeout-legacy-optype-mismatch-fsdp-pytorch.log")))
    assert diagnosis.root.finding.evidence["op"] == "_ALLGATHER_BASE"
    assert "_ALLGATHER_BASE" in diagnosis.root.finding.title


# ---- the installed stack's own messages (accelerate 1.16, transformers 5.25, torch 2.13 CPU)


def plugin(**options):
    from accelerate.utils.dataclasses import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(**options)


def test_accelerates_missing_wrap_class_is_named():
    import torch

    wrap = plugin(fsdp_version=1, auto_wrap_policy="TRANSFORMER_BASED_WRAP", transformer_cls_names_to_wrap=["Nope"])
    finding = root_of(raised(lambda: wrap.set_auto_wrap_policy(torch.nn.Linear(2, 2)))).finding
    assert (finding.evidence["signature"], finding.evidence["cls"]) == ("fsdp-wrap-class-missing", "Nope")


@pytest.mark.parametrize("fsdp", ["fsdp2", "hybrid_shard"])
def test_transformers_refusals_of_an_fsdp_option_are_named(fsdp, tmp_path):
    from transformers import TrainingArguments

    text = raised(lambda: TrainingArguments(output_dir=str(tmp_path), fsdp=fsdp, report_to=[]))
    finding = root_of(text).finding
    assert (finding.evidence["signature"], finding.evidence["option"]) == ("fsdp-trainer-option-unknown", fsdp)


def message_raised_in(func, needle: str) -> str:
    """The string a `raise X("...")` in the installed `func` (or module) raises, read from its source: for a refusal
    whose conditions need a GPU job or a launched accelerator."""
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(func)))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            message = node.exc.args[0]
            if isinstance(message, ast.Constant) and needle in str(message.value):
                return f"{node.exc.func.id}: {message.value}"
    raise AssertionError(f"{needle!r} is not raised in {func.__name__}")


@pytest.mark.parametrize(
    "needle", ["Only one model is supported", "an optimizer must be passed together", "FSDP2 preparation should"]
)
def test_accelerates_fsdp2_prepare_refusals_are_named(needle):
    from accelerate import Accelerator

    func = Accelerator.prepare if "preparation" not in needle else Accelerator.prepare_model
    finding = root_of(message_raised_in(func, needle) + "\n").finding
    assert finding.evidence["signature"] == "fsdp2-prepare-unsupported"


def test_torchs_clipping_over_dtensor_and_plain_gradients_is_named():
    """A one-process gloo mesh in a child process: clip_grad_norm_ over a DTensor and a plain gradient."""
    code = ONE_RANK_MESH + (
        "sharded = torch.nn.Parameter(distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)]))\n"
        "sharded.grad = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])\n"
        "plain = torch.nn.Parameter(torch.ones(4))\n"
        "plain.grad = torch.ones(4)\n"
        "torch.nn.utils.clip_grad_norm_([sharded, plain], 0.1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "got mixed torch.Tensor and DTensor" in proc.stderr, proc.stderr[-2000:]
    diagnosis = diagnose(io.BytesIO(proc.stderr.encode()))
    assert (diagnosis.root.finding.evidence["signature"], diagnosis.root.finding.evidence["op"]) == (
        "fsdp2-clip-grad-mixed",
        "aten._foreach_norm.Scalar",
    )
    assert [loc.finding.evidence["signature"] for loc in diagnosis.findings] == ["fsdp2-clip-grad-mixed"]
