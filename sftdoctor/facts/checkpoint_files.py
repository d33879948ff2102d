"""Whether a local checkpoint's safetensors files can be loaded at all, read from their headers alone (no torch,
no tensor read): a shard the index names but the folder lacks, a truncated download, a header that is not one.
`from_pretrained` stops on each of these on every rank, after the checks and the rehearsal's start.

The format (safetensors 0.4-0.7, its Rust `SafeTensors::read_metadata`): 8 bytes, the header's length N as a
little-endian u64; N bytes of JSON, {tensor name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}; then the data. Its `validate` refuses a dtype it does not know, offsets that do not hold shape x dtype
bytes, tensors that do not tile the data in order from 0, and a file longer or shorter than 8 + N + the last
end ("incomplete metadata, file not fully covered").
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

from sftdoctor.errors import InputError, read_bytes, regular_file

MAX_HEADER = 100 * 2**20  # safetensors' own limit on N (MAX_HEADER_SIZE)
# safetensors 0.8's Dtype enum and each one's bits (an unknown name fails the header's parse: "unknown variant")
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
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
    spans = []
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        span = _tensor_span(tensor)
        if isinstance(span, str):
            return f"not a loadable safetensors header: tensor {name[:80]!r} {span}"
        spans.append(span)
    end = 0
    for begin, stop in sorted(spans):  # safetensors' validate: the tensors tile the data, in order, from 0
        if begin != end:
            return f"not a loadable safetensors header: a tensor starts at byte {begin:,} of the data, not {end:,}"
        end = stop
    expected = 8 + length + end
    if expected != size:
        return (
            f"its tensors end at byte {expected:,} but the file has {size:,} bytes "
            f"({'truncated: an interrupted download or copy' if size < expected else 'data past the last tensor'})"
        )
    return None


def _tensor_span(tensor) -> tuple[int, int] | str:
    """Where a tensor's bytes begin and end in the data, or what safetensors would refuse in its entry: a dtype it
    does not know, a shape that is not a list of sizes, offsets that do not hold shape x dtype bytes."""
    if not isinstance(tensor, dict):
        return "is not an object"
    dtype, shape, offsets = tensor.get("dtype"), tensor.get("shape"), tensor.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        return f"has dtype {str(dtype)[:20]!r}, which safetensors does not know"
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        return "has no shape (a list of sizes)"
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        return "has no data_offsets [begin, end]"
    bits = DTYPE_BITS[dtype] * math.prod(shape)
    if bits != 8 * (offsets[1] - offsets[0]):
        return f"holds {offsets[1] - offsets[0]:,} bytes where its shape {shape} of {dtype} needs {bits / 8:,g}"
    return offsets[0], offsets[1]


def _why(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
