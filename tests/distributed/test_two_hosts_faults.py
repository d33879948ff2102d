"""Faults between two real hosts (network namespaces joined by a veth pair; see tests/hosts.py): a node with
another torch (a bind mount on one host only), and a firewall on node0 (iptables in its namespace) that
blocks every port, or every port but master_port."""

import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hosts import torchrun, train_on, two_node_config

from sftdoctor.facts.system import free_port
from sftdoctor.triage import diagnose

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
OTHER_TORCH = "2.12.1+cpu"


def torch_version_file() -> tuple[Path, str]:
    """torch/version.py (what sftdoctor's torch_build fact reads, and `torch.__version__` comes from) and
    the version it holds."""
    found = subprocess.run(
        [sys.executable, "-c", "import torch.version as v; print(v.__file__); print(v.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return Path(found[0]), found[1]


def test_a_node_with_another_torch_is_named_with_both_versions(hosts, tmp_path):
    """node1 sees another torch/version.py (bind-mounted over the shared install in its own mount namespace
    only): `check --distributed` fails and rank 0 names node1 and both versions."""
    real, version = torch_version_file()
    assert version != OTHER_TORCH
    text = real.read_text()
    other = re.sub(r"^__version__ = .*$", f"__version__ = '{OTHER_TORCH}'", text, count=1, flags=re.MULTILINE)
    assert other != text
    (tmp_path / "version.py").write_text(other)
    node0, node1 = hosts[0], hosts[1].with_mounts((tmp_path / "version.py", real))
    seen = node1.run([sys.executable, "-c", "import torch; print(torch.__version__)"], cwd=ROOT)
    assert seen.stdout.strip() == OTHER_TORCH, seen  # node1 alone: the shared file is untouched
    assert real.read_text() == text
    port = free_port()
    procs = [
        torchrun(host, port, "check", "--distributed", "--seconds", "2", "--out", str(tmp_path / host.name))
        for host in (node0, node1)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    lines = outs[0][0].splitlines()  # rank 0, on node0, prints the verdict
    [head] = [i for i, line in enumerate(lines) if line.startswith("✗  cluster-consistency")]
    # one rank each: a tie, so neither node is "the rest"
    assert "torch differs across ranks: node node0 (rank 0); node node1 (rank 1) disagree" in lines[head], outs[0][0]
    assert f"torch: {version} on 1 rank, {OTHER_TORCH} on 1 rank." in lines[head + 1], outs[0][0]
    assert "fix: install the same torch on every node" in lines[head + 2], outs[0][0]
    assert [h.pids() for h in hosts] == [[], []]


def iptables(host, *rule: str) -> None:
    """A firewall rule on `host` alone (netfilter rules belong to the network namespace, and go with it)."""
    tried = []
    for tool in ("iptables", "iptables-legacy"):  # the nft backend, else the legacy one
        if shutil.which(tool) is None:
            continue
        done = subprocess.run(["ip", "netns", "exec", host.netns, tool, *rule], capture_output=True, text=True)
        if done.returncode == 0:
            return
        tried.append(f"{tool}: {done.stderr.strip()}")
    pytest.skip(f"no working iptables in a network namespace ({'; '.join(tried) or 'apt-get install iptables'})")


def finish_all(procs, began: float, timeout: float) -> list[tuple[float, str, str]]:
    """(seconds from `began` to its exit, stdout, stderr) of each process, waited for together."""
    ends = [None] * len(procs)

    def wait(i, proc):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:  # a hang: the asserts on the time say so (the hosts' teardown kills the rest)
            proc.kill()
            out, err = proc.communicate()
        ends[i] = (time.monotonic() - began, out, err)

    threads = [threading.Thread(target=wait, args=(i, p)) for i, p in enumerate(procs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ends


def line_of(out: str, start: str) -> str:
    """The one line of `out` that starts with `start`."""
    [line] = [line for line in out.splitlines() if line.startswith(start)]
    return line


def drop_inbound(host, *ports: int) -> None:
    """A firewall on `host`: inbound TCP from the other host dropped (no answer, as firewalls and cloud security
    groups do; not refused), except to `ports` when given, and replies to its own connections."""
    iptables(host, "-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
    iptables(host, "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
    for port in ports:
        iptables(host, "-A", "INPUT", "-p", "tcp", "--dport", str(port), "-j", "ACCEPT")
    iptables(host, "-A", "INPUT", "-p", "tcp", "-j", "DROP")


def train_everywhere(hosts, cfg: Path):
    """`sftdoctor train` of one config on every host at once: the exit codes, then (seconds, stdout) per host."""
    began = time.monotonic()
    procs = [train_on(host, cfg) for host in hosts]
    ends = finish_all(procs, began, timeout=500)
    codes = [p.returncode for p in procs]
    print(", ".join(f"node{i} stopped after {t:.1f} s" for i, (t, _, _) in enumerate(ends)) + f" (exit {codes})")
    return codes, *((t, out) for t, out, _ in ends)


def test_a_firewall_on_the_rendezvous_port_stops_both_nodes_at_the_gate_each_naming_its_side(
    hosts, tmp_path, tiny_data
):
    """node0 drops inbound TCP from node1 (the rendezvous port with the rest). Both run `sftdoctor train`:
    node0 hosts the gate's store on master_port and names who came after join_timeout_s; node1's connect gets no
    answer and it gives up after the same timeout. Neither launches torchrun."""
    port = free_port()
    cfg = two_node_config(tmp_path, tiny_data["text"], port, rehearse=False, join_timeout_s=10)
    drop_inbound(hosts[0])
    codes, (t0, out0), (t1, out1) = train_everywhere(hosts, cfg)
    # the checks take 17 s on an idle 2-core machine, over 60 s on a busy one; then 10 s at the gate
    assert codes == [1, 1] and t0 < 240 and t1 < 240, (codes, t0, t1, out0[-2000:], out1[-2000:])
    assert line_of(out0, "sftdoctor: not starting: ") == (
        "sftdoctor: not starting: 1 of 2 nodes reached the gate within 10 s (node0); the others never came: not "
        f"started, failed before their checks, or cannot reach node0:{port}"
    ), out0[-2000:]
    assert line_of(out1, "sftdoctor: not starting: ") == (
        f"sftdoctor: not starting: could not reach node 0 at node0:{port} within 10 s (The client socket has timed "
        f"out after 10000ms while trying to connect to (node0, {port})): it is not started yet, or a firewall or a "
        "wrong master_addr is in the way"
    ), out1[-2000:]
    assert not (tmp_path / "out" / "train.log").exists()  # torchrun never started
    assert [h.pids() for h in hosts] == [[], []]


def test_a_firewall_open_only_on_the_rendezvous_port_stops_both_nodes_at_the_workers_store(hosts, tmp_path, tiny_data):
    """node0 lets master_port through and drops the rest: the gate and torchrun's rendezvous pass, but the
    workers' store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: worker rank 0 hosts it, on a port of its own chosen at
    random) cannot be reached from node1. The distributed check bounds the wait (hang_timeout_s); each node's
    launcher names its side."""
    port = free_port()
    cfg = two_node_config(tmp_path, tiny_data["text"], port, rehearse=False, join_timeout_s=20)
    cfg.write_text(cfg.read_text() + "[watch]\nhang_timeout_s = 30\n")  # the check's join bound: 30 s
    drop_inbound(hosts[0], port)
    codes, (t0, out0), (t1, out1) = train_everywhere(hosts, cfg)
    # the checks, the gate, torchrun's rendezvous, 30 s in the check: 78 s idle, up to 140 s seen on a busy machine
    assert codes == [1, 1] and t0 < 300 and t1 < 300, (codes, t0, t1, out0[-2000:], out1[-2000:])
    for out in (out0, out1):
        assert "sftdoctor: every node passed its checks: node0, node1" in out, out[-2000:]
    failed0 = line_of(out0, "sftdoctor: the run failed")
    assert failed0.startswith(
        "sftdoctor: the run failed (exit 1, before its first step): rank(s) 1 never reached "
        "rank 0's store in the distributed check (30 s)"
    ), out0[-3000:]
    failed1 = line_of(out1, "sftdoctor: the run failed")
    store = re.search(
        r"before its first step\): could not reach the store at node0:(\d+) \(gave up after 30000ms\)", failed1
    )
    assert store and int(store[1]) != port, out1[-3000:]  # the workers' store: another port than master_port
    assert "train-node1.log" in failed1
    # node0's log, as `sftdoctor explain --log` reads it: rank 0's own table line is the root cause
    with open(tmp_path / "out" / "train.log", "rb") as log:
        root = diagnose(log, "train.log").root
    assert root.finding.id == "master-port" and root.finding.evidence["signature"] == "sftdoctor-check-not-joined"
    assert (root.finding.evidence["ranks"], root.finding.evidence["bound_s"]) == ("1", "30")
    assert "rank 1 did not join within 30 s" in root.finding.evidence["text"]
    assert [h.pids() for h in hosts] == [[], []]
