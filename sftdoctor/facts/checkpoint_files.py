"""Whether a local checkpoint's safetensors files can be loaded at all, read from their headers alone (no torch,
no tensor read): a shard the index names but the folder lacks, a truncated download, a header that is not one.
`from_pretrained` stops on each of these on every rank, after the checks and the rehearsal's start.

The format (safetensors 0.4-0.7, its Rust `SafeTensors::read_metadata`): 8 bytes, the header's length N as a
little-endian u64; N bytes of JSON, {tensor name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}; then the data, which the offsets must cover exactly: a file longer or shorter than 8 + N + the largest
end is refused ("incomplete metadata, file not fully covered").
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from sftdoctor.errors import InputError, read_bytes, regular_file

MAX_HEADER = 100 * 2**20  # safetensors' own limit on N (MAX_HEADER_SIZE)
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"


def checkpoint_problem(folder: Path) -> str | None:
    """Why the safetensors checkpoint in `folder` cannot be loaded, or None (no safetensors: nothing to say)."""
    if (folder / INDEX).exists():
        try:
            index = json.loads(read_bytes(folder / INDEX, "safetensors index", MAX_HEADER))
            shards = sorted(set(index["weight_map"].values()))
        except (InputError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"{INDEX} is not a safetensors index ({_why(exc)})"
        files = [folder / str(name) for name in shards]
    elif (folder / SINGLE).exists():
        files = [folder / SINGLE]
    else:
        return None
    for path in files:
        problem = shard_problem(path)
        if problem:
            return f"{path.name}: {problem}"
    return None


def shard_problem(path: Path) -> str | None:
    """Why one safetensors file cannot be loaded, from its header and its size."""
    if path.is_dir():
        return "a folder, not a safetensors file"
    try:
        regular_file(path, "safetensors file")
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return f"{size} bytes: too short for a safetensors header (truncated?)"
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER or 8 + length > size:
                return f"its header claims {length:,} bytes but the file has {size:,} (truncated, or not safetensors)"
            header = json.loads(handle.read(length))
    except InputError as exc:
        return exc.message
    except (OSError, ValueError) as exc:
        return f"not a safetensors header ({_why(exc)})"
    if not isinstance(header, dict):
        return "not a safetensors header (not a JSON object)"
    ends = []
    for name, tensor in header.items():
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) and name != "__metadata__" else [0, 0]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            return f"not a safetensors header (tensor {name[:80]!r} has no data_offsets [begin, end])"
        ends.append(offsets[1])
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return (f"its tensors end at byte {expected:,} but the file has {size:,} bytes "
                f"({'truncated: an interrupted download or copy' if size < expected else 'data past the last tensor'})")
    return None


def _why(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
