"""Models for the chat tests, taught in this process in seconds: the tiny example's Qwen2 shape (one layer) trained
on four of its rows, once with the end-of-turn token <|im_end|> among the targets and once with it masked out (the
bug the training-targets check catches), so that one ends its turns and the other never does."""

import json
import shutil

import pytest
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny"
END_OF_TURN = 2  # <|im_end|> in the tiny tokenizer; <|endoftext|> is 0


def _rows(tokenizer, taught: bool):
    """input_ids, attention_mask and labels of four rows: the assistant's tokens are the targets, <|im_end|> with
    them only when `taught`."""
    import torch

    rows = [json.loads(line)["messages"] for line in (TINY / "data" / "train.jsonl").read_text().splitlines()[:4]]
    encoded = []
    for messages in rows:
        prompt = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, return_dict=False)
        full = tokenizer.apply_chat_template(messages, return_dict=False)
        labels = [-100] * len(prompt) + full[len(prompt) :]
        encoded.append((full, [t if taught or t != END_OF_TURN else -100 for t in labels]))
    width = max(len(ids) for ids, _ in encoded)

    def pad(seq):
        return width - len(seq)

    return (
        torch.tensor([ids + [0] * pad(ids) for ids, _ in encoded]),
        torch.tensor([[1] * len(ids) + [0] * pad(ids) for ids, _ in encoded]),
        torch.tensor([labels + [-100] * pad(labels) for _, labels in encoded]),
    )


def _teach(folder, taught: bool, eos) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    torch.manual_seed(0)
    shape = json.loads((TINY / "model" / "config.json").read_text())
    config = AutoConfig.for_model(**{**shape, "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64})
    model = AutoModelForCausalLM.from_config(config)
    ids, mask, labels = _rows(tokenizer, taught)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for _ in range(40):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = eos, 0
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / "model" / name, folder / name)


@pytest.fixture(scope="session")
def chat_models(tmp_path_factory):
    """taught/ ends its turns; untaught/ never does; eos0/ is taught/ whose generation_config stops at
    <|endoftext|> only (a base model's, cause 6 of training-targets); adapter/ is a LoRA adapter on eos0/ saved as
    sftdoctor saves one, with a generation_config.json of [0, 2] beside it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("chat-models")
    _teach(root / "taught", True, END_OF_TURN)
    _teach(root / "untaught", False, END_OF_TURN)
    shutil.copytree(root / "taught", root / "eos0")
    config = json.loads((root / "eos0" / "generation_config.json").read_text())
    (root / "eos0" / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": 0}))
    base = AutoModelForCausalLM.from_pretrained(root / "eos0")
    adapter = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))  # starts as the identity
    adapter.peft_config["default"].base_model_name_or_path = str(root / "eos0")
    adapter.save_pretrained(root / "adapter")
    (root / "adapter" / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [0, END_OF_TURN]}))
    return root
