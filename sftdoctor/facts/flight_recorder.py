"""The flight recorder's dumps of a stalled run, read with PyTorch's own analyzer (`torch.distributed.
flight_recorder`, the library behind `torchfrtrace`): per process group, the first collective the ranks did not
all enter alike — its sequence number, name and sizes, the ranks inside it, the ranks that never entered it (and
their last collective) or entered another one — and where in the Python code each rank called it.

Verified with torch 2.13.0 (dump format "2.10"):
- A dump is a pickle of plain containers: {"version", "pg_config", "pg_status", "entries": [...]}, one entry per
  collective with its process group (name, description), `collective_seq_id` (per group), `profiling_name`
  ("nccl:all_reduce", "gloo:broadcast"), input/output sizes and dtypes, state and the Python frames. It is read
  here with an unpickler that builds only those containers: a dump found beside someone's log never runs code.
- NCCL's dumps (`_dump_nccl_trace`, or torch's own on a timeout with TORCH_NCCL_DUMP_ON_TIMEOUT=1) carry each
  group's ranks in `pg_config` and a state per entry (scheduled, started, completed).
- Gloo's (the generic recorder, `_dump_fr_trace`) keep every entry "scheduled" and leave `pg_config` without
  the groups the entries name (one group keyed "" with ranks "[]"), on which the analyzer fails (KeyError in
  `build_collectives`). The groups are filled in here: from the memberships the caller knows (the trainer passes
  its process groups), else the default group spans the world and another group the ranks whose dumps use it.
  `pg_status` holds each group's last completed collective, which says whether a rank's last one finished.

Dumps from some ranks only (a rank frozen or gone sends none) speak for those ranks only: the fact says which ranks
of the world have no readable dump ("no_dump"), why each unreadable one could not be read ("unreadable": a FIFO,
a device, a folder, EIO, a truncated or foreign pickle; none is ever opened before a stat says it is a regular
file), and whether the world's size is known ("world_known": given by the caller, or in the dumps' pg_config;
Gloo's dumps name none), so that no sentence built on it speaks for a rank it has no dump of.

`read(folder)` is the fact; `python -m sftdoctor.facts.flight_recorder` answers it in a child process for
`explain --log`, whose own process never imports torch.
"""

from __future__ import annotations

import ast
import io
import os
import re
import stat
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, read_bytes, regular_file
from sftdoctor.facts.child import serve

FR_DIR = "flight-recorder"  # RUN_DIR/flight-recorder/rank-<r>: each rank's dump, written by the hang watchdog
DUMP_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>[0-9]+)(?:\.pkl)?$")
MAX_DUMP_BYTES = 256 * 2**20  # 2,000 entries are a few MB; a bigger file is not a dump
INTERNAL = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/autograd/", "c10d_logger", "/deepspeed/comm/")
SHOWN = 3  # groups described at most
MAX_RANKS = 1 << 17  # a rank number beyond the largest jobs there are is not a rank (rank-99999999999)


def _unpickle(data: bytes) -> Any:
    """The containers a dump holds, built by an unpickler that refuses every class (pickle is imported here: the
    catalogue imports this module for every `check`)."""
    import pickle

    class Plain(pickle.Unpickler):
        def find_class(self, module, name):  # a dump holds dicts, lists, tuples, str, numbers: never a class
            raise pickle.UnpicklingError(f"not a flight-recorder dump (it names {module}.{name})")

    return Plain(io.BytesIO(data)).load()


def load(path: Path) -> dict[str, Any]:
    """One dump, or ValueError saying why the file is not one (a FIFO, a device, a folder, a file that cannot be
    read, one too big, a truncated or foreign pickle): never a block, never a traceback."""
    try:
        regular_file(path, "flight-recorder dump")
        if os.stat(path).st_size > MAX_DUMP_BYTES:
            raise InputError(path, f"over {MAX_DUMP_BYTES >> 20} MiB: not a flight-recorder dump")
        data = read_bytes(path, "flight-recorder dump", MAX_DUMP_BYTES)
    except InputError as exc:
        raise ValueError(f"{path.name}: {exc.message}{_link(path)}") from None
    try:
        dump = _unpickle(data)
    except Exception as exc:  # a truncated or foreign pickle
        raise ValueError(f"{path.name}: not a readable flight-recorder dump ({exc})") from None
    if not (isinstance(dump, dict) and isinstance(dump.get("entries"), list) and "version" in dump):
        raise ValueError(f"{path.name}: a pickle, but not a flight-recorder dump (no entries and version)")
    return dump


