"""Whether the run trains on its own evaluation: the training rows against the documents of its `[eval]` tasks (as
the installed lm-eval loads them, local tasks included) and against its own eval files (`[data] eval`).

Text in scripts that put spaces between words is judged by the rule of the GPT-3 paper (appendix C) and lm-eval's
decontamination: a document is dirty when a 13-gram of it (13 consecutive lowercased words) occurs in a training
row. Scripts without spaces (Chinese, Japanese, Thai, Lao, Khmer, Myanmar) have no words to count: there a
character is the unit and the n-gram is of characters (`RULES`, where the numbers are justified). Each document is
judged by the rule of the script most of its units are in, so Chinese with Latin words and digits in it is judged
by characters, English quoting a Chinese name by words. A document shorter than its rule's n is dirty when it
occurs whole, provided it has at least the rule's `whole` units; shorter ones are counted as too short to judge,
never as clean. The documents' n-grams are held in memory (an eval set is thousands of documents); the training
rows are streamed, and a huge row is cut into bounded pieces, so memory does not grow with the training set. It
runs in a child process (lm-eval).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, regular_file
from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached

EXAMPLES = 3
TIMEOUT_S = 1800


@dataclass(frozen=True)
class Rule:
    label: str  # as the finding names it
    n: int  # a document is dirty when n consecutive units of it occur in a training row
    whole: int  # a document of whole..n-1 units must occur whole; a shorter one is too short to judge
    unit: str


# Words: GPT-3 (Brown et al. 2020, appendix C) and lm-eval's decontamination (lm_eval/decontamination/janitor.py,
# ngram_n=13): 13 words; documents of 8 to 12 words must occur whole.
# CJK (Han, Hiragana, Katakana): the same span of text, counted in characters. Word-segmented Chinese corpora hold
# 1.65 (PKU: 1,826,448 characters in 1,109,947 words) to 1.71 (MSR: 4,050,469 in 2,368,391) characters a word
# (SIGHAN 2005 bakeoff), so 13 words are about 22 characters; 25 keeps the rule at least as strict as the word rule
# for Japanese too, whose words carry kana endings. 8 words are about 14 characters: documents of 15 to 24 must occur
# whole. A shared idiom (4 characters), a greeting or a set instruction ("请回答下面的问题", 8) is far shorter.
# Thai, Lao, Khmer, Myanmar: a character here is a code point, and every vowel sign and tone mark is one, so a word
# is several code points; no segmented-corpus figure could be verified for them, so they take the span GPT-4's
# contamination check used for every language (OpenAI 2023, appendix C: 50 characters after removing spaces and
# symbols), and 30 (its 3/5, as 8/13 of the word rule) must occur whole.
WORD = Rule("word 13-grams", 13, 8, "words")
CJK = Rule("CJK character 25-grams", 25, 15, "characters")
SOUTHEAST = Rule("Thai/Lao/Khmer/Myanmar character 50-grams", 50, 30, "characters")
RULES = (WORD, CJK, SOUTHEAST)

# Unicode blocks of the scripts written without spaces between words (Hangul is written with spaces: words).
_CJK = (
    "\u3005-\u3007\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f"
)
_SOUTHEAST = "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u19e0-\u19ff\ua9e0-\ua9ff\uaa60-\uaa7f"


class _Deferred:
    """A pattern compiled at its first use, which then takes its name in this module: compiling these Unicode
    classes costs milliseconds that a plain `check` (whose catalogue imports this module) never uses."""

    def __init__(self, name: str, pattern: str):
        self.name, self.pattern = name, pattern

    def __getattr__(self, attribute: str) -> Any:
        compiled = globals()[self.name] = re.compile(self.pattern)
        return getattr(compiled, attribute)


# One unit: a character of those scripts, or a word (a run of other word characters), as \w+ splits spaced text.
_UNIT = _Deferred("_UNIT", rf"[{_CJK}{_SOUTHEAST}]|[^\W{_CJK}{_SOUTHEAST}]+")
_WORD = re.compile(r"\w+")
_UNSPACED = _Deferred("_UNSPACED", rf"[{_CJK}{_SOUTHEAST}]")
_IS_CJK = _Deferred("_IS_CJK", rf"[{_CJK}]")
_IS_SOUTHEAST = _Deferred("_IS_SOUTHEAST", rf"[{_SOUTHEAST}]")
PIECE = 1 << 20  # characters of a training row tokenized at once: a 100 MB row never becomes 100 M strings


@fact(
    "contamination",
    "the training rows' n-gram overlap (13 words; 25 or 50 characters in scripts without spaces) with the [eval] "
    "tasks' documents and the eval files",
    inputs=RUN_CONFIG,
    why_missing="needs a run config with [eval] tasks or a [data] eval file",
    needs=("run",),
)
def probe_contamination(facts, run) -> dict[str, Any] | None:
    found = facts.get("data_source") or {}  # the files a hub dataset resolved to, or the data files
    train, evaluation = found.get("train") or run.data.train, found.get("eval") or run.data.eval
    if facts.get("data") is None or (run.eval is None and not evaluation):
        return None
    absolute = lambda names: [str(Path(n).resolve()) for n in names]  # noqa: E731 - the child may change folder
    request = {
        "train": absolute(train),
        "eval_files": list(dict.fromkeys(absolute(evaluation))),
        "tasks": list(run.eval.tasks) if run.eval else [],
        "include": str(Path(run.eval.include).resolve()) if run.eval and run.eval.include else None,
        "shown": {name: shown(name) for name in absolute([*train, *evaluation])},
    }
    files = [Path(p) for p in (*train, *evaluation)]
    for path in files:  # hashed for the cache key: a FIFO or a device is never opened
        regular_file(path, "data")
    if request["include"]:
        files += sorted(p for p in Path(request["include"]).rglob("*") if p.is_file())
    # keyed by the paths too: the examples name the files where they are
    return cached(
        "contamination",
        request,
        files,
        lambda: in_child("sftdoctor.facts.contamination", request, "the contamination scan", TIMEOUT_S),
    )


def shown(path: str) -> str:
    """A file as the findings name it: relative to the working folder when it is below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def distinct_names(paths: list[str]) -> dict[str, str]:
    """Each path by its shortest ending that no other path shares: `test.jsonl` alone, `a/test.jsonl` and
    `b/test.jsonl` side by side (two files of one name never hide each other)."""
    parts = {path: Path(path).parts for path in paths}
    names: dict[str, str] = {}
    for path, own in parts.items():
        for length in range(1, len(own) + 1):
            ending = own[-length:]
            if not any(other[-length:] == ending for p, other in parts.items() if p != path):
                break
        names[path] = Path(*ending).as_posix() if length < len(own) else path
    return names


