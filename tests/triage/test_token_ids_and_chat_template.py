"""A token id past the embedding (token-ids) and chat rows without a chat template (chat-template): real logs of
public reports (tests/fixtures/logs/index.json cites each), pasted as users paste them; and the same errors raised
here by the installed torch and transformers, so that the signatures follow the stack's own words."""

import io
import json
import shutil
import traceback

from conftest import EXAMPLES
from triage.helpers import LOGS, log_bytes, quoted, wrapped

from sftdoctor.triage import diagnose

TOPICS = ("token-ids", "chat-template")
MINE = [entry for entry in LOGS if set(entry["expect"]) & set(TOPICS)]
COUNTED = ("count",)  # a wrap can put one message on two lines, each holding a needle


def root_of(text: str):
    return diagnose(io.BytesIO(text.encode())).root


def test_the_fix_names_what_to_run_and_change():
    cuda = root_of(log_bytes("token-ids-cuda-assert-lora-open-llama-3b-litgpt.log").decode())
    assert "--select token-ids" in cuda.finding.fix and "resize_token_embeddings" in cuda.finding.fix
    chat = root_of(log_bytes("chat-template-not-set-rank0-traceback-nvila-sft-vila.log").decode())
    assert "[model] chat_template" in chat.finding.fix and "chat_template_path" in chat.finding.fix


def _raised(call) -> str:
    try:
        call()
    except Exception:  # noqa: BLE001 - the library's own words are what the test wants
        return traceback.format_exc()
    raise AssertionError("expected the stack to raise")


def test_the_installed_transformers_refusal_is_named(tmp_path):
    """transformers 5.25 get_chat_template, on the tiny example's tokenizer with its template removed."""
    from transformers import AutoTokenizer

    folder = tmp_path / "base"
    shutil.copytree(EXAMPLES / "tiny" / "model", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = _raised(lambda: tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False))
    root = root_of(text)
    assert root.finding.id == "chat-template" and root.finding.evidence["signature"] == "chat-template-not-set"
    assert root_of(wrapped(quoted(text))).finding.id == "chat-template"


def test_the_installed_torchs_cpu_index_error_is_named():
    """torch 2.13 on the CPU: an embedding lookup past its rows."""
    import torch

    table = torch.nn.Embedding(8, 4)
    root = root_of(_raised(lambda: table(torch.tensor([[1, 8]]))))
    assert root.finding.id == "token-ids" and root.finding.evidence["signature"] == "token-ids-cpu-index"


def test_a_cuda_assertion_cut_mid_word_by_a_paste_is_still_named():
    """transformers#30464 pasted 'Assertion `srcIndex < srcSelectDim' / 'Size` failed.': the kernel's name stays."""
    log = (
        "../aten/src/ATen/native/cuda/Indexing.cu:1292: indexSelectLargeIndex: block: [126,0,0], thread: [32,0,0] "
        "Assertion `srcIndex < srcSelectDim\nSize` failed.\n"
        "RuntimeError: CUDA error: device-side assert triggered\n"
    )
    root = root_of(log)
    assert root.finding.id == "token-ids" and root.finding.evidence["kernel"] == "indexSelectLargeIndex"