def _link(path: Path) -> str:
    """ " (a symlink to TARGET)" for a link, which explains a dump "not found" or a device where one should be."""
    try:
        return f" (a symlink to {os.readlink(path)})" if path.is_symlink() else ""
    except OSError:
        return ""


def _starts_like_a_pickle(path: Path) -> bool | None:
    """True/False for a regular file of a dump's size that can be opened; None for anything else (a FIFO, a
    device, a folder, a dangling link, a file too big or unreadable): stat first, so a FIFO is never opened."""
    try:
        mode = os.stat(path)
        if not stat.S_ISREG(mode.st_mode) or mode.st_size > MAX_DUMP_BYTES:
            return None
        with open(path, "rb") as handle:
            return handle.read(1) == b"\x80"  # pickle protocol 2 and later
    except OSError:
        return None


def dumps_in(folder: Path) -> dict[int, Path]:
    """The rank -> file of the flight-recorder dumps in a folder (`<prefix><rank>`, the name torch writes, with or
    without .pkl): the prefix that most files starting like a pickle share (in the watchdog's own folder, any
    prefix), with every entry of that prefix, readable or not, so that `read` names the ones it cannot read."""
    by_prefix: dict[str, dict[int, Path]] = {}
    pickles: dict[str, int] = {}
    ours = folder.name == FR_DIR  # the watchdog's folder holds nothing else: an empty rank-1 is a broken dump
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return {}
    for path in entries:
        match = DUMP_NAME.match(path.name)
        if not match or int(match["rank"]) >= MAX_RANKS:
            continue
        pickle_like = _starts_like_a_pickle(path)
        if pickle_like is False and not ours:
            continue  # a file of ours that is not a dump (train.log.1, a checkpoint's marker)
        by_prefix.setdefault(match["prefix"], {})[int(match["rank"])] = path
        pickles[match["prefix"]] = pickles.get(match["prefix"], 0) + bool(pickle_like)
    chosen = [p for p in by_prefix if pickles[p] or ours]
    best = max(chosen, key=lambda p: (pickles[p], len(by_prefix[p])), default=None)
    return by_prefix[best] if best is not None else {}