def words(text: str) -> list[str]:
    """The words of a text as the word rule counts them (lm-eval's, GPT-3's): runs of word characters, lowercased;
    a run of Chinese is one word here."""
    return _WORD.findall(text.lower())


def units(text: str) -> list[str]:
    """The units of a text as the character rules count them: words, and each character of a script without
    spaces on its own."""
    if _UNSPACED.search(text) is None:  # most rows of most sets: the plain split is the faster one
        return words(text)
    return _UNIT.findall(text.lower())


def rule_of(units: list[str]) -> Rule:
    """The rule of the script most of a document's units are in (characters win a tie: their rule is the longer)."""
    cjk = sum(len(u) == 1 and _IS_CJK.match(u) is not None for u in units)
    southeast = sum(len(u) == 1 and _IS_SOUTHEAST.match(u) is not None for u in units)
    spaced = len(units) - cjk - southeast
    if max(cjk, southeast) < spaced or not units:
        return WORD
    return CJK if cjk >= southeast else SOUTHEAST


def joined(units: Iterable[str]) -> str:
    """Units as text again: a space between two words, none next to a character of a script without spaces."""
    out: list[str] = []
    last = False
    for unit in units:
        spaced = not (len(unit) == 1 and (_IS_CJK.match(unit) or _IS_SOUTHEAST.match(unit)))
        if out and spaced and last:
            out.append(" ")
        out.append(unit)
        last = spaced
    return "".join(out)


class Codebook:
    """Every unit of the documents as one character: an n-gram is then a string of n characters, cheaper to slice
    and hash than a tuple of n strings. A unit no document uses is `UNKNOWN` (no n-gram holds it), so a row's
    code splits on it into the stretches that can hold a match."""

    LIMIT = 0x110000
    UNKNOWN = "\x00"

    def __init__(self):
        self.codes: dict[str, str] = {}
        self.units: list[str] = [""]  # code 0 is UNKNOWN

    def encode(self, units: list[str]) -> str:
        codes = self.codes
        for unit in units:
            if unit not in codes:
                if len(self.units) >= self.LIMIT:
                    raise ValueError(f"the eval documents use over {self.LIMIT:,} distinct words: too many to index")
                codes[unit] = chr(len(self.units))
                self.units.append(unit)
        return "".join([codes[u] for u in units])

    def known(self, units: list[str]) -> str:
        """The code of units all known (a stretch of `known_runs`)."""
        codes = self.codes
        return "".join([codes[u] for u in units])

    def stretches(self, tokens: list[str], shortest: int) -> list[str]:
        """The codes of the stretches of known units at least `shortest` long: what `known_runs` gives, encoded,
        in one pass of C (a dictionary look-up per unit, and a split)."""
        return _stretches(shortest).findall("".join(map(self.codes.get, tokens, itertools.repeat(self.UNKNOWN))))

    def decode(self, code: str) -> str:
        return joined(self.units[ord(c)] for c in code)


