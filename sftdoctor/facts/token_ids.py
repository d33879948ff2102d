"""Whether any training or eval row holds a token id the model's embedding has no row for (`config.json`
`vocab_size`): the ids the trainer will feed it, from the run's own tokenizer and chat template, every row.

An id >= vocab_size kills the first batch that holds it: `IndexError: index out of range in self` on a CPU,
`indexSelectLargeIndex ... Assertion srcIndex < srcSelectDimSize failed` then `CUDA error: device-side assert
triggered` on a GPU. It comes from a tokenizer grown by added tokens whose embedding was never resized, from
another model's tokenizer, or from a pad token the tokenizer added past the end.

Tokenizing a million rows with a fast tokenizer costs ~10x reading them, so the scan proves instead where it can,
from what a tokenizer can emit (tokenizers' AddedVocabulary splits added tokens out of the text, literally, before
the model sees the rest):
- "none": no id of the tokenizer (its vocabulary and added tokens) reaches vocab_size: no row can hold one; the
  rows are not read.
- "added": the only such ids are added tokens matched literally (not single_word, not inside a longer added token;
  a normalized one is looked for in the normalised text): a row holds one exactly when the text it is trained on
  contains the token's text. The rows' strings are searched for them (each turn's strings: TRL renders them into
  the chat template); the text the chat template writes around them is rendered once per conversation shape (the
  roles and keys of its turns), with placeholder contents. A JSON line that holds none of the tokens' texts as JSON
  writes them (and no \\u or \\/ escape) holds none in its strings: such rows are parsed, not searched. The first
  rows found are tokenized for real, as a check of the proof: one that disagrees sends the scan to "full".
- "full": otherwise (the tokenizer's own vocabulary is larger than the embedding: another model's tokenizer),
  every row is rendered and batch-encoded as the trainer does.
What is trained on, as TRL 1.16's SFTTrainer tokenizes it: chat rows rendered by the template and encoded without
special tokens; prompt-completion and text rows encoded with them (the tokenizer's BOS), the EOS appended.
Runs in a child process (transformers); streams the rows; cached by the files' contents.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.probe_cache import cached, folder_files

EXAMPLES = 5
BATCH = 1000
TIMEOUT_S = 3600
PLACEHOLDER = "x"
NOTHING = frozenset()  # a conversation shape whose render writes no out-of-range token
SPECIALS = ("pad", "eos", "bos", "unk")


@fact(
    "token_ids",
    "the token ids of every training and eval row, as the run's tokenizer and chat template give them, against the "
    "model's vocab_size (embedding rows)",
    inputs=RUN_CONFIG,
    why_missing="needs a run config whose model config.json (vocab_size) and tokenizer files are here",
    needs=("plan", "model_config"),
)
def probe_token_ids(facts, plan, model) -> dict[str, Any] | None:
    from sftdoctor.facts.tokenizer import tokenizer_folder

    if facts.get("data") is None or not isinstance(model.get("vocab_size"), int):
        return None
    folder = tokenizer_folder(plan.tokenizer_path)
    if folder is None or not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    files = [*plan.train_files, *plan.eval_files]
    request = {"plan": plan.to_json(), "vocab_size": model["vocab_size"], "files": files}
    # Keyed by the files' contents (watched) and names, not where they are: the answer names rows by file name, so
    # the same data and tokenizer copied elsewhere (another run directory, a sweep's trial) read the answer back.
    keyed = {
        "vocab_size": model["vocab_size"],
        "files": [Path(f).name for f in files],
        "chat_template": plan.chat_template,
        "format": plan.data_format,
        "shape": plan.data_shape,
    }
    watched = [Path(f) for f in files] + folder_files(folder)
    if plan.chat_template:
        watched.append(Path(plan.chat_template))
    return cached(
        "token-ids",
        keyed,
        watched,
        lambda: in_child("sftdoctor.facts.token_ids", request, "the token-id scan", TIMEOUT_S),
    )


# ---------------------------------------------------------------- in the child


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def placeholders(value: Any) -> Any:
    """A turn with every string but its role replaced: what the template writes around the contents."""
    if isinstance(value, dict):
        return {k: (v if k == "role" else placeholders(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [placeholders(v) for v in value]
    return PLACEHOLDER if isinstance(value, str) else value


def shape_key(turns: list[dict[str, Any]]) -> tuple:
    """What a template's writing around the contents depends on: each turn's role, and its keys (a turn of two keys
    is a role and its content: the data check makes it so)."""
    return tuple([t["role"] if len(t) == 2 and "role" in t else (t.get("role"), *t) for t in turns])


def contents(turns: list[dict[str, Any]]) -> str:
    """Every string of the turns but their roles (the shapes' renders keep those), joined by a character no token
    holds, so that no token is found across two of them. The row's hot path: a plain loop over plain turns."""
    texts = []
    for turn in turns:
        for key, value in turn.items():
            if key != "role":
                if type(value) is str:
                    texts.append(value)
                else:
                    texts.extend(strings(value))
    return "\x00".join(texts)


def shown(place: tuple[str, Any]) -> str:
    name, where = place
    return f"{name} line {where}" if isinstance(where, int) else f"{name} {where}"


def rows_with_lines(path: Path) -> Iterator[tuple[tuple[str, Any], dict[str, Any], str | None]]:
    """(place, row, its JSON line) of a data file, rows already checked by the data fact (facts/data.py): a JSON
    Lines file read line by line with its text kept for the prefilter, other formats through data.rows."""
    from sftdoctor.facts.data import rows

    if lines_of(path):
        loads = json.loads
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.isspace():
                    yield (path.name, number), loads(line), line
        return
    for where, row in rows(path):
        yield (path.name, where), row, None


def lines_of(path: Path) -> bool:
    """Whether a data file is JSON Lines (a .json file may be one, or an array)."""
    if path.suffix.lower() not in (".jsonl", ".json"):
        return False
    with open(path, encoding="utf-8") as handle:
        return not handle.read(256).lstrip().startswith("[")


class Trained:
    """What the trainer tokenizes of one row: chat turns to render (with the generation prompt's variant for a
    conversational prompt) or a text to encode with the tokenizer's special tokens."""

    def __init__(self, row: dict[str, Any], fmt: str, shape: str, eos: str):
        from sftdoctor.facts.data import to_messages

        self.turns: list[dict[str, Any]] | None = None
        self.prompt_turns = 0  # a conversational prompt-completion renders its prompt alone as well
        self.text = ""
        if shape == "messages":
            self.turns = row["messages"] if fmt == "messages" else to_messages(row, fmt)
        elif shape == "prompt_completion" and isinstance(row.get("prompt"), list):
            completion = row.get("completion") if isinstance(row.get("completion"), list) else []
            self.turns, self.prompt_turns = row["prompt"] + completion, len(row["prompt"])
        elif shape == "prompt_completion":
            self.text = f"{row['prompt']}{row.get('completion', '')}"
        else:
            self.text = str(row.get("text", ""))
        if self.turns is None and not self.text.endswith(eos):
            self.text += eos  # TRL's add_eos

    def renders(self, tokenizer, turns=None) -> list[str]:
        turns = self.turns if turns is None else turns
        out = [tokenizer.apply_chat_template(turns, tokenize=False)]
        if self.prompt_turns:
            out.append(
                tokenizer.apply_chat_template(turns[: self.prompt_turns], tokenize=False, add_generation_prompt=True)
            )
        return out

    def encoded(self, tokenizer) -> list[int]:
        if self.turns is None:
            return tokenizer(self.text)["input_ids"]
        return [i for text in self.renders(tokenizer) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def literal(token, added: dict[int, Any]) -> bool:
    """Whether an added token is in an encoding exactly when its text is in the text encoded (normalized first, for
    a token the normaliser applies to): not a whole-word-only token, and not part of a longer added token."""
    if token.single_word:
        return False
    return not any(token.content in other.content and other.content != token.content for other in added.values())


_UNICODE_FORMS = {"NFC", "NFD", "NFKC", "NFKD", "Sequence"}


class Finder:
    """The out-of-range added tokens in a text, found as the tokenizer finds them: a normalized token in the
    normalised text (a Unicode normal form leaves ASCII text as it is: not normalised), the others in the text."""

    def __init__(self, tokens: dict[int, Any], normalizer):
        normalized = {i: t for i, t in tokens.items() if t.normalized and normalizer is not None}
        self.raw = {t.content: i for i, t in tokens.items() if i not in normalized}
        self.norm = {normalizer.normalize_str(t.content): i for i, t in normalized.items()}
        self.normalize = normalizer.normalize_str if normalized else None
        self.ascii_same = normalizer is not None and set(re.findall(r"(\w+)\(", repr(normalizer))) <= _UNICODE_FORMS
        self.raw_re, self.norm_re = self._pattern(self.raw), self._pattern(self.norm)
        # A JSON line holds a string's text as is, but for its escapes: quotes, backslashes and control characters
        # (the forms below), and any character a writer chose to escape (\\uXXXX, \\/: then the line is read whole).
        forms = {
            json.dumps(t, ensure_ascii=False)[1:-1]
            for t in [*self.raw, *self.norm, *(t.content for t in normalized.values())]
        }
        self.line_re = self._pattern(forms)

    def may_hold(self, line: str) -> bool:
        """Whether a row's JSON line can hold one of the tokens in its strings (False: it cannot)."""
        if "\\u" in line or "\\/" in line or (self.norm_re and not (self.ascii_same and line.isascii())):
            return True
        return self.line_re.search(line) is not None

    @staticmethod
    def _pattern(texts):
        return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))) if texts else None

    def __call__(self, text: str) -> set[int]:
        found = {self.raw[t] for t in self.raw_re.findall(text)} if self.raw_re else set()
        if self.norm_re:
            normalized = text if self.ascii_same and text.isascii() else self.normalize(text)
            found.update(self.norm[t] for t in self.norm_re.findall(normalized))
        return found


