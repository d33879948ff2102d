"""nccl-env: NCCL/torch.distributed environment variables and the rendezvous port."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import check
from sftdoctor.findings import error, info, ok, warning

# Old names torch still reads as fallbacks of the TORCH_NCCL_* ones, with a deprecation
# warning (ProcessGroupNCCL.hpp, torch 2.2-2.13; a test checks this against the installed header).
DEPRECATED = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
}
HEARTBEAT_DEFAULT_S = 480  # TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC default (torch 2.3-2.13)


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _deprecated(env: dict[str, str]) -> list:
    out = []
    for old, new in DEPRECATED.items():
        if old not in env:
            continue
        conflict = new in env and env[new] != env[old]
        out.append(
            warning(
                f"{old}={env[old]} is deprecated; torch reads {new}"
                + (f" (set to {env[new]}, which wins)" if conflict else ""),
                detail="torch still honours the old name only as a fallback and warns about it; scripts copied from "
                "older guides keep setting it.",
                fix=f"export {new}={env[old]} and unset {old}",
                evidence={old: env[old], new: env.get(new)},
                id="nccl-env/deprecated",
                explain="nccl-env#deprecated",
            )
        )
    return out


def _timeouts(env: dict[str, str]) -> list:
    said = (_ib_timeout(env.get("NCCL_IB_TIMEOUT")), _heartbeat_short(env), _blocking_wait(env))
    return [f for f in said if f is not None]


def _ib_timeout(ib: str | None):
    """NCCL_IB_TIMEOUT outside NCCL's range, or so short or long that a retry fails or waits too long."""
    if ib is None:
        return None
    value = _int(ib)
    if value is None or not 1 <= value <= 31:
        title, detail = f"NCCL_IB_TIMEOUT={ib} is outside NCCL's range 1-31", ""
        fix = "unset NCCL_IB_TIMEOUT (NCCL's default is fine) or use 18-22"
    elif value < 14:
        title = f"NCCL_IB_TIMEOUT={ib} is very short ({4.096e-6 * 2**value * 1000:.0f} ms per InfiniBand retry)"
        detail = (
            "On a busy fabric transfers then fail with 'NET/IB: Got completion from peer with error 12' "
            "(transport retry counter exceeded)."
        )
        fix = "raise NCCL_IB_TIMEOUT to 18-22, or unset it"
    elif value > 24:
        title = f"NCCL_IB_TIMEOUT={ib} is very long ({4.096e-6 * 2**value / 60:.0f} min per retry)"
        detail = "A dead link is then noticed only after many minutes, long after a torch timeout would fire."
        fix = "use 18-22, or unset it"
    else:
        return None
    return warning(
        title,
        detail=detail,
        fix=fix,
        evidence={"NCCL_IB_TIMEOUT": ib},
        id="nccl-env/ib-timeout",
        explain="nccl-env#ib-timeout",
    )


def _heartbeat_short(env: dict[str, str]):
    heartbeat = env.get("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
    if heartbeat is None or (_int(heartbeat) or 0) >= 60:
        return None
    return warning(
        f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={heartbeat} is very short (default {HEARTBEAT_DEFAULT_S})",
        detail="The heartbeat monitor kills the process when the NCCL watchdog thread looks stuck "
        "for this long; "
        "a short value kills healthy jobs during long CUDA calls such as checkpoint saving.",
        fix="unset it, or use at least 300",
        evidence={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": heartbeat},
        id="nccl-env/heartbeat-short",
        explain="nccl-env#heartbeat-short",
    )


def _blocking_wait(env: dict[str, str]):
    if env.get("TORCH_NCCL_BLOCKING_WAIT", env.get("NCCL_BLOCKING_WAIT")) != "1":
        return None
    return warning(
        "blocking wait is on: every collective blocks the CPU until it finishes",
        detail="It serialises the host with the GPU and slows training; TORCH_NCCL_ASYNC_ERROR_HANDLING "
        "(default 3 in torch 2.2+) already turns timeouts into errors.",
        fix="unset TORCH_NCCL_BLOCKING_WAIT / NCCL_BLOCKING_WAIT",
        evidence={},
        id="nccl-env/blocking-wait",
        explain="nccl-env#blocking-wait",
    )


def _port(rendezvous: dict[str, Any] | None, plan) -> list:
    if not rendezvous:
        return []
    if rendezvous.get("error"):
        return [
            error(
                str(rendezvous["error"]),
                fix="MASTER_PORT must be a port number 1-65535",
                evidence=rendezvous,
                id="nccl-env/port-invalid",
            )
        ]
    if not rendezvous.get("in_use"):
        return []
    port, source = rendezvous.get("master_port"), rendezvous.get("source", "recorded")
    if plan is not None and (plan.world_size == 1 or plan.master_port != port):
        used = "no rendezvous: one process" if plan.world_size == 1 else f"sftdoctor train uses port {plan.master_port}"
        return [
            info(
                f"rendezvous port {port} ({source}) is taken on this host; {used}",
                detail=plan.reasons.get("master_port", ""),
                evidence=rendezvous,
                id="nccl-env/port-moved",
            )
        ]
    severity = warning if source == "torchrun default" else error
    return [
        severity(
            f"rendezvous port {port} ({source}) is already taken on this host",
            detail="The launch will fail with 'The server socket has failed to listen on any local network address. "
            f"... port: {port} ... EADDRINUSE' — often a previous run's torchrun still alive.",
            fix=f"see who holds it: ss -ltnp 'sport = :{port}'; stop it, or choose another port "
            '([launch] master_port = "auto", or torchrun --master-port)',
            evidence=rendezvous,
            id="nccl-env/port-busy",
            explain="nccl-env#port-busy",
        )
    ]


@check(
    "nccl-env",
    "deprecated NCCL variables, risky timeouts, and a busy rendezvous port",
    messages={
        "deprecated": "a deprecated NCCL_* name torch reads under its TORCH_NCCL_* name",
        "ib-timeout": "NCCL_IB_TIMEOUT out of range, very short or very long",
        "heartbeat-short": "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC very short",
        "blocking-wait": "blocking wait on: every collective blocks the CPU",
        "port-invalid": "MASTER_PORT is not a port number",
        "port-busy": "the rendezvous port is already taken on this host",
        "port-moved": "a busy port the run does not use (one process, or another port)",
    },
)
def nccl_env(env: dict[str, str], rendezvous: dict[str, Any] | None = None, plan=None):
    findings = _deprecated(env) + _timeouts(env) + _port(rendezvous, plan)
    if findings:
        return findings
    nccl = sorted(k for k in env if k.startswith(("NCCL_", "TORCH_NCCL_")))
    port = (
        f"; rendezvous port {rendezvous.get('master_port')} free"
        if rendezvous and rendezvous.get("in_use") is False
        else ""
    )
    return ok(
        f"{len(nccl)} NCCL variable(s) set, none deprecated or risky{port}", evidence={name: env[name] for name in nccl}
    )
