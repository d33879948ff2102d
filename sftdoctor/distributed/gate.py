"""Every node's gate verdict, shared before any node launches (`sftdoctor train` with nnodes > 1).

Each node's launcher runs the preflight on its own machine; then they meet once at the rendezvous address
(node 0 hosts a TCPStore on master_port, closed again before torchrun binds it) and each puts its verdict
there. A node whose checks found errors stops every node, named with its errors, instead of letting the
others start and wait for it; a node that never comes is named by the ones that did, after
`[launch] join_timeout_s`. A node that comes back to a run in progress skips the gate (in_progress). Keys
are numbered by arrival: nodes other than 0 may all be "node rank 1"
(torchrun assigns their ranks as they join).
"""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta
from typing import Any

from sftdoctor.errors import GateError

KEY = "sftdoctor/gate"


def _count(store, name: str) -> int:
    return int(store.add(f"{KEY}/{name}", 0))


def share(
    addr: str, port: int, nnodes: int, host: bool, timeout_s: float, verdict: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every node's verdict, this one's included, in arrival order. Raises GateError after `timeout_s`."""
    from torch.distributed import TCPStore  # the training stack is there: only `train` comes here

    verdict = {"host": socket.gethostname(), **verdict}
    began = time.monotonic()
    try:
        store = TCPStore(addr, port, None, host, timedelta(seconds=timeout_s), wait_for_workers=False)
    except Exception as e:  # DistNetworkError / DistStoreError: the address never answered
        raise GateError(
            f"could not reach node 0 at {addr}:{port} within {timeout_s:g} s ({_first_line(e)}): "
            "it is not started yet, or a firewall or a wrong master_addr is in the way"
        ) from None
    try:
        index = int(store.add(f"{KEY}/joined", 1))
        store.set(f"{KEY}/{index}", json.dumps(verdict))
        keys = [f"{KEY}/{i}" for i in range(1, nnodes + 1)]
        try:
            store.wait(keys, timedelta(seconds=max(1.0, timeout_s - (time.monotonic() - began))))
        except Exception:
            came = [json.loads(store.get(k))["host"] for k in keys if store.check([k])]
            raise GateError(
                f"{len(came)} of {nnodes} nodes reached the gate within {timeout_s:g} s ({', '.join(came)}); "
                "the others never came: not started, failed before their checks, or cannot reach "
                f"{addr}:{port}"
            ) from None
        verdicts = [json.loads(store.get(k)) for k in keys]
        store.add(f"{KEY}/read", 1)
        if host:  # the store lives in this process: keep it until every node has read it
            deadline = time.monotonic() + timeout_s
            while _count(store, "read") < nnodes and time.monotonic() < deadline:
                time.sleep(0.05)
        return verdicts
    finally:
        del store


def in_progress(addr: str, port: int, rendezvous_key: str, timeout_s: float = 5.0) -> bool:
    """Whether the run is already on at this rendezvous: torchrun's store answers there and holds the run's
    rendezvous state. A node coming back (after a crash, with `[launch] max_restarts`) then joins the restart
    round instead of waiting at a gate the others passed long ago. Node 0 hosts that store: only another node
    asks."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore(addr, port, None, False, timedelta(seconds=timeout_s))
        return bool(store.check([rendezvous_key]))
    except Exception:  # nobody there yet, or the gate's own store: not a run in progress
        return False


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200].rstrip(".") if text else type(e).__name__


def blocking(verdicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes whose own gate stops the run (errors, not forced there)."""
    return [v for v in verdicts if v.get("blocked")]
