"""The token-id scan (sftdoctor/facts/token_ids.py) on a million chat rows, against the reading it cannot avoid, in
the same run.

    python bench/token_ids.py [--rows 1000000] [--every 1000]

Writes a JSONL training set of chat rows (60 words each, from a 20,000-word vocabulary) and a tokenizer grown past
its model's embedding: the bundled tiny example's byte-level BPE (384 ids, config.json vocab_size 384) with
`<tool_call>` and `</tool_call>` added (ids 384 and 385), which every `--every`-th row holds. Times, each in a child
process of its own:
- reading: every row read and parsed (sftdoctor.facts.data.rows: the file decoded, each line json.loads'd), which
  any scan of the rows must do;
- the scan as `sftdoctor check` runs it (transformers imported and the run's tokenizer loaded, every row searched,
  the first rows found tokenized), with the load timed apart: any token-id scan must load the tokenizer;
- tokenizing every row as the trainer would (the chat template rendered, batch-encoded by the Rust tokenizer), on a
  tenth of the rows, for scale (`--full-rows`).
Prints rows/s, the ratio to reading, the peak memory of each and whether every planted row was found.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, resource, sys, time
from pathlib import Path
from sftdoctor.facts.data import rows
from sftdoctor.facts.token_ids import scan, scan_full
request, mode = json.loads(sys.argv[1]), sys.argv[2]
began = time.perf_counter()
loaded = 0.0
if mode == "read":
    found = sum(1 for name in request["files"] for _ in rows(Path(name)))
else:
    out = scan(request) if mode == "scan" else scan_full(request, began)
    found, loaded = out["rows_out_of_range"], out["tokenizer_seconds"]
print(json.dumps({"seconds": time.perf_counter() - began, "found": found, "loaded": loaded,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make(folder: Path, rows: int, every: int) -> tuple[Path, int]:
    from transformers import AutoTokenizer

    model = folder / "model"
    shutil.copytree(ROOT / "examples" / "tiny" / "model", model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer.save_pretrained(model)
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(20000)]
    planted = 0
    with open(folder / "train.jsonl", "w") as f:
        for i in range(rows):
            text = " ".join(rng.choices(vocab, k=60))
            answer = text[200:]
            if i % every == 0:
                answer, planted = f"<tool_call>{answer}</tool_call>", planted + 1
            f.write(
                json.dumps(
                    {"messages": [{"role": "user", "content": text[:200]}, {"role": "assistant", "content": answer}]}
                )
                + "\n"
            )
    (folder / "run.toml").write_text(
        '[model]\npath = "model"\nweights = "random"\n[data]\ntrain = "train.jsonl"\n'
        "[training]\nglobal_batch_size = 8\nper_device_batch_size = 8\npacking = false\n"
    )
    return folder / "run.toml", planted


def request(config: Path, files: list[str]) -> dict:
    from sftdoctor.facts import Facts, Inputs

    facts = Facts(Inputs(config=config))
    return {"plan": facts.get("plan").to_json(), "vocab_size": facts.get("model_config")["vocab_size"], "files": files}


def run(asked: dict, mode: str, cwd: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(asked), mode], capture_output=True, text=True, check=True, cwd=cwd
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--full-rows", type=int, default=100_000, help="rows to tokenize whole, for scale (0: skip)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config, planted = make(folder, options.rows, options.every)
        asked = request(config, [str(folder / "train.jsonl")])
        peer, ours = run(asked, "read", folder), run(asked, "scan", folder)
        full = None
        if options.full_rows:
            head = folder / "head.jsonl"
            with open(folder / "train.jsonl") as src, open(head, "w") as dst:
                for _, line in zip(range(options.full_rows), src):
                    dst.write(line)
            small = {**asked, "files": [str(head)]}
            full = (run(small, "read", folder), run(small, "full", folder))
    n = options.rows
    print(f"rows                 {n:,} chat rows, {planted:,} of them holding the 2 added tokens past the embedding")
    for label, took in (("reading", peer), ("token-id scan", ours)):
        print(f"{label:<21}{took['seconds']:.1f} s, {n / took['seconds']:,.0f} rows/s, peak {took['peak_mib']:.0f} MiB")
    rows_only = ours["seconds"] - ours["loaded"]
    print(
        f"  of which           {ours['loaded']:.1f} s importing transformers (and torch) and loading the tokenizer, "
        f"{rows_only:.1f} s on the rows"
    )
    print(
        f"ratio                {ours['seconds'] / peer['seconds']:.2f}x reading the rows; "
        f"{ours['seconds'] / (peer['seconds'] + ours['loaded']):.2f}x reading them and loading the tokenizer "
        f"(what any token-id scan must do); the rows alone {rows_only / peer['seconds']:.2f}x"
    )
    print(f"found                {ours['found']:,} of {planted:,} planted rows")
    if full:
        read, whole = full
        m = options.full_rows
        print(
            f"tokenizing all       {whole['seconds']:.1f} s for {m:,} rows ({m / whole['seconds']:,.0f} rows/s): "
            f"{whole['seconds'] / read['seconds']:.1f}x reading them ({read['seconds']:.2f} s); "
            f"found {whole['found']:,}"
        )


if __name__ == "__main__":
    main()
