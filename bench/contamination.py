"""The contamination scan (sftdoctor/facts/contamination.py) on a million training rows, against the reading it
cannot avoid, in the same run.

    python bench/contamination.py [--rows 1000000] [--docs 2000] [--script latin|cjk]

Writes a JSONL training set of chat rows (60 words each, from a 20,000-word vocabulary; or with `--script cjk`,
200 characters each from the 3,000 first Han characters, which the eval documents use nearly all of, so that no
row is skipped as unknown) with `--docs` eval documents of 30 words (60 characters) planted in every 10,000th row,
scans it, and times the peer: reading the same rows and splitting them into words (units: words and single
characters), which any scan must do. Prints rows/s, the ratio to the peer, the peak memory of each (a child
process each) and whether every planted document was found.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys, time
from pathlib import Path
from sftdoctor.facts.contamination import row_text, scan, units, words
from sftdoctor.facts.data import rows
request = json.loads(sys.argv[1])
began = time.perf_counter()
if sys.argv[2] == "scan":
    out = scan(request)
    found = sum(s["touched"] for s in out["sources"].values())
else:
    split = units if request.get("script") == "cjk" else words
    found = sum(len(split(row_text(row))) > 0 for name in request["train"] for _, row in rows(Path(name)))
print(json.dumps({"seconds": time.perf_counter() - began, "found": found,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make(folder: Path, rows: int, docs: int, script: str = "latin") -> dict:
    rng = random.Random(0)
    if script == "cjk":
        vocab, sep, doc_size, row_size = [chr(0x4E00 + i) for i in range(3000)], "", 60, 200
    else:
        vocab, sep, doc_size, row_size = [f"w{i}" for i in range(20000)], " ", 30, 60
    documents = [sep.join(rng.choices(vocab, k=doc_size)) for _ in range(docs)]
    (folder / "eval.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    every = max(1, rows // docs)
    with open(folder / "train.jsonl", "w") as f:
        for i in range(rows):
            text = sep.join(rng.choices(vocab, k=row_size))
            if i % every == 0 and i // every < docs:
                text += " " + documents[i // every]
            cut = len(text) - len(documents[0]) - 1 if script == "cjk" else 200  # a planted document in one turn
            f.write(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": text[:cut]},
                            {"role": "assistant", "content": text[cut:]},
                        ]
                    }
                )
                + "\n"
            )
    return {
        "train": [str(folder / "train.jsonl")],
        "eval_files": [str(folder / "eval.jsonl")],
        "tasks": [],
        "include": None,
        "script": script,
    }


def run(request: dict, mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(request), mode], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--script", choices=["latin", "cjk"], default="latin")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        request = make(Path(tmp), options.rows, options.docs, options.script)
        peer, ours = run(request, "read"), run(request, "scan")
    print(f"rows                 {options.rows:,} ({options.docs:,} eval documents, planted in as many rows)")
    print(f"script               {options.script}")
    print(
        f"read and split       {peer['seconds']:.1f} s, {options.rows / peer['seconds']:,.0f} rows/s, "
        f"peak {peer['peak_mib']:.0f} MiB"
    )
    print(
        f"contamination scan   {ours['seconds']:.1f} s, {options.rows / ours['seconds']:,.0f} rows/s, "
        f"peak {ours['peak_mib']:.0f} MiB"
    )
    print(f"ratio                {ours['seconds'] / peer['seconds']:.2f}x the reading it cannot avoid")
    print(f"found                {ours['found']:,} of {options.docs:,} planted documents")


if __name__ == "__main__":
    main()