class Scan:
    def __init__(self, tokenizer, vocab_size: int, shape: str, fmt: str):
        self.tokenizer, self.vocab_size, self.shape, self.fmt = tokenizer, vocab_size, shape, fmt
        vocab = tokenizer.get_vocab()
        self.size = max(vocab.values()) + 1
        added = tokenizer.added_tokens_decoder
        self.high = {i: t for t, i in vocab.items() if i >= vocab_size}
        normalizer = tokenizer.backend_tokenizer.normalizer if hasattr(tokenizer, "backend_tokenizer") else None
        self.model_high = sorted(i for i in self.high if i not in added)
        exact = not getattr(tokenizer, "split_special_tokens", False) and all(
            literal(added[i], added) for i in self.high if i in added
        )
        self.mode = "none" if not self.high else "added" if exact and not self.model_high else "full"
        self.find = Finder({i: added[i] for i in self.high if i in added}, normalizer)
        self.eos = tokenizer.eos_token or ""
        self.rows = self.hit_rows = 0
        self.refused: list[dict[str, str]] = []
        self.refused_count = 0
        self.examples: list[dict[str, Any]] = []
        self.found: dict[int, int] = {}  # out-of-range id -> rows holding it
        self.around: dict[int, int] = {}  # ids written around the contents (the chat template, a BOS) -> rows
        self.shapes: dict[tuple, set[int]] = {}
        self.pending: list[tuple[str, Trained]] = []
        self.largest = -1
        self.loaded = 0.0  # seconds to import the stack and load the tokenizer, of the scan's
        # the ids the tokenizer adds around every text it encodes with special tokens (a BOS): on text rows
        self.added_around = [i for i in tokenizer("")["input_ids"] if i >= vocab_size]

    # -- "added": literal search, the template's own writing rendered once per shape
    def template_ids(self, trained: Trained) -> set[int] | None:
        key = shape_key(trained.turns) if not trained.prompt_turns else (shape_key(trained.turns), trained.prompt_turns)
        if key not in self.shapes:
            try:
                rendered = "".join(trained.renders(self.tokenizer, placeholders(trained.turns)))
                self.shapes[key] = self.find(rendered) or NOTHING
            except Exception:  # noqa: BLE001 - a template that refuses placeholders: judged on each row's own render
                self.shapes[key] = None
        return self.shapes[key]

    def add_lines(self, name: str, handle) -> None:
        """A JSON Lines file of messages rows, in "added" mode: the hot loop. A row of a conversation shape the
        template writes no such token into, whose line cannot hold one in its strings, needs nothing more (most
        rows); any other goes through add()."""
        loads, shapes, may_hold = json.loads, self.shapes, self.find.may_hold
        for number, line in enumerate(handle, start=1):
            if line.isspace():
                continue
            row = loads(line)
            key = tuple([t["role"] if len(t) == 2 else (t.get("role"), *t) for t in row["messages"]])  # shape_key
            if shapes.get(key) is NOTHING and not may_hold(line):
                self.rows += 1
            else:
                self.add((name, number), row, line)

    def add(self, place: tuple[str, Any], row: dict[str, Any], line: str | None = None) -> None:
        """One row, at `place` (its file, and its line number or "row N"); `line`: its JSON text, when a JSON Lines
        file gave it, for the prefilter."""
        self.rows += 1
        return self._add(place, row, line)

    def _add(self, place, row, line) -> None:
        try:
            trained = Trained(row, self.fmt, self.shape, self.eos)
        except (KeyError, TypeError) as exc:
            self._refuse(place, f"{type(exc).__name__}: {exc}")
            return
        if self.mode == "full":
            self.pending.append((place, trained))
            if len(self.pending) >= BATCH:
                self.flush()
            return
        if trained.turns is None:
            ids, around = self.find(trained.text), set(self.added_around)
        else:
            around = self.template_ids(trained)
            if around is None:
                try:
                    around = self.find("".join(trained.renders(self.tokenizer)))
                except Exception as exc:  # noqa: BLE001 - the template refuses this row: the trainer would too
                    self._refuse(place, f"{type(exc).__name__}: {str(exc)[:200]}")
                    return
            ids = self.find(contents(trained.turns)) if line is None or self.find.may_hold(line) else set()
        if ids or around:
            self._record(place, ids | around, around, trained)

    def _record(self, place, ids, template, trained: Trained | None) -> None:
        if not ids:
            return
        where = shown(place)
        self.hit_rows += 1
        for i in ids:
            self.found[i] = self.found.get(i, 0) + 1
        for i in template:
            self.around[i] = self.around.get(i, 0) + 1
        self.largest = max(self.largest, *ids)
        if len(self.examples) < EXAMPLES:
            example = {"where": where, "ids": sorted(ids), "tokens": [self._token(i) for i in sorted(ids)]}
            if trained is not None:
                real = self._real(trained)
                example["confirmed"] = real is not None and max(real, default=-1) >= self.vocab_size
            self.examples.append(example)

    def _real(self, trained: Trained) -> list[int] | None:
        try:
            return trained.encoded(self.tokenizer)
        except Exception:  # noqa: BLE001 - judged by the search alone
            return None

    def _refuse(self, place, why: str) -> None:
        self.refused_count += 1
        if len(self.refused) < EXAMPLES:
            self.refused.append({"where": shown(place), "error": why})

    def _token(self, i: int) -> str:
        return self.tokenizer.convert_ids_to_tokens(i)

    # -- "full": render and batch-encode every row
    def flush(self) -> None:
        chats, plain = [], []
        for where, trained in self.pending:
            if trained.turns is None:
                plain.append((where, trained.text))
                continue
            try:
                chats.extend((where, text) for text in trained.renders(self.tokenizer))
            except Exception as exc:  # noqa: BLE001 - the template refuses this row
                self._refuse(where, f"{type(exc).__name__}: {str(exc)[:200]}")
        self.pending = []
        per_row: dict[str, set[int]] = {}
        for group, special in ((plain, True), (chats, False)):
            if not group:
                continue
            encoded = self.tokenizer([t for _, t in group], add_special_tokens=special)["input_ids"]
            for (where, _), ids in zip(group, encoded):
                top = max(ids, default=-1)
                self.largest = max(self.largest, top)
                if top >= self.vocab_size:
                    per_row.setdefault(where, set()).update(i for i in ids if i >= self.vocab_size)
        for where, ids in per_row.items():
            self._record(where, ids, (), None)

    def result(self, began: float) -> dict[str, Any]:
        specials = {name: getattr(self.tokenizer, f"{name}_token_id") for name in SPECIALS}
        out = {
            "vocab_size": self.vocab_size,
            "tokenizer_size": self.size,
            "mode": self.mode,
            "rows": self.rows if self.mode != "none" else None,
            "rows_out_of_range": self.hit_rows,
            "largest_id": self.largest if self.largest >= 0 else None,
            "out_of_range_tokens": {self._token(i): i for i in sorted(self.high)[:20]},
            "tokens_past_vocab": len(self.high),
            "vocabulary_past_vocab": len(self.model_high),
            "largest_token": self._token(self.largest) if self.largest >= 0 else None,
            "found": {self._token(i): n for i, n in sorted(self.found.items(), key=lambda kv: -kv[1])[:20]},
            "around_content": {self._token(i): n for i, n in sorted(self.around.items())},
            "examples": self.examples,
            "refused": self.refused,
            "refused_rows": self.refused_count,
            "specials": {k: v for k, v in specials.items() if v is not None},
            "specials_out_of_range": {k: v for k, v in specials.items() if v is not None and v >= self.vocab_size},
            "seconds": round(time.perf_counter() - began, 2),
            "tokenizer_seconds": round(self.loaded, 2),
        }
        return out