def read(folder: Path, world: int | None = None, groups: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """The fact: what the dumps in `folder` say, {"dumps": []} when there are none, {"error": ...} when they
    cannot be analysed (never a silent "nothing found"). The dumps that cannot be read are named in
    "unreadable" (rank -> why), the readable ones analysed; "no_dump" holds the ranks of the world without a
    readable dump, and "world_known" whether the world's size is known (given, or in the dumps' pg_config)."""
    found = dumps_in(folder)
    if not found:
        return {"folder": str(folder), "dumps": []}
    dumps, unreadable = {}, {}
    for rank, path in found.items():
        try:
            dumps[rank] = load(path)
        except ValueError as exc:
            unreadable[str(rank)] = str(exc)
    said: dict[str, Any] = {"folder": str(folder), "unreadable": unreadable}
    if not dumps:
        return {
            **said,
            "dumps": [],
            **_coverage({}, world, None, found),
            "error": "no dump could be read: " + "; ".join(unreadable.values()),
        }
    try:
        return {**said, **analyse(dumps, world, groups, found)}
    except Exception as exc:  # the analyzer asserts on data it cannot pair: say so
        return {
            **said,
            "dumps": sorted(dumps),
            **_coverage(dumps, world, None, found),
            "error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}",
        }


def _coverage(dumps: dict[int, Any], world: int | None, sizes: list[int] | None, seen=()) -> dict[str, Any]:
    """Which ranks of the world the dumps speak for: the world's size (given, else the largest group of the
    dumps' pg_config, else at least every rank `seen` with a file: then not known), and the ranks without a
    readable dump."""
    world = world if isinstance(world, int) and not isinstance(world, bool) and 0 < world <= MAX_RANKS else None
    known = bool(world) or bool(sizes)
    size = max([world or 0, *(sizes or []), max([*dumps, *seen], default=-1) + 1])
    return {"world": size, "world_known": known, "no_dump": sorted(set(range(size)) - set(dumps))}


def analyse(
    dumps: dict[int, dict[str, Any]], world: int | None = None, groups: dict[str, list[int]] | None = None, seen=()
) -> dict[str, Any]:
    """Torch's analyzer over the dumps (rank -> dump), then each failing group described rank by rank."""
    from torch.distributed.flight_recorder.components.builder import build_db

    versions = {str(d["version"]) for d in dumps.values()}
    details = {
        str(rank): {
            "host_name": f"host_rank{rank}",
            "rank": rank,
            "entries": list(d["entries"]),
            "version": str(d["version"]),
            "pg_config": dict(d.get("pg_config") or {}),
        }
        for rank, d in sorted(dumps.items())
    }
    coverage = _coverage(dumps, world, _sizes(dumps), seen)
    world = coverage["world"]
    _fill_groups(details, world, groups or {})
    import argparse  # here: the catalogue imports this module for every `check`
    import logging

    args = argparse.Namespace(verbose=False, just_print_entries=False, allow_incomplete_ranks=True, mismatch_cap=10)
    quiet = logging.getLogger("Flight Recorder")
    was, quiet.disabled = quiet.disabled, True  # the analyzer prints its findings; ours are the findings
    try:
        db = build_db(details, args, next(iter(versions)) if len(versions) == 1 else "mixed")
    finally:
        quiet.disabled = was
    members = {
        key: set(ast.literal_eval(cfg["ranks"])) for d in details.values() for key, cfg in d["pg_config"].items()
    }
    failing: dict[str, Any] = {}
    for c in db.collectives:  # in the order the analyzer paired them: the first failure of each group
        if c.pass_check and not c.missing_ranks:
            continue
        name = _group_name(c.pg_desc)
        if name not in failing:
            failing[name] = _describe(c, dumps, members.get(c.pg_desc.split(":", 1)[0], set(dumps)))
    backend = next((e["profiling_name"].split(":")[0] for d in dumps.values() for e in d["entries"]), None)
    return {
        "dumps": sorted(dumps),
        **coverage,
        "version": ", ".join(sorted(versions)),
        "backend": backend,
        "groups": list(failing.values())[:SHOWN],
        "more_groups": max(0, len(failing) - SHOWN),
        "last": {str(rank): _last(d) for rank, d in sorted(dumps.items())},
    }


def _sizes(dumps: dict[int, dict[str, Any]]) -> list[int]:
    """The sizes of the groups the dumps' pg_config names (Gloo's names none: its placeholder has no ranks)."""
    return [
        n
        for d in dumps.values()
        if isinstance(d.get("pg_config"), dict)
        for cfg in d["pg_config"].values()
        if (n := len(_ranks(cfg)))
    ]


def _ranks(cfg: Any) -> list[int]:
    try:
        ranks = ast.literal_eval(cfg.get("ranks", "[]")) if isinstance(cfg, dict) else []
    except (ValueError, SyntaxError):
        return []
    return [r for r in ranks if isinstance(r, int)] if isinstance(ranks, (list, tuple)) else []


def _unique_names(details: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Entries renamed "NAME#PG_ID" where a group name was used by more than one group (torch names groups
    "0", "1", ... again after destroy_process_group: a preflight's group and the training's share "0", and the
    analyzer would pair their sequence numbers). Returns new name -> the name the live group answers to."""
    ids: dict[str, set[Any]] = {}
    for d in details.values():
        for e in d["entries"]:
            ids.setdefault(e["process_group"][0], set()).add(e.get("pg_id"))
    live = {}
    for d in details.values():  # the dumps' entries are renamed in place: _describe reads the same names
        for e in d["entries"]:
            name, desc = e["process_group"]
            if len(ids[name]) > 1:
                e["process_group"] = (f"{name}#{e.get('pg_id')}", desc)
                if e.get("pg_id") == max((i for i in ids[name] if isinstance(i, int)), default=None):
                    live[e["process_group"][0]] = name  # the newest group of that name: the one alive now
    return live


def _fill_groups(details: dict[str, dict[str, Any]], world: int, known: dict[str, list[int]]) -> None:
    """Give each dump's pg_config every group its entries name, with its ranks (see the module docstring)."""
    live = _unique_names(details)
    known = {**known, **{new: known[old] for new, old in live.items() if old in known}}
    users: dict[str, set[int]] = {}
    for d in details.values():
        for e in d["entries"]:
            users.setdefault(e["process_group"][0], set()).add(d["rank"])
    for d in details.values():
        config = d["pg_config"]
        for name, desc in {tuple(e["process_group"]) for dd in details.values() for e in dd["entries"]}:
            if name in config and _ranks(config[name]) and name not in live:
                continue
            ranks = known.get(name) or (list(range(world)) if desc == "default_pg" else sorted(users[name]))
            config[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
        for name in [n for n, cfg in config.items() if not _ranks(cfg)]:
            del config[name]  # gloo's placeholder ("" with no ranks) pairs nothing


def _group_name(pg_desc: str) -> str:
    """The analyzer's "0:default_pg" -> "default_pg"; a group without a description ("1", "1#3") -> "group 1"."""
    return pg_desc.split(":", 1)[1] if ":" in pg_desc else f"group {pg_desc.split('#')[0]}"


def _op(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as people read it: all_reduce #57, its sizes and dtypes, its state, where Python called it."""
    return {
        "collective": entry["profiling_name"].split(":", 1)[-1],
        "seq": entry["collective_seq_id"],
        "sizes": entry.get("input_sizes"),
        "dtypes": entry.get("input_dtypes"),
        "state": entry.get("state"),
        "where": where(entry.get("frames") or []),
    }


def where(frames: list[dict[str, Any]]) -> str:
    """The innermost frames of the caller's code (torch's own wrappers left out), innermost first."""
    own = [f for f in frames if not any(part in str(f.get("filename", "")) for part in INTERNAL)]
    return " <- ".join(f"{Path(str(f.get('filename'))).name}:{f.get('line')} {f.get('name')}" for f in own[:3]) or "?"


def _describe(collective, dumps: dict[int, dict[str, Any]], members: set[int]) -> dict[str, Any]:
    """The failing collective of one group, rank by rank: inside it, inside another one, or never entered."""
    group, seq = collective.pg_desc, collective.collective_seq_id
    name = collective.pg_desc.split(":", 1)[0]
    entered, absent = {}, {}
    for rank in sorted(members):
        if rank not in dumps:
            continue
        mine = [e for e in dumps[rank]["entries"] if e["process_group"][0] == name]
        at = next((e for e in mine if e["collective_seq_id"] == seq), None)
        if at is None:
            absent[str(rank)] = _op(mine[-1]) if mine else {"collective": None, "seq": 0}
        else:
            entered[str(rank)] = _op(at)
    # the analyzer's "expected" op is whichever rank it read first: the one most ranks entered is, the rest "other"
    alike: dict[str, list[str]] = {}
    for rank, op in entered.items():
        alike.setdefault(f"{op['collective']} {op['sizes']} {op['dtypes']}", []).append(rank)
    most = max(alike.values(), key=len, default=[])
    inside = {r: entered[r] for r in most}
    other = {r: op for r, op in entered.items() if r not in inside}
    first = next(iter(inside.values()), None) or next(iter(other.values()), None) or {}
    return {
        "group": _group_name(group),
        "seq": seq,
        "collective": first.get("collective"),
        "sizes": first.get("sizes"),
        "dtypes": first.get("dtypes"),
        "inside": inside,
        "other": other,
        "absent": absent,
        "no_dump": sorted(members - set(dumps)),
        "mismatch": str(collective.type_of_mismatch) if collective.type_of_mismatch else None,
    }


def _last(dump: dict[str, Any]) -> dict[str, Any] | None:
    """A rank's last collective and whether it completed (the entry's state; gloo's from pg_status)."""
    if not dump["entries"]:
        return None
    entry = dump["entries"][-1]
    status = (dump.get("pg_status") or {}).get(str(entry.get("pg_id")), {})
    done = (
        entry.get("state") == "completed" or status.get("last_completed_collective", -1) >= entry["collective_seq_id"]
    )
    return {**_op(entry), "group": entry["process_group"][1], "completed": bool(done)}


def main() -> None:
    serve(lambda request: read(Path(request["folder"]), request.get("world")))


if __name__ == "__main__":
    main()
