"""Two hosts on one machine, for the tests that cross a host boundary.

Each host is a network namespace with an address of its own on a veth pair joining the two, a hostname of its
own (a UTS namespace per command) and an /etc/hosts naming both (`ip netns exec` bind-mounts
/etc/netns/NAME/hosts over /etc/hosts). Traffic stays between the two namespaces. They share the file
system, as the nodes of a cluster share their storage, except what a host bind-mounts over it for itself
(`Host.with_mounts`: a file of another content on one node only, as a node with another install). Needs root
and iproute2; the tests skip without them.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from trainrun import config

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Host:
    name: str  # its hostname, and its name in the other's /etc/hosts
    netns: str
    addr: str
    mounts: tuple[tuple[str, str], ...] = ()  # (source, target) bind mounts every command of this host sees

    def with_mounts(self, *mounts: tuple[str | Path, str | Path]) -> Host:
        """This host, its commands seeing each source file or folder at its target (the rest of the file
        system is still shared). Each command gets its own mount namespace from `ip netns exec`, so the
        mounts are made in it, before the command starts, and go with it."""
        return replace(self, mounts=self.mounts + tuple((str(src), str(dst)) for src, dst in mounts))

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run on this host: in its network namespace, under its own hostname, with its mounts."""
        binds = "".join(f"mount --bind {shlex.quote(src)} {shlex.quote(dst)} && " for src, dst in self.mounts)
        return [
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            f'{binds}hostname {self.name} && exec "$@"',
            "sh",
            *map(str, argv),
        ]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, **kwargs)

    def pids(self) -> list[int]:
        """Every process in this host's network namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def kill_all(self, sig: int = signal.SIGKILL) -> list[int]:
        """As when the machine dies: every process of this host at once."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> str | None:
    """Why two hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 and util-linux (ip netns, unshare)"
    probe = f"sftd-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@contextlib.contextmanager
def two_hosts(names: tuple[str, str] = ("node0", "node1")):
    """(host 0, host 1), torn down after: every process in them killed, the namespaces removed."""
    why = available()
    if why:
        pytest.skip(f"two hosts on one machine: {why}")
    tag = f"{os.getpid() % 100000}"
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    hosts = [Host(name, f"sftd{tag}{i}", f"{subnet}.{i + 1}") for i, name in enumerate(names)]
    veth = [f"sfv{tag}{i}" for i in range(2)]
    try:
        for host in hosts:
            _ip("netns", "add", host.netns)
            folder = Path("/etc/netns") / host.netns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{h.addr} {h.name}\n" for h in hosts))
        _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for host, end in zip(hosts, veth):
            _ip("link", "set", end, "netns", host.netns)
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", end)
            _ip("-n", host.netns, "link", "set", end, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        yield tuple(hosts)
    finally:
        for host in hosts:
            host.kill_all()
        time.sleep(0.2)
        for host in hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / host.netns, ignore_errors=True)


# ---- sftdoctor across the two hosts


def two_node_config(folder: Path, data: Path, port: int, training=None, deepspeed=None, extra=None, **launch) -> Path:
    """A run of 6 steps (a checkpoint every 3) on two nodes of one process each, node0 at master_port `port`;
    `launch` adds to or overrides [launch], `training` [training]; `deepspeed` and `extra` as trainrun.config's."""
    return config(
        folder,
        data,
        training={"max_steps": 6, "save_steps": 3, **(training or {})},
        launch={"nnodes": 2, "nproc_per_node": 1, "master_addr": "node0", "master_port": port, **launch},
        deepspeed=deepspeed,
        extra=extra,
    )


def train_on(host: Host, cfg: Path, *flags: str, env=None) -> subprocess.Popen:
    """`sftdoctor train` on a host, as a user runs it there."""
    return _start(host, ["-m", "sftdoctor", "train", str(cfg), *flags], env)


def torchrun(host: Host, port: int, *argv: str) -> subprocess.Popen:
    """`sftdoctor ARGV` under the same torchrun command on each host: c10d rendezvous at node0 (torchrun hosts
    the store on the host whose name matches the endpoint)."""
    rendezvous = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=node0:{port}"]
    return _start(host, ["-m", "torch.distributed.run", *rendezvous, "--rdzv-id=two-hosts", "-m", "sftdoctor", *argv])


def _start(host: Host, args: list[str], env=None) -> subprocess.Popen:
    """This Python with `args` on a host, from the repository's root, its output read as text."""
    return host.popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
