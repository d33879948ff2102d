"""Results of the probes that cost seconds (building a model in a child process for packing and training
targets, comparing a chat template with every drop-in), kept on disk.

Such a probe costs a few seconds of imports and gives the same answer for the same inputs, and `check`,
`plan` and every `train` gate ask it again. The key is what the answer depends on: the request, the
content of every file the probe reads (a model folder's configs and tokenizer files, the data; weights are
never read), the installed stack's versions and sftdoctor's own code. A result with an "error" is not kept,
so a probe that failed runs again.

Where: $SFTDOCTOR_CACHE (a folder, or "off"), else $XDG_CACHE_HOME/sftdoctor, else ~/.cache/sftdoctor.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from stat import S_ISREG
from typing import Any

from sftdoctor.files import write_atomic

STACK = ("torch", "transformers", "trl", "datasets", "accelerate", "tokenizers", "peft", "liger-kernel", "bitsandbytes")
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx", ".pkl")
HASHED_BYTES = 64 << 20  # a larger file is keyed by its path, size and mtime instead of its content


def cache_dir() -> Path | None:
    chosen = os.environ.get("SFTDOCTOR_CACHE")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sftdoctor"


def cached(kind: str, request: Any, files: Iterable[Path], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """compute(), or its answer for the same request, files, stack and sftdoctor from an earlier call."""
    folder = cache_dir()
    if folder is None:
        return compute()
    path = folder / "probes" / f"{kind}-{_key(request, files)}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    result = compute()
    if isinstance(result, dict) and "error" not in result:
        _store(path, result)
    return result


def folder_files(folder: Path | None) -> list[Path]:
    """A model or tokenizer folder's files a probe reads: everything but the weights."""
    if folder is None or not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.endswith(WEIGHTS))


def _key(request: Any, files: Iterable[Path]) -> str:
    import hashlib  # here, as in the two below: the catalogue imports this module for every `check`

    digest = hashlib.sha256(json.dumps([request, _stack(), _own_code()], sort_keys=True, default=str).encode())
    for path in files:
        digest.update(_file_digest(Path(path)).encode())
    return digest.hexdigest()[:32]


def _file_digest(path: Path) -> str:
    import hashlib

    try:
        stat = path.stat()
        if not S_ISREG(stat.st_mode):  # a FIFO would be drained (or block), /dev/zero read without end
            return f"{path}:not-a-file:{stat.st_mode}"
        if stat.st_size > HASHED_BYTES:
            return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return f"{path}:missing"


@functools.lru_cache(maxsize=1)
def _stack() -> dict[str, str | None]:
    from importlib import metadata

    versions = {}
    for name in STACK:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.lru_cache(maxsize=1)
def _own_code() -> str:
    import hashlib

    digest = hashlib.sha256()
    package = Path(__file__).parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def _store(path: Path, result: dict[str, Any]) -> None:
    """Written whole or not at all (a temporary file renamed), and never a reason for the probe to fail."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(result))
    except OSError:
        pass
