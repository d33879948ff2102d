"""Where `sftdoctor eval` writes, checked before the first sample or the first model loads (minutes to hours of
work that a late failure throws away): an output is a file that can be written (not a folder, not a pipe or a
device, its folder there or creatable and writable), and it is none of the command's inputs: not the same
file by path, by symbolic link or by hard link (os.path.samefile), so the results never overwrite the
completions they score or the result they compare with."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from sftdoctor.errors import NOT_REGULAR, InputError
from sftdoctor.files import folder_problem

MODEL_FILES_LISTED = 10_000  # a folder with more files is no model folder; its first files are compared


def check_output(path: Path, option: str, inputs: Iterable[tuple[str, Path]], what: str) -> Path:
    """`path`, or one InputError naming `option` and the file. `inputs`: (the option or role, a file) read by
    the command; `what`: what is written there, for the message."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode if os.path.lexists(path) else None
    except OSError:
        mode = None  # a dangling or looping symbolic link: replaced by the new file, as a rename does
    if mode is not None and stat.S_ISDIR(mode):
        raise InputError(path, f"is a folder; expected the file to write {what} to", key=option)
    if mode is not None and stat.S_IFMT(mode) in NOT_REGULAR:
        raise InputError(path, f"is {NOT_REGULAR[stat.S_IFMT(mode)]}; expected a file to write {what} to", key=option)
    for role, source in inputs:
        if _same(path, Path(source)):
            raise InputError(
                path,
                f"is the {role} it reads ({source}); expected another file to write {what} to, "
                "so that its input stays as it is",
                key=option,
            )
    _writable_folder(path, option, what)
    return path


def _same(a: Path, b: Path) -> bool:
    """One file under two names: the same path once resolved, or the same inode (a symbolic or hard link)."""
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _writable_folder(path: Path, option: str, what: str) -> None:
    """The output's folder exists and can be written, or can be made (files.folder_problem's rules)."""
    why = folder_problem(Path(os.path.abspath(path)).parent)
    if why is not None:
        raise InputError(path, f"{why}; expected a file to write {what} to", key=option)


def folder_files(folder: Path | str | None, keep=lambda name: True) -> list[Path]:
    """The files directly in a folder the command reads (a model, a run directory), those `keep` accepts."""
    if folder is None or not os.path.isdir(folder):
        return []
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if len(found) >= MODEL_FILES_LISTED:
                    break
                if keep(entry.name) and entry.is_file():
                    found.append(Path(entry.path))
    except OSError:
        return found
    return found
