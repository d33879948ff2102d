"""What the flight recorder's dumps say about a stall, in words (the fact: sftdoctor.facts.flight_recorder):
which collective, which ranks are inside it, which never entered it or entered another, and where.

Read by the runtime `nccl-timeout` check (the hang watchdog) and by `explain --log` (dumps beside the log)."""

from __future__ import annotations

from typing import Any

from sftdoctor.findings import Finding, error, info, warning


def ranks_text(ranks: list[int | str]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"; [3] -> "rank 3"."""
    numbers = sorted(int(r) for r in ranks)
    spans: list[list[int]] = []
    for r in numbers:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank{'s' if len(numbers) > 1 else ''} {text}"


def _op(op: dict[str, Any], group: str | None = None) -> str:
    on = f" on {group}" if group else ""
    sizes = f" {op.get('sizes')} {'/'.join(op.get('dtypes') or [])}".rstrip() if op.get("sizes") is not None else ""
    return f"{op.get('collective')} #{op.get('seq')}{on}{sizes}"


def _at(ops: dict[str, dict[str, Any]]) -> str:
    places = sorted({op.get("where") or "?" for op in ops.values()})
    return places[0] if len(places) == 1 else "; ".join(f"rank {r}: {op.get('where')}" for r, op in sorted(ops.items()))


def _group(g: dict[str, Any]) -> tuple[str, str]:
    """One failing group: (the short headline, the full sentence)."""
    first = next(iter(g["inside"].values()), None) or {
        "collective": g["collective"],
        "seq": g["seq"],
        "sizes": g["sizes"],
        "dtypes": g["dtypes"],
    }
    theirs = _op(first, g["group"])
    parts = []
    if g["inside"]:
        parts.append(f"{ranks_text(list(g['inside']))} {_is(g['inside'])} in {theirs} (called at {_at(g['inside'])})")
    if g["other"]:
        by_op: dict[str, list[str]] = {}
        for r, op in g["other"].items():
            by_op.setdefault(_op(op), []).append(r)
        for text, ranks in by_op.items():
            parts.append(
                f"{ranks_text(ranks)} entered {text} instead (called at {_at({r: g['other'][r] for r in ranks})})"
            )
    if g["absent"]:
        last = "; ".join(
            f"rank {r} last: {_op(op)} at {op.get('where')}"
            if op.get("collective")
            else f"rank {r}: no collective on this group recorded"
            for r, op in sorted(g["absent"].items())
        )
        parts.append(f"{ranks_text(list(g['absent']))} never entered it ({last})")
    if g["other"]:
        op = next(iter(g["other"].values()))
        headline = (
            f"{ranks_text(list(g['other']))} called {_op(op, g['group'])} where "
            f"{ranks_text(list(g['inside']))} called {_op(first)}"
        )
    elif g["absent"]:
        headline = f"{ranks_text(list(g['absent']))} never entered {theirs}"
    else:  # the ranks with a dump entered the same: torch's analyzer flagged something else (a state, a dtype)
        headline = f"torch's analyzer flags {theirs}" + (f" ({g['mismatch']})" if g.get("mismatch") else "")
        parts.append(headline)
    return headline, "; ".join(parts)


def _is(ranks) -> str:
    return "is" if len(ranks) == 1 else "are"


def whole(fr: dict[str, Any]) -> bool:
    """Whether the dumps speak for every rank: the world's size known and a readable dump of each of its ranks.
    Only then may a sentence say "every rank" or "none": of a rank without a dump nothing is known."""
    return bool(fr.get("world_known")) and not fr.get("no_dump") and not fr.get("unreadable")


def gaps(fr: dict[str, Any]) -> tuple[str, str]:
    """(a short clause, the sentence) of the ranks the dumps cannot speak for; ("", "") when they speak for all."""
    if whole(fr):
        return "", ""
    unreadable = {int(r): why for r, why in (fr.get("unreadable") or {}).items()}
    missing = [r for r in fr.get("no_dump") or [] if int(r) not in unreadable]
    short, said = [], []
    if missing:
        short.append(f"{ranks_text(missing)} sent no dump")
        said.append(f"{ranks_text(missing)} sent no dump")
    if unreadable:
        dumps = "dumps" if len(unreadable) > 1 else "dump"
        short.append(f"{ranks_text(list(unreadable))}'s {dumps} unreadable")
        said.append(
            f"{ranks_text(list(unreadable))}'s {dumps} could not be read ("
            + "; ".join(why for _, why in sorted(unreadable.items()))
            + ")"
        )
    if not fr.get("world_known"):
        short.append("the world's size unknown")
        said.append("the dumps do not say how many ranks the run had (Gloo's dumps name no group's ranks)")
    silent = sorted({*missing, *unreadable})
    of = f"{ranks_text(silent)}" if fr.get("world_known") else "any rank without a readable dump here"
    sentence = (
        f"{'; '.join(said)}: nothing is known of {of}, whether it entered a collective, stayed out of one "
        "or stopped altogether."
    )
    return "; ".join(short), sentence[0].upper() + sentence[1:]


def _where(fr: dict[str, Any]) -> str:
    dumped = ranks_text(fr["dumps"]) if fr.get("dumps") else "no readable dump"
    of = f" of {fr['world']}" if fr.get("world_known") and fr.get("world") else ""
    return f"Flight recorder ({dumped}{of}, {fr['folder']})"


def describe(fr: dict[str, Any] | None) -> tuple[str, str]:
    """(a headline for the finding's title, or "", and the detail sentence) of the flight-recorder fact. No
    sentence speaks for a rank whose dump is missing or unreadable (see `whole`)."""
    if not fr or not (fr.get("dumps") or fr.get("unreadable")):
        return "", "No flight-recorder dumps were found."
    where, (_, unknown) = _where(fr), gaps(fr)
    tail = f" {unknown}" if fr.get("no_dump") or fr.get("unreadable") else ""  # where nothing is claimed of all
    if not fr.get("dumps"):
        return "", f"{where}: no dump could be read.{tail}"
    if fr.get("error"):
        return "", (
            f"{where}: torch's analyzer could not read the dumps ({fr['error']}); read them with `torchfrtrace`.{tail}"
        )
    if fr.get("groups"):
        described = [_group(g) for g in fr["groups"]]
        more = f" ({fr['more_groups']} more group(s) fail too)" if fr.get("more_groups") else ""
        return described[0][0], f"{where}: " + ". ".join(text for _, text in described) + f".{more}{tail}"
    last = fr.get("last") or {}
    if not any(last.values()):  # nothing recorded: no reading of the collectives, not "they all completed"
        return "", (
            f"{where}: the dumps hold no collective (the recorder off, TORCH_FR_BUFFER_SIZE=0?): they cannot "
            f"say which collective; read the stacks.{tail}"
        )
    return (_all_said if whole(fr) else _some_said)(fr, where, last)


def _all_said(fr: dict[str, Any], where: str, last: dict[str, Any]) -> tuple[str, str]:
    """The ranks' last collectives when every rank's dump is there: the only place "every rank" is said."""
    open_ = {r: op for r, op in last.items() if op and not op.get("completed")}
    if not open_:
        return (
            "no rank is inside a collective",
            f"{where}: every rank's collectives match and each rank's last one completed: the stall is outside "
            "torch.distributed (a data loader, I/O, a Python loop): read the stacks.",
        )
    ops = {_op(op, op.get("group")) for op in open_.values()}
    if len(ops) == 1 and len(open_) == len(last):
        theirs = ops.pop()
        return (
            f"every rank is inside {theirs}",
            f"{where}: every rank entered {theirs} and none completed it: the collective itself is stuck (the "
            "transport: NCCL, the network, a dead GPU or NIC), not a rank that stayed out.",
        )
    return (
        "",
        f"{where}: the ranks' collectives match; still open: "
        + "; ".join(f"rank {r}: {_op(op, op.get('group'))}" for r, op in sorted(open_.items()))
        + ".",
    )


def _some_said(fr: dict[str, Any], where: str, last: dict[str, Any]) -> tuple[str, str]:
    """The last collectives of the ranks whose dumps are there, said of those ranks only."""
    short, unknown = gaps(fr)
    dumped = [int(r) for r in last]
    open_ = {r: op for r, op in last.items() if op and not op.get("completed")}
    if not open_:
        return (
            f"{ranks_text(dumped)}: no collective open; {short}",
            f"{where}: the dump{'s' if len(dumped) > 1 else ''} of {ranks_text(dumped)} say each of "
            f"{'their' if len(dumped) > 1 else 'its'} collectives completed: on {ranks_text(dumped)} the stall "
            f"is outside torch.distributed. {unknown}",
        )
    ops = {_op(op, op.get("group")) for op in open_.values()}
    if len(ops) == 1:
        theirs = ops.pop()
        return (
            f"{ranks_text(list(open_))} {_is(open_)} inside {theirs}; {short}",
            f"{where}: {ranks_text(list(open_))} entered {theirs} and did not complete it. {unknown} A rank "
            "waiting in a collective is how the others look when one rank stays out or stops: read first "
            "the state of the rank(s) without a dump.",
        )
    return (
        f"{ranks_text(list(open_))} inside different collectives; {short}",
        f"{where}: still open in the dumps there are: "
        + "; ".join(f"rank {r}: {_op(op, op.get('group'))}" for r, op in sorted(open_.items()))
        + f". {unknown}",
    )


def silent_fix(ranks: list[int | str]) -> str:
    """What to do about ranks that sent nothing (no report, no stacks, no dump): their processes are frozen."""
    return (
        f"find {ranks_text(ranks)}'s process on its node (`ps -eo pid,stat,etime,cmd | grep sftdoctor.train.sft`) "
        "and read its state (`ps -o stat= -p PID`: T = stopped, D = blocked in the kernel: a stuck NFS read, a "
        "GPU driver call), its kernel stack (`cat /proc/PID/stack`), its Python stack (`py-spy dump --pid PID`; a "
        'process in D cannot answer it), `dmesg -T | tail -50` (NFS "server not responding", GPU Xid), the '
        "node's NFS mounts and GPUs (`nvidia-smi`); a host that is gone: drain it"
    )


def gaps_fix(fr: dict[str, Any]) -> str:
    """What to do about the ranks the dumps do not speak for: those that sent none first (frozen or gone)."""
    unreadable = [int(r) for r in fr.get("unreadable") or {}]
    missing = [r for r in fr.get("no_dump") or [] if int(r) not in unreadable]
    if missing:
        return silent_fix(missing)
    if unreadable:
        return (
            f"copy {ranks_text(unreadable)}'s dumps again from the run (the reasons are above), then "
            f"`torchfrtrace {fr['folder']} --allow-incomplete-ranks`; meanwhile read each rank's stacks"
        )
    return (
        "count the run's ranks (its launcher's log, `resolved.json`): a rank without a dump here is the first "
        "suspect; read each rank's stacks (`py-spy dump --pid PID`)"
    )


def dumps_finding(fr: dict[str, Any]) -> Finding:
    """`explain --log`'s finding from the dumps found beside the log (`fr` holds at least one dump)."""
    headline, detail = describe(fr)
    common = {"id": "nccl-timeout", "explain": "nccl-timeout", "evidence": fr}
    if fr.get("error") or not fr.get("dumps") or not any((fr.get("last") or {}).values()):
        return warning(
            "flight-recorder dumps beside the log could not be analysed",
            detail,
            f"torchfrtrace {fr['folder']} --allow-incomplete-ranks",
            **common,
        )
    if fr.get("groups"):
        return error(f"flight recorder: {headline}", detail, FIX, **common)
    if headline.startswith("every rank is inside"):
        return error(
            f"flight recorder: {headline}",
            detail,
            "check the GPUs and the network of every node (`nvidia-smi`, dmesg, `sftdoctor check --distributed`)",
            **common,
        )
    if not whole(fr):  # of a rank without a dump nothing is known: the first suspect where another rank waits
        waiting = any(op and not op.get("completed") for op in fr["last"].values())
        return (error if waiting else warning)(f"flight recorder: {headline}", detail, gaps_fix(fr), **common)
    return info(f"flight recorder: {headline or 'the ranks collectives match'}", detail, "read the stacks", **common)


FIX = (
    "make every rank call the same collectives in the same order: look for a rank-dependent branch (`if rank == "
    "0:` around a collective, an early `break` or `continue` on one rank, uneven data) at the places named"
)
