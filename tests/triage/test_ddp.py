"""DDP's reducer errors (kb topics ddp-unused-parameters and gradient-checkpointing): each real log of the corpus
named with its rank, parameters and their kind, pasted plain, as a markdown quote, wrapped at 80 columns and
quoted+wrapped; the message's other variants from torch's own text; and a real 2-rank gloo DDP run of the shrunk
Gemma 3 whose error is named, and whose unused parameters are the ones the unused_parameters probe predicts."""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import FIXTURES
from triage.helpers import LOGS, by_file, diagnosis_of, log_bytes, problems, quoted, wrapped

from sftdoctor.triage import diagnose

MINE = [e for e in LOGS if e["file"].startswith("ddp-")]
HERE = os.path.dirname(__file__)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pasted(text: str) -> dict[str, str]:
    return {"plain": text, "quoted": quoted(text), "wrapped": wrapped(text), "quoted+wrapped": quoted(wrapped(text))}


def test_the_classes_have_three_real_logs_each_from_different_projects():
    for prefix in ("ddp-unused-params-", "ddp-ready-twice-"):
        projects = {e["project"] for e in MINE if e["file"].startswith(prefix)}
        assert len(projects) >= 3, prefix


@pytest.mark.parametrize("entry", MINE, ids=by_file(MINE))
@pytest.mark.parametrize("form", ["plain", "quoted", "wrapped", "quoted+wrapped"])
def test_each_log_names_its_cause_with_the_specifics_it_shows(entry, form):
    text = pasted(log_bytes(entry["file"]).decode())[form]
    diagnosis = diagnose(io.BytesIO(text.encode()), entry["file"])
    assert sorted(problems(diagnosis)) == sorted(entry["expect"]), entry["what"]
    root = diagnosis.root.finding
    assert diagnosis.root is diagnosis.findings[0] and diagnosis.root.role == "root"
    [topic] = entry["expect"]
    assert root.id == topic
    for key, value in entry["evidence"][topic].items():
        assert root.evidence.get(key) == value, key


def test_a_lora_adapter_marked_ready_twice_is_named_with_its_rank_and_the_fix_names_use_reentrant():
    root = diagnosis_of("ddp-ready-twice-qwen2vl-lora-ms-swift.log").root.finding
    assert root.title.startswith(
        "DDP marked parameter 279 (base_model.model.model.layers.27.mlp.down_proj."
        "lora_B.default.weight, LoRA adapters) ready twice in one step on rank 0"
    )
    assert "use_reentrant': False" in root.fix


def test_the_command_lines_setting_is_quoted_and_the_fix_points_at_it():
    root = diagnosis_of("ddp-unused-params-qwen-moe-lora-llamafactory.log").root.finding
    assert root.title.endswith("find_unused_parameters was off (the log sets ddp_find_unused_parameters False)")
    assert root.fix.startswith("set ddp_find_unused_parameters=True")


@pytest.mark.parametrize(
    "file, topic",
    [
        ("ddp-unused-params-lora-mamba-vlm-peft.log", "ddp-unused-parameters"),
        ("ddp-ready-twice-vision-encoder-visrag.log", "gradient-checkpointing"),
    ],
)
def test_the_message_is_recognised_wherever_a_paste_breaks_it(file, topic):
    """Needles with no word gap in common: a break at any one space of the message keeps one whole; and a paste
    wrapped at any width from 50 columns is read."""
    text = log_bytes(file).decode()
    first = next(line for line in text.splitlines() if "Expected to" in line)  # alone: no parameter line to help
    for space in [i for i, c in enumerate(first) if c == " "][:40]:
        broken = first[:space] + "\n" + first[space + 1 :] + "\n"
        assert sorted(problems(diagnose(io.BytesIO(broken.encode())))) == [topic], first[:space]
    for width in range(50, 121):
        wrapped = "\n".join(textwrap.fill(line, width, break_on_hyphens=False) for line in text.splitlines()) + "\n"
        assert sorted(problems(diagnose(io.BytesIO(wrapped.encode())))) == [topic], width


# torch 2.13 reducer.cpp's two other forms of the message (ensure_prior_reduction_finished), as it builds them.
HEAD = "Expected to have finished reduction in the prior iteration before starting a new one. "
ON = (
    HEAD + "This error indicates that your module has parameters that were not used in producing loss. Since "
    "`find_unused_parameters=True` is enabled, this likely  means that not all `forward` outputs participate in "
    "computing loss. You can fix this by making sure all `forward` function outputs participate in calculating "
    "loss. "
)
STATIC = (
    HEAD + "This error indicates that your training graph has changed in this iteration, e.g., one parameter is "
    "used in first iteration, but then got unused in the second iteration. this is not compatible with "
    "static_graph set to True."
)


@pytest.mark.parametrize(
    "message, mode, says",
    [
        (ON, "on", "did not all reach the loss on rank 3, although find_unused_parameters=True"),
        (STATIC, "static_graph", "static_graph=True, but the parameters a step uses changed between steps on rank 3"),
    ],
)
def test_the_other_forms_of_the_message_name_what_they_mean(message, mode, says):
    log = f"[rank3]: RuntimeError: {message}\n[rank3]: Parameter indices which did not receive grad for rank 3: 7 8\n"
    for text in pasted(log).values():
        root = diagnose(io.BytesIO(text.encode())).root.finding
        assert root.id == "ddp-unused-parameters" and says in root.title
        assert root.evidence["find_unused_parameters"] == mode and root.evidence["indices"] == [7, 8]


@pytest.mark.slow  # ~17 s of CPU: torchrun, 2 ranks, torch + transformers in each
def test_a_real_ddp_run_of_the_shrunk_gemma_3_fails_as_the_probe_predicts_and_is_named(tmp_path):
    """Two gloo ranks train the shrunk Gemma 3 on text rows with find_unused_parameters off, as transformers sets it
    when checkpointing is on: the second step raises the reducer's error; explain --log names it; the parameters it
    lists are exactly those the unused_parameters probe recorded for this config."""
    config = FIXTURES / "unused_parameters" / "configs" / "gemma-3-4b-it"
    env = {
        **os.environ,
        "TORCH_DISTRIBUTED_DEBUG": "INFO",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.path.dirname(os.path.dirname(HERE)),
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]
    command = [*launcher, os.path.join(HERE, "ddp_unused_worker.py"), str(config), "off"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        log, _ = proc.communicate(timeout=180)
    finally:  # the launcher and both ranks, whatever happened
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "step 0 done" in log and "step 1 done" not in log
    diagnosis = diagnose(io.BytesIO(log.encode()))
    root = diagnosis.root.finding
    assert root.id == "ddp-unused-parameters" and root.evidence["find_unused_parameters"] == "off"
    assert root.evidence["kinds"] == ["vision tower"] and root.evidence["rank"] in (0, 1)
    assert "DDP waited for gradients that never came on rank" in root.title and "39 parameters" in root.title
    recorded = json.loads((FIXTURES / "unused_parameters" / "gemma-3-4b-it_full.json").read_text())
    listed = {name.replace(".0.", ".*.").replace(".1.", ".*.") for name in root.evidence["names"]}
    assert listed == {e["pattern"] for e in recorded["unused"]}
    assert len(root.evidence["names"]) == recorded["unused_tensors"] == len(root.evidence["indices"])