class Index:
    """The documents of one source (a task, or an eval file): each n-gram (or a short document whole) -> the
    documents it occurs in, with the rule that judged each document."""

    def __init__(self, name: str, documents: Iterable[tuple[str, str]], codebook: Codebook | None = None):
        self.name, self.docs, self.book = name, [], codebook or Codebook()
        self.judged: dict[str, int] = {}
        self.short: dict[str, int] = {}
        # (by characters, n) -> n-gram -> documents; (by characters, size) -> a short document whole -> documents
        self.grams: dict[tuple[bool, int], dict[str, list[int]]] = {}
        self.whole: dict[tuple[bool, int], dict[str, list[int]]] = {}
        self.rules: list[Rule] = []
        for where, text in documents:
            self.add(where, text)
        self.touched: dict[int, dict[str, str]] = {}

    def add(self, where: str, text: str) -> None:
        split = units(text)
        rule = rule_of(split)
        number, code = len(self.docs), self.book.encode(words(text) if rule is WORD else split)
        self.docs.append(where)
        self.rules.append(rule)
        characters = rule is not WORD
        if len(code) >= rule.n:
            grams = self.grams.setdefault((characters, rule.n), {})
            for gram in {code[i : i + rule.n] for i in range(len(code) - rule.n + 1)}:
                grams.setdefault(gram, []).append(number)
        elif len(code) >= rule.whole:
            self.whole.setdefault((characters, len(code)), {}).setdefault(code, []).append(number)
        else:
            self.short[rule.label] = self.short.get(rule.label, 0) + 1
            return
        self.judged[rule.label] = self.judged.get(rule.label, 0) + 1

    def sizes(self) -> set[tuple[bool, int]]:
        """(by characters, length) of every n-gram and whole document this index looks for."""
        return {*self.grams, *self.whole}

    def scan(self, where: str, tokens: list[str] | str, characters: bool | None = None) -> None:
        """Mark the documents a stretch of a training row (its tokens, or their code) holds an n-gram of: of the
        word rule (`characters` False: the stretch is of words), of the character rules (True: of units), or of
        all (None: the row has no character of a script without spaces, so its words are its units)."""
        if not isinstance(tokens, str):
            for stretch in known_runs(tokens, self.book.codes, 1):
                self.scan(where, self.book.known(stretch), characters)
            return
        code = tokens
        for (by_characters, size), grams in (*self.grams.items(), *self.whole.items()):
            if characters is None or by_characters == characters:
                # every window looked up in one comprehension (the hot loop: ~0.2 us a window), hits handled after
                for i in [i for i in range(len(code) - size + 1) if code[i : i + size] in grams]:
                    for doc in grams[code[i : i + size]]:
                        self._touch(doc, where, code[i : i + size])

    def _touch(self, doc: int, where: str, gram: str) -> None:
        if doc not in self.touched:
            rule = self.rules[doc]
            self.touched[doc] = {
                "train": where,
                "eval": self.docs[doc],
                "overlap": self.book.decode(gram),
                "rule": rule.label,
                "shared": f"{len(gram)} {rule.unit}",
            }

    def result(self) -> dict[str, Any]:
        examples = [self.touched[d] for d in sorted(self.touched)[:EXAMPLES]]
        below = sorted({f"{r.whole} {r.unit}" for r in RULES if r.label in self.short})
        return {
            "docs": len(self.docs),
            "touched": len(self.touched),
            "too_short": sum(self.short.values()),
            "examples": examples,
            "rules": {r.label: self.judged[r.label] for r in RULES if r.label in self.judged},
            "too_short_below": " or ".join(below),
        }


def known_runs(tokens: list[str], vocab, minimum: int = WORD.whole) -> Iterator[list[str]]:
    """The stretches of a row made only of units the documents use, long enough to hold a match: the rest of the
    row cannot overlap them, and is never cut into n-grams (most of a training set, for a typical eval set). The
    membership of every unit is one byte, and the runs are found by the regex engine: no Python loop per unit."""
    known = bytes(map(vocab.__contains__, tokens))
    for match in _runs(minimum).finditer(known):
        yield tokens[match.start() : match.end()]


@functools.cache
def _runs(minimum: int) -> re.Pattern:
    return re.compile(b"\x01{%d,}" % max(minimum, 1))


@functools.cache
def _stretches(minimum: int) -> re.Pattern:
    return re.compile(f"[^{Codebook.UNKNOWN}]{{{max(minimum, 1)},}}")


