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
    first = next(iter(g["inside"].values()), None) or {"collective": g["collective"], "seq": g["seq"],
                                                          "sizes": g["sizes"], "dtypes": g["dtypes"]}
    theirs = _op(first, g["group"])
    parts = []
    if g["inside"]:
        parts.append(f"{ranks_text(list(g['inside']))} {'is' if len(g['inside']) == 1 else 'are'} in {theirs} "
                     f"(called at {_at(g['inside'])})")
    if g["other"]:
        by_op: dict[str, list[str]] = {}
        for r, op in g["other"].items():
            by_op.setdefault(_op(op), []).append(r)
        for text, ranks in by_op.items():
            parts.append(f"{ranks_text(ranks)} entered {text} instead (called at {_at({r: g['other'][r] for r in ranks})})")
    if g["absent"]:
        last = "; ".join(f"rank {r} last: {_op(op)} at {op.get('where')}" if op.get("collective")
                         else f"rank {r}: no collective on this group recorded" for r, op in sorted(g["absent"].items()))
        parts.append(f"{ranks_text(list(g['absent']))} never entered it ({last})")
    if g.get("no_dump"):
        parts.append(f"{ranks_text(g['no_dump'])} left no dump")
    if g["other"]:
        op = next(iter(g["other"].values()))
        headline = (f"{ranks_text(list(g['other']))} called {_op(op, g['group'])} where "
                    f"{ranks_text(list(g['inside']))} called {_op(first)}")
    elif g["absent"]:
        headline = f"{ranks_text(list(g['absent']))} never entered {theirs}"
    else:  # every rank entered the same: torch's analyzer flagged something else (a state, a dtype)
        headline = f"torch's analyzer flags {theirs}" + (f" ({g['mismatch']})" if g.get("mismatch") else "")
        parts.append(headline)
    return headline, "; ".join(parts)


def describe(fr: dict[str, Any] | None) -> tuple[str, str]:
    """(a headline for the finding's title, or "", and the detail sentence) of the flight-recorder fact."""
    if not fr or not fr.get("dumps"):
        return "", "No flight-recorder dumps were found."
    where = f"Flight recorder ({ranks_text(fr['dumps'])}, {fr['folder']})"
    if fr.get("error"):
        return "", f"{where}: torch's analyzer could not read the dumps ({fr['error']}); read them with `torchfrtrace`."
    if fr.get("groups"):
        described = [_group(g) for g in fr["groups"]]
        more = f" ({fr['more_groups']} more group(s) fail too)" if fr.get("more_groups") else ""
        return described[0][0], f"{where}: " + ". ".join(text for _, text in described) + f".{more}"
    last = fr.get("last") or {}
    if not any(last.values()):  # nothing recorded: no reading of the collectives, not "they all completed"
        return "", (f"{where}: the dumps hold no collective (the recorder off, TORCH_FR_BUFFER_SIZE=0?): they cannot "
                    "say which collective; read the stacks.")
    open_ = {r: op for r, op in last.items() if op and not op.get("completed")}
    if not open_:
        return ("no rank is inside a collective",
                f"{where}: every rank's collectives match and each rank's last one completed: the stall is outside "
                "torch.distributed (a data loader, I/O, a Python loop): read the stacks.")
    ops = {_op(op, op.get("group")) for op in open_.values()}
    if len(ops) == 1 and len(open_) == len(last):
        theirs = ops.pop()
        return (f"every rank is inside {theirs}",
                f"{where}: every rank entered {theirs} and none completed it: the collective itself is stuck (the "
                "transport: NCCL, the network, a dead GPU or NIC), not a rank that stayed out.")
    return ("", f"{where}: the ranks' collectives match; still open: "
                + "; ".join(f"rank {r}: {_op(op, op.get('group'))}" for r, op in sorted(open_.items())) + ".")


def dumps_finding(fr: dict[str, Any]) -> Finding:
    """`explain --log`'s finding from the dumps found beside the log (`fr` holds at least one dump)."""
    headline, detail = describe(fr)
    common = {"id": "nccl-timeout", "explain": "nccl-timeout", "evidence": fr}
    if fr.get("error") or not any((fr.get("last") or {}).values()):
        return warning("flight-recorder dumps beside the log could not be analysed", detail,
                       f"torchfrtrace {fr['folder']} --allow-incomplete-ranks", **common)
    if fr.get("groups"):
        return error(f"flight recorder: {headline}", detail, FIX, **common)
    if headline.startswith("every rank is inside"):
        return error(f"flight recorder: {headline}", detail, "check the GPUs and the network of every node "
                     "(`nvidia-smi`, dmesg, `sftdoctor check --distributed`)", **common)
    return info(f"flight recorder: {headline or 'the ranks collectives match'}", detail, "read the stacks", **common)


FIX = ("make every rank call the same collectives in the same order: look for a rank-dependent branch (`if rank == "
       "0:` around a collective, an early `break` or `continue` on one rank, uneven data) at the places named")
