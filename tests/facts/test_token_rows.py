"""The template tokens' embedding rows read from a real checkpoint (the tiny Qwen2 saved with two of its rows
zeroed, as a base model released before its chat template has them), then the check, the repair at load and a
run that trains from the repaired rows."""

import json
import shutil
import subprocess
import sys

import pytest
from trainrun import config, train

from sftdoctor.facts import Facts, Inputs

pytestmark = pytest.mark.slow  # a checkpoint saved, a child process, and a short run


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_data):
    """tiny_data's model saved as a pretrained checkpoint whose <|im_start|> (1) and <|im_end|> (2) rows are zeros."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    source = tiny_data["messages"] / "model"
    folder = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
    with torch.no_grad():
        model.get_input_embeddings().weight[[1, 2]] = 0.0
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


def run_config(tmp_path, tiny_data, base, repair: bool):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = config(
        tmp_path,
        tiny_data["messages"],
        training={"max_steps": 2, "save_steps": 2},
        extra={"model": {"path": str(base), "weights": "pretrained", "repair_untrained_tokens": repair}},
    )
    return cfg


def test_the_zeroed_rows_are_read_without_loading_the_model(tmp_path, tiny_data, base):
    fact = Facts(Inputs(config=run_config(tmp_path, tiny_data, base, False))).get("token_rows")
    rows = fact["input"]["rows"]
    assert {t: (r["id"], r["max_abs"]) for t, r in rows.items() if r["max_abs"] == 0} == {
        "<|im_start|>": (1, 0.0),
        "<|im_end|>": (2, 0.0),
    }
    assert (
        "<|endoftext|>" not in rows
    )  # the pad token here (its row starts at zero: padding_idx), not written by the template
    assert fact["input"]["vocab"] == 384 and fact["input"]["median_norm"] > 0
    assert "output" not in fact  # tied: the checkpoint has no lm_head of its own


def check(cfg):
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--config", str(cfg), "--select", "untrained-tokens", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    [finding] = [f for f in json.loads(proc.stdout)["findings"] if f["id"].split("/")[0] == "untrained-tokens"]
    return proc.returncode, finding


def test_the_check_stops_the_run_and_the_repair_trains_from_the_mean(tmp_path, tiny_data, base):
    code, finding = check(run_config(tmp_path / "a", tiny_data, base, False))
    assert code == 1 and finding["severity"] == "error"
    assert finding["title"] == (
        "2 template token(s) were never trained in the base checkpoint: <|im_start|> (all zeros); "
        "<|im_end|> (all zeros)"
    )
    assert "[model] repair_untrained_tokens = true" in finding["fix"]

    cfg = run_config(tmp_path / "b", tiny_data, base, True)
    code, finding = check(cfg)
    assert code == 0 and finding["severity"] == "info" and "repaired at load" in finding["title"]
    proc = train(cfg)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (
        "sftdoctor: the untrained embedding rows of token ids [1, 2] set to the mean of the trained rows "
        "([model] repair_untrained_tokens)"
    ) in proc.stdout
    from safetensors import safe_open

    with safe_open(str(tmp_path / "b" / "out" / "final" / "model.safetensors"), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    assert float(emb[1].abs().max()) > 0 and float(emb[2].abs().max()) > 0