def pieces(text: str, overlap: int, split=units) -> Iterator[list[str]]:
    """The tokens of a training row (`split`: its units, or its words), `PIECE` characters at a time, each piece
    starting with the last `overlap` tokens of the one before (no n-gram is lost at a cut): memory bounded
    however long the row."""
    if len(text) <= PIECE:
        yield split(text)
        return
    carry: list[str] = []
    start = 0
    while start < len(text):
        end = _cut(text, start + PIECE)
        tokens = carry + split(text[start:end])
        yield tokens
        carry, start = tokens[-overlap:] if overlap else [], end


def _cut(text: str, at: int) -> int:
    """A place near `at` between two units (never inside a word of a spaced script, when one is near)."""
    if at >= len(text):
        return len(text)
    for i in range(at, max(at - 256, 1), -1):
        left, right = text[i - 1], text[i]
        if not (left.isalnum() and right.isalnum()) or _IS_CJK.match(right) or _IS_SOUTHEAST.match(right):
            return i
    return at


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
        return [
            (task_name, list(_rendered(task_name, task)))
            for name in tasks
            for task_name, task in manager.load([name])["tasks"].items()
        ]
    finally:
        os.chdir(before)


def _rendered(name: str, task) -> Iterator[tuple[str, str]]:
    for number, doc in enumerate(task.eval_docs):
        target = task.doc_to_target(doc)
        if task.get_config("output_type") == "multiple_choice" and isinstance(target, int):
            choices = task.doc_to_choice(doc)
            target = choices[target] if 0 <= target < len(choices) else ""
        yield f"{name} document {number}", f"{task.doc_to_text(doc)} {target}"


def file_rows(name: str) -> Iterator[tuple[str, Any]]:
    """The rows of a data file the user named; a FIFO, a device or a folder refused before it is opened."""
    from sftdoctor.facts.data import rows

    regular_file(name, "data")
    yield from rows(Path(name))


def eval_file_indexes(files: list[str], names: dict[str, str], book: Codebook) -> tuple[list[Index], dict]:
    """An index per eval file, named by the shortest ending of its path that tells it from the others; a file
    that cannot be read is a source not judged, with why."""
    indexes, unread = [], {}
    for path, ending in distinct_names(list(dict.fromkeys(files))).items():
        source = f"eval file {ending}"
        try:
            indexes.append(
                Index(
                    source,
                    ((f"{names.get(path, path)} {where}", row_text(row)) for where, row in file_rows(path)),
                    book,
                )
            )
        except InputError as exc:
            unread[source] = {"error": str(exc)}
    return indexes, unread


def scan(request: dict[str, Any]) -> dict[str, Any]:
    began = time.perf_counter()
    names, book = request.get("shown") or {}, Codebook()
    indexes, unread = eval_file_indexes(request["eval_files"], names, book)
    if request["tasks"]:
        for name, documents in task_documents(request["tasks"], request["include"]):
            indexes.append(Index(name, documents, book))
    plan = Plan(set().union(*(index.sizes() for index in indexes)))
    count = 0
    for name in request["train"]:
        for where, row in file_rows(name):
            count += 1
            if plan.all:
                scan_row(f"{names.get(name, name)} {where}", row_text(row), indexes, book, plan)
    sources = {index.name: index.result() for index in indexes}
    return {"train_rows": count, "seconds": round(time.perf_counter() - began, 2), "sources": {**sources, **unread}}


class Plan:
    """How a training row is split and cut, from the lengths the indexes look for: for both kinds of rule (None:
    a row with no character of a script without spaces, whose words are its units), for the word rule (False)
    and for the character rules (True), the shortest and the longest length."""

    def __init__(self, sizes: set[tuple[bool, int]]):
        spans = {kind: [size for k, size in sizes if kind is None or k == kind] for kind in (None, False, True)}
        self.span = {kind: (min(found), max(found)) for kind, found in spans.items() if found}
        self.all = self.span.get(None)
        self.mixed = [(kind, units if kind else words) for kind in (False, True) if kind in self.span]
        # with one kind of rule only, every row is split one way, and no row need be searched for its scripts
        self.one = self.mixed if len(self.mixed) == 1 else None

    def splits(self, text: str) -> list:
        if self.one is not None:
            return self.one
        return [(None, words)] if _UNSPACED.search(text) is None else self.mixed


def scan_row(place: str, text: str, indexes: list[Index], book: Codebook, plan: Plan) -> None:
    """One training row against every index: split once where it has no character of a script without spaces
    (its words are its units), else into words for the word rule and into units for the character rules."""
    for characters, split in plan.splits(text):
        shortest, longest = plan.span[characters]
        for tokens in [split(text)] if len(text) <= PIECE else pieces(text, longest - 1, split):
            for code in book.stretches(tokens, shortest):
                for index in indexes:
                    index.scan(place, code, characters)


if __name__ == "__main__":
    serve(scan)
