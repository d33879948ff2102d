"""Whether the run trains on its own evaluation: the training rows against the documents of its `[eval]` tasks (as
the installed lm-eval loads them, local tasks included) and against its own eval file (`[data] eval`).

The rule is the one of the GPT-3 paper (appendix C) and lm-eval's decontamination: a document is dirty when a
13-gram of it (13 consecutive lowercased words) occurs in a training row. A document shorter than 13 words is
dirty when it occurs whole, provided it has at least `MIN_WHOLE` words; shorter ones are counted as too short to
judge, never as clean. The documents' n-grams are held in memory (an eval set is thousands of documents); the
training rows are streamed, so memory does not grow with the training set. It runs in a child process (lm-eval).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached

N = 13
MIN_WHOLE = 8
EXAMPLES = 3
TIMEOUT_S = 1800
_WORD = re.compile(r"\w+")


def probe_contamination(facts) -> dict[str, Any] | None:
    run = facts.get("run")
    if run is None or facts.get("data") is None or (run.eval is None and not run.data.eval):
        return None
    absolute = lambda names: [str(Path(n).resolve()) for n in names]  # noqa: E731 - the child may change folder
    request = {"train": absolute(run.data.train), "eval_files": absolute(run.data.eval),
               "tasks": list(run.eval.tasks) if run.eval else [],
               "include": str(Path(run.eval.include).resolve()) if run.eval and run.eval.include else None,
               "shown": {name: shown(name) for name in absolute([*run.data.train, *run.data.eval])}}
    files = [Path(p) for p in (*run.data.train, *run.data.eval)]
    if request["include"]:
        files += sorted(p for p in Path(request["include"]).rglob("*") if p.is_file())
    # keyed by the paths too: the examples name the files where they are
    return cached("contamination", request, files,
                  lambda: in_child("sftdoctor.facts.contamination", request, "the contamination scan", TIMEOUT_S))


def shown(path: str) -> str:
    """A file as the findings name it: relative to the working folder when it is below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def grams(tokens: list[str]) -> Iterator[tuple[str, ...]]:
    for i in range(len(tokens) - N + 1):
        yield tuple(tokens[i:i + N])


class Index:
    """The documents of one source (a task, or the eval file): each 13-gram (or a short document whole) -> the
    documents it occurs in."""

    def __init__(self, name: str, documents: Iterable[tuple[str, str]]):
        self.name, self.docs, self.short, self.vocab = name, [], 0, set()
        self.grams: dict[tuple[str, ...], list[int]] = {}
        self.whole: dict[tuple[str, ...], list[int]] = {}
        for where, text in documents:
            tokens = words(text)
            number = len(self.docs)
            self.docs.append(where)
            self.vocab.update(tokens)
            if len(tokens) >= N:
                for gram in set(grams(tokens)):
                    self.grams.setdefault(gram, []).append(number)
            elif len(tokens) >= MIN_WHOLE:
                self.whole.setdefault(tuple(tokens), []).append(number)
            else:
                self.short += 1
        self.touched: dict[int, dict[str, str]] = {}

    def scan(self, where: str, tokens: list[str]) -> None:
        for gram in grams(tokens):
            for doc in self.grams.get(gram, ()):
                self.touched.setdefault(doc, {"train": where, "eval": self.docs[doc], "overlap": " ".join(gram)})
        if self.whole:
            for size in {len(k) for k in self.whole}:
                for i in range(len(tokens) - size + 1):
                    for doc in self.whole.get(tuple(tokens[i:i + size]), ()):
                        self.touched.setdefault(doc, {"train": where, "eval": self.docs[doc],
                                                      "overlap": " ".join(tokens[i:i + size])})

    def result(self) -> dict[str, Any]:
        examples = [self.touched[d] for d in sorted(self.touched)[:EXAMPLES]]
        return {"docs": len(self.docs), "touched": len(self.touched), "too_short": self.short, "examples": examples}


def known_runs(tokens: list[str], vocab: set[str]) -> Iterator[list[str]]:
    """The stretches of a row made only of words the documents use, long enough to hold a match: the rest of the
    row cannot overlap them, and is never cut into n-grams (most of a training set, for a typical eval set)."""
    start = 0
    for i, token in enumerate([*tokens, None]):
        if token is None or token not in vocab:
            if i - start >= MIN_WHOLE:
                yield tokens[start:i]
            start = i + 1


# Keys of a row that label its text rather than hold it (a turn's role, a ShareGPT turn's speaker).
LABELS = {"role", "from", "name", "id", "weight", "loss", "tool_call_id"}


def row_text(row: Any) -> str:
    """Every string of a row (the turns of a conversation, a prompt and its completion, a text): what is trained on."""
    if isinstance(row, str):
        return row
    if isinstance(row, dict):
        return "\n".join(row_text(v) for k, v in row.items() if k not in LABELS)
    if isinstance(row, list):
        return "\n".join(row_text(v) for v in row)
    return ""


def task_documents(tasks: list[str], include: str | None) -> list[tuple[str, list[tuple[str, str]]]]:
    """(task, its documents as lm-eval renders them: the question and its answer)."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include) if include else TaskManager()
    before = os.getcwd()
    if include:  # lm-eval reads a local task's data_files from the working directory (as sftdoctor eval runs it)
        os.chdir(include)
    try:
        return [(task_name, list(_rendered(task_name, task))) for name in tasks
                for task_name, task in manager.load([name])["tasks"].items()]
    finally:
        os.chdir(before)


def _rendered(name: str, task) -> Iterator[tuple[str, str]]:
    for number, doc in enumerate(task.eval_docs):
        target = task.doc_to_target(doc)
        if task.get_config("output_type") == "multiple_choice" and isinstance(target, int):
            choices = task.doc_to_choice(doc)
            target = choices[target] if 0 <= target < len(choices) else ""
        yield f"{name} document {number}", f"{task.doc_to_text(doc)} {target}"


def scan(request: dict[str, Any]) -> dict[str, Any]:
    from sftdoctor.facts.data import rows

    began = time.perf_counter()
    names = request.get("shown") or {}
    indexes = [Index(f"eval file {Path(name).name}", ((f"{names.get(name, name)} {where}", row_text(row))
                                                      for where, row in rows(Path(name))))
               for name in request["eval_files"]]
    if request["tasks"]:
        for name, documents in task_documents(request["tasks"], request["include"]):
            indexes.append(Index(name, documents))
    vocab = set().union(*(index.vocab for index in indexes))
    count = 0
    for name in request["train"]:
        for where, row in rows(Path(name)):
            count += 1
            for stretch in known_runs(words(row_text(row)), vocab):
                for index in indexes:
                    index.scan(f"{names.get(name, name)} {where}", stretch)
    return {"train_rows": count, "seconds": round(time.perf_counter() - began, 2),
            "sources": {index.name: index.result() for index in indexes}}


if __name__ == "__main__":
    serve(scan)
