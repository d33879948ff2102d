"""Where a run's rows come from, decided once: `[data] train` is data files, a local folder laid out as a Hugging
Face dataset repository (its README's `configs`, or shards named by split), or a hub dataset id (org/name).

The config reader classifies the value (`classify`); `source(run)` says which of the three a validated run reads
and with what subset, split and revision. A folder or a hub id is resolved to data files by the datasets library
in a child process (facts/hub_data.py), so everything downstream (every row checked, the format detected, rows
located, tokens sampled, the trainer's load, the digest `diff` compares) reads files as it always has. Cheap to
import: no datasets here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sftdoctor.run.config import RunConfig

FILES, FOLDER, HUB = "files", "folder", "hub"
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")  # what facts.data reads and the trainer loads
# huggingface_hub's repo id rule (utils/_validators.py validate_repo_id, 2.4): word characters, "-" and ".",
# no "--" or "..", at most 96 characters; a dataset id names its owner (org/name).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
HUB_ONLY = ("subset", "split", "revision", "eval_split")  # [data] keys that go with a folder or an id only


def looks_like_hub_id(value: str) -> bool:
    """Whether a value that is no local path reads as a hub dataset id, not a misspelt file ("data/train.jsonl")."""
    return (
        bool(_HUB_ID.fullmatch(value))
        and len(value) <= 96
        and "--" not in value
        and ".." not in value
        and not value.lower().endswith(DATA_SUFFIXES)
    )


def classify(value: Any, folder: Path) -> tuple[str, tuple[str, ...]]:
    """(kind, values) of what `[data] train` names: data files (resolved against the config's folder), one local
    folder, or a hub id kept as written. A name that is none of them is returned as FILES: the file check then
    says it is not found."""
    if not isinstance(value, str):
        return FILES, tuple(str(folder / v) for v in value)
    full = folder / Path(value).expanduser()
    try:
        if full.is_dir():
            return FOLDER, (str(full.absolute()),)  # absolute: a relative value of a validated run is an id
        # "data/train" beside a folder data/: a misspelt path, not an id to send to the hub
        if os.path.lexists(full) or not looks_like_hub_id(value) or (folder / value.split("/")[0]).is_dir():
            return FILES, (str(full),)
    except (OSError, ValueError):  # a name over 255 bytes, an embedded NUL: the file check words it
        return FILES, (str(full),)
    return HUB, (value,)


@dataclass(frozen=True)
class Source:
    """What a validated run reads: `kind` (files, folder, hub), `name` (the folder or id; "" for files), and for a
    folder or an id the subset (None: the dataset's default), split, revision and evaluation split."""

    kind: str
    name: str = ""
    subset: str | None = None
    split: str = "train"
    revision: str | None = None
    eval_split: str | None = None

    @property
    def hub(self) -> bool:
        return self.kind != FILES

    def describe(self) -> str:
        """How the source is named in messages: "org/name (subset sft, split train)"."""
        parts = ([f"subset {self.subset}"] if self.subset else []) + [f"split {self.split}"]
        return f"{self.name} ({', '.join(parts)})"

    def request(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "subset": self.subset,
            "split": self.split,
            "revision": self.revision,
            "eval_split": self.eval_split,
        }


def named(found: dict[str, Any]) -> str:
    """A resolved hub source (the Plan's data_source) as messages name it: "tiny/hub (subset default, split train,
    eval split test)", an id with the revision it was read at."""
    name = found["name"]
    if found["kind"] == FOLDER and not (relative := os.path.relpath(name)).startswith(".."):
        name = relative
    parts = [f"subset {found['subset']}"] if found.get("subset") else []
    parts += [f"split {found['split']}"] + ([f"eval split {found['eval_split']}"] if found.get("eval_split") else [])
    parts += [f"revision {found['revision'][:12]}"] if found.get("revision") else []
    return f"{name} ({', '.join(parts)})"


def identity(found: Any) -> str:
    """What a run read, as two runs compare it (`sftdoctor diff`): "data files", or a hub dataset by its id (a
    folder by its kind alone: two copies of one folder are compared by their files' digests), subset, split,
    evaluation split and revision."""
    if not isinstance(found, dict):
        return "data files"
    name = found.get("name") if found.get("kind") == HUB else "a local folder"
    parts = [f"{k} {found[k]}" for k in ("subset", "split", "eval_split", "revision") if found.get(k)]
    return f"{name} ({', '.join(parts)})"


def kind_of(train: tuple[str, ...]) -> str:
    """FILES, FOLDER or HUB, of `[data] train` as validation left it: a folder made absolute, an id kept as
    written (relative, and no local path)."""
    if len(train) != 1:
        return FILES
    value = train[0]
    if os.path.isabs(value) and os.path.isdir(value):
        return FOLDER
    if not os.path.isabs(value) and looks_like_hub_id(value) and not os.path.lexists(value):
        return HUB
    return FILES


def source(run: RunConfig) -> Source:
    """The source of a validated run's training rows."""
    data = run.data
    kind = kind_of(data.train)
    if kind == FILES:
        return Source(FILES)
    return Source(kind, data.train[0], data.subset, data.split, data.revision, data.eval_split)


def problems(data: Any) -> list[tuple[str, str]]:
    """(key, what is wrong) of the hub keys of a [data] section: given without a hub source, `revision` with a
    local folder (datasets ignores it there without a word), an eval split that is the training split or given
    beside `eval` or `eval_fraction`."""
    kind = kind_of(data.train)
    found = []
    if kind == FILES:
        found += [
            (
                f"[data].{k}",
                "goes with a hub dataset in [data] train (a folder laid out as a dataset repository, or an org/name "
                "id); data files are read whole",
            )
            for k in HUB_ONLY
            if data.is_given(k)
        ]
        return found
    if kind == FOLDER and data.is_given("revision"):
        found.append(
            (
                "[data].revision",
                f"{data.train[0]} is a local folder, which has no revisions (the datasets library would ignore "
                "it): remove revision, or check the folder out at that revision",
            )
        )
    if data.eval_split is not None:
        if data.eval_split == data.split:
            found.append(("[data].eval_split", f"{data.eval_split!r} is the training split: evaluate on another"))
        others = [k for k in ("eval", "eval_fraction") if data.is_given(k)]
        if others:
            found.append(("[data]", f"give either eval_split or {' or '.join(others)}, not both"))
    return found


STREAM_SHUFFLE_BUFFER = 10_000  # rows a streamed training set is shuffled within (datasets' default: 1000)


def streaming_problems(data: Any, training: Any) -> list[tuple[str, str]]:
    """(key, why) of a streamed training set the Trainer cannot take: an IterableDataset has no length, so
    transformers' Trainer needs max_steps (5.x trainer.py: "args.max_steps must be set to a positive value if
    dataloader does not have a length"), and a held-out share of it cannot be counted."""
    if not data.streaming:
        return []
    found = []
    if training.max_steps is None:
        found.append(
            (
                "[data].streaming",
                "a streamed dataset has no length to count epochs in: set [training] max_steps",
            )
        )
    if data.eval_fraction:
        found.append(
            (
                "[data].streaming",
                "a streamed dataset cannot hold out eval_fraction of its rows: give eval files or eval_split",
            )
        )
    return found
