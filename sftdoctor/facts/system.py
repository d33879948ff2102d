"""The CUDA toolkit extensions build with, the relevant environment, the rendezvous port."""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.shapes import OPT_BOOL, OPT_COUNT, OPT_STR, OPT_VERSION
from sftdoctor.run import TORCHRUN_DEFAULT_PORT

# Exact names, and prefixes, of the environment variables that change how a run behaves.
ENV_NAMES = {
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "OMP_NUM_THREADS",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "LD_LIBRARY_PATH",
}
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_FR_", "SLURM_JOB_NUM_NODES")


@fact("env", "the NCCL_*, TORCH_*, CUDA_* and launcher variables set", shape={str: OPT_STR})
def probe_env(facts) -> dict[str, str]:
    return {
        name: value for name, value in sorted(os.environ.items()) if name in ENV_NAMES or name.startswith(ENV_PREFIXES)
    }


def _cuda_home() -> tuple[str | None, str | None]:
    """Where torch.utils.cpp_extension._find_cuda_home looks (torch 2.x), in its order."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var], var
    nvcc = shutil.which("nvcc")
    if nvcc:
        return str(Path(nvcc).resolve().parent.parent), "nvcc on PATH"
    if os.path.exists("/usr/local/cuda"):
        return "/usr/local/cuda", "/usr/local/cuda"
    return None, None


_NVCC_RELEASE = re.compile(r"release (\d+\.\d+)")


@fact(
    "toolkit",
    "CUDA_HOME and the nvcc found there",
    shape={"cuda_home": OPT_STR, "nvcc": OPT_STR, "nvcc_version": OPT_VERSION, "found_by": OPT_STR},
)
def probe_toolkit(facts) -> dict[str, Any]:
    home, found_by = _cuda_home()
    nvcc = Path(home, "bin", "nvcc") if home else None
    result: dict[str, Any] = {"cuda_home": home, "found_by": found_by, "nvcc": None, "nvcc_version": None}
    if nvcc is None or not nvcc.exists():
        return result
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return result
    release = _NVCC_RELEASE.search(out)
    result.update(nvcc=str(nvcc), nvcc_version=release[1] if release else None)
    return result


@fact(
    "rendezvous",
    "the master address and port a launch would use, taken or free, and a free port",
    shape={
        "master_addr": OPT_STR,
        "master_port": OPT_COUNT,
        "free_port": OPT_COUNT,
        "in_use": OPT_BOOL,
        "local": OPT_BOOL,
        "source": OPT_STR,
    },
)
def probe_rendezvous(facts) -> dict[str, Any]:
    """The master address and port a launch would use, whether that port is taken here, and a free port
    (for "auto", or a taken default on one node: run.resolve.master_port decides)."""
    run = facts.get("run")
    env = facts.get("env") or {}
    if run is not None and (run.given("launch", "master_port") or run.given("launch", "master_addr")):
        addr, port, source = run.launch.master_addr, run.launch.master_port, "run config [launch]"
    elif "MASTER_PORT" in env:
        addr, port, source = env.get("MASTER_ADDR", "127.0.0.1"), env["MASTER_PORT"], "environment"
    else:
        addr, port, source = "127.0.0.1", TORCHRUN_DEFAULT_PORT, "torchrun default"
    result: dict[str, Any] = {
        "master_addr": addr,
        "master_port": port,
        "source": source,
        "in_use": None,
        "free_port": free_port(),
    }
    if port == "auto":
        return result
    try:
        port = int(port)
    except (TypeError, ValueError):
        result["error"] = f"MASTER_PORT is not a number: {port!r}"
        return result
    result["master_port"] = port
    result["local"] = is_local_address(str(addr))
    if result["local"]:  # only the node that hosts the rendezvous binds the port
        result["in_use"] = port_in_use(port)
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def is_local_address(addr: str) -> bool:
    if addr in ("localhost", "0.0.0.0", "::", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        if ipaddress.ip_address(addr).is_loopback:
            return True
    except ValueError:
        pass
    try:
        theirs = {(info[0], info[4][0]) for info in socket.getaddrinfo(addr, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    return any(_bindable(family, ip) for family, ip in theirs)


def _bindable(family: int, ip: str) -> bool:
    """Whether `ip` is an address of this host: only an own address can be bound (what TCPStore's server does)."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((ip, 0))
        return True
    except OSError:
        return False


def port_in_use(port: int) -> bool:
    """True when a listener holds the port (what torchrun's TCPStore would hit: EADDRINUSE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
        try:
            sock.bind(("", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False