def scan(request: dict[str, Any]) -> dict[str, Any]:
    from sftdoctor.facts.trainer_inputs import load_tokenizer
    from sftdoctor.run import Plan

    began = time.perf_counter()
    plan = Plan.from_json(request["plan"])
    tokenizer = load_tokenizer(plan)  # the run's own: its chat template, pad = eos where it has none
    state = Scan(tokenizer, request["vocab_size"], plan.data_shape, plan.data_format)
    state.loaded = time.perf_counter() - began
    if state.mode != "none":
        for name in request["files"]:
            path = Path(name)
            if state.mode == "added" and state.fmt == "messages" and lines_of(path):
                with open(path, encoding="utf-8") as handle:
                    state.add_lines(path.name, handle)
                continue
            for place, row, line in rows_with_lines(path):
                state.add(place, row, line)
        state.flush()
        if state.mode == "added" and any(e.get("confirmed") is False for e in state.examples):
            return scan_full(request, began)  # the proof disagreed with the tokenizer: tokenize everything
    return state.result(began)


def scan_full(request: dict[str, Any], began: float) -> dict[str, Any]:
    from sftdoctor.facts.trainer_inputs import load_tokenizer
    from sftdoctor.run import Plan

    plan = Plan.from_json(request["plan"])
    state = Scan(load_tokenizer(plan), request["vocab_size"], plan.data_shape, plan.data_format)
    state.loaded, state.mode = time.perf_counter() - began, "full"
    for name in request["files"]:
        for place, row, _ in rows_with_lines(Path(name)):
            state.add(place, row)
    state.flush()
    return state.result(began)


if __name__ == "__main__":
    serve(scan)
