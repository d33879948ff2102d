"""Generate the bundled tiny example: a small chat dataset, a byte-level BPE tokenizer trained on
it with a chat template, and a tiny Qwen2 config. Deterministic; nothing is downloaded.

    python examples/make_tiny.py                      # writes examples/tiny/
    python examples/make_tiny.py --out DIR --shape prompt_completion --rows 200

The tasks are simple string transformations (reverse, sort, count, repeat) so that a model of
a few hundred thousand parameters learns them within a minute on a CPU and the loss falls clearly.
Sample lengths are skewed on purpose (a few long samples) so padding and packing matter.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

WORDS = [
    "red",
    "green",
    "blue",
    "cat",
    "dog",
    "sun",
    "moon",
    "tree",
    "rock",
    "bird",
    "fish",
    "star",
    "rain",
    "snow",
    "wind",
    "leaf",
    "apple",
    "pear",
    "plum",
    "lime",
    "kiwi",
    "fig",
    "date",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def task(rng: random.Random) -> tuple[str, str]:
    n = rng.choice([2, 3, 4, 5, 6, 8, 12, 24]) if rng.random() < 0.9 else rng.randint(40, 80)
    words = [rng.choice(WORDS) for _ in range(n)]
    kind = rng.choice(["reverse", "sort", "count", "first"])
    text = " ".join(words)
    if kind == "reverse":
        return f"reverse: {text}", " ".join(reversed(words))
    if kind == "sort":
        return f"sort: {text}", " ".join(sorted(words))
    if kind == "count":
        return f"count: {text}", str(len(words))
    return f"first: {text}", words[0]


def rows(n: int, shape: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt, answer = task(rng)
        if shape == "messages":
            out.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]})
        elif shape == "prompt_completion":
            out.append({"prompt": prompt + "\n", "completion": answer})
        else:
            out.append({"text": f"{prompt}\n{answer}"})
    return out


PROMPT = "<|im_start|>user\\n{{prompt}}<|im_end|>\\n<|im_start|>assistant\\n"  # the chat template's text
TASKS = {
    # lm-evaluation-harness tasks on held-out "count:" rows (how many words a list has), the one a
    # 60-step model learns clearly: a loglikelihood task (which of the list's four transformations is the
    # answer) and a generation task (exact match).
    "tiny_count_choice": f"""task: tiny_count_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: count.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{PROMPT}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
    "tiny_count_gen": f"""task: tiny_count_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: count.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{PROMPT}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
generation_kwargs:
  until: ["<|im_end|>"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
}


def eval_tasks(folder: Path, n: int, seed: int) -> None:
    """Held-out "count" rows and the two task YAMLs that read them (data_files are relative to this folder:
    `sftdoctor eval --include` runs lm-eval from the task folder)."""
    rng, docs = random.Random(seed), []
    while len(docs) < n:
        words = [rng.choice(WORDS) for _ in range(rng.choice([2, 3, 4, 5, 6, 8]))]
        answers = [str(len(words)), words[0], " ".join(reversed(words)), " ".join(sorted(words))]
        choices = list(dict.fromkeys(answers))  # the list's four transformations, as the training rows answer them
        docs.append({"prompt": "count: " + " ".join(words), "answer": answers[0], "choices": choices, "label": 0})
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "count.jsonl", docs)
    for name, text in TASKS.items():
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")


def write_jsonl(path: Path, data: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in data), encoding="utf-8")


HUB_README = """---
# Laid out as a Hugging Face dataset repository: `[data] train = "tiny/hub"` reads it as load_dataset does.
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
  - split: test
    path: data/test-*.parquet
---
# tiny

The tiny example's chat rows (examples/make_tiny.py) as Parquet shards: `train` and `test`.
"""


def hub_folder(folder: Path, train: list[dict], evaluation: list[dict]) -> None:
    """The same rows as a dataset repository: a README with `configs` and one Parquet shard per split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(HUB_README)
    for split, data in (("train", train), ("test", evaluation)):
        pq.write_table(
            pa.Table.from_pylist(data), folder / "data" / f"{split}-00000-of-00001.parquet", compression="zstd"
        )


def train_tokenizer(folder: Path, corpus: list[str], vocab_size: int = 384) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "model_max_length": 512,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )


# The tiny example's Qwen2: a few hundred thousand parameters, learns the tasks within a minute on a CPU.
TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
# Qwen/Qwen2-0.5B's config.json (https://huggingface.co/Qwen/Qwen2-0.5B/blob/main/config.json), less its
# vocabulary-independent extras: the benchmarks' realistic shape (bench/lora_vs_full.py --model-size 0.5b,
# bench/gpu), trained from scratch with this tokenizer. 494,032,768 parameters (tied).
QWEN2_05B_SHAPE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
}


def model_config(vocab_size: int, shape: dict = TINY_SHAPE, rope_theta: float = 10000.0) -> dict:
    """A Qwen2 config.json of this shape, with the tiny tokenizer's special ids."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "dtype": "float32",
        **shape,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "tie_word_embeddings": True,
        "use_cache": False,
        "bos_token_id": None,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


QWEN2_05B = model_config(151936, QWEN2_05B_SHAPE, rope_theta=1000000.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "tiny")
    parser.add_argument("--shape", choices=["messages", "prompt_completion", "text"], default="messages")
    parser.add_argument("--rows", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data, model = args.out / "data", args.out / "model"
    data.mkdir(parents=True, exist_ok=True)
    model.mkdir(parents=True, exist_ok=True)
    train, evaluation = rows(args.rows, args.shape, args.seed), rows(max(8, args.rows // 20), args.shape, args.seed + 1)
    write_jsonl(data / "train.jsonl", train)
    write_jsonl(data / "eval.jsonl", evaluation)
    hub_folder(args.out / "hub", train, evaluation)
    corpus = [json.dumps(r) for r in rows(2000, "messages", 1234)] + [
        f"<|im_start|>{r}\n" for r in ("user", "assistant")
    ]
    train_tokenizer(model, corpus)
    eval_tasks(args.out / "tasks", 100, args.seed + 2)
    vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    (model / "config.json").write_text(json.dumps(model_config(len(vocab)), indent=2) + "\n")
    print(
        f"wrote {len(train)} train and {len(evaluation)} eval rows ({args.shape}) and a {len(vocab)}-token "
        f"tokenizer under {args.out}"
    )


if __name__ == "__main__":
    main()
