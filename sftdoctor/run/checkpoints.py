"""Checkpoints that are complete or absent.

transformers writes `checkpoint-N/` in place, trainer_state.json last; a run killed mid-save leaves
a half-written folder that `resume_from_checkpoint=True` would pick. sftdoctor marks a checkpoint
complete only after every rank has finished saving it, resumes from the newest marked one, and
removes unmarked ones before a resume.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

MARKER = "sftdoctor-complete"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m[1]), p) for p in folder.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return sorted(found)


def step_of(path: Path) -> int:
    """The step of a checkpoint-N folder."""
    return int(_CHECKPOINT.match(path.name)[1])


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()


def newest_complete(output_dir: str | Path) -> Path | None:
    complete = [path for _, path in checkpoints(output_dir) if is_complete(path)]
    return complete[-1] if complete else None


def remove_incomplete(output_dir: str | Path) -> list[Path]:
    removed = [path for _, path in checkpoints(output_dir) if not is_complete(path)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def mark_complete(path: Path, step: int) -> None:
    """Atomic: the marker appears whole or not at all."""
    tmp = path / f".{MARKER}.tmp"
    tmp.write_text(f"{step}\n")
    os.replace(tmp, path / MARKER)
