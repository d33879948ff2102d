"""`sftdoctor check --distributed` under real torchrun, 2 and 4 processes over gloo on this CPU.

Nodes are simulated by running torchrun twice on this host (--nnodes 2, c10d rendezvous) with a node
name per torchrun (SFTDOCTOR_NODE); what each rank runs comes from facts snapshots of recorded real
machines (`--facts` with {node} in the path), as `sftdoctor facts` writes them.
"""

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from conftest import recorded_gpus

pytestmark = pytest.mark.slow  # end-to-end: every test launches sftdoctor for real

A100x4 = "a100_80g_pcie_4x_driver525_princeton.txt"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc, *args, env=None, node=None, nnodes=1, port=None, node_rank=0):
    launch = ["--standalone"] if nnodes == 1 else ["--nnodes", str(nnodes), "--node-rank", str(node_rank),
                                                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                                   "--rdzv-id", "sftdoctor-test"]
    command = [sys.executable, "-m", "torch.distributed.run", *launch, "--nproc-per-node", str(nproc),
               "-m", "sftdoctor", "check", "--distributed", "--seconds", "2", *args]
    full_env = {**os.environ, **(env or {}), **({"SFTDOCTOR_NODE": node} if node else {})}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)


def finish(proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def snapshot(path, torch_version="2.13.0+cpu", gpus=None):
    facts = {"packages": {"torch": torch_version.split("+")[0], "transformers": "5.24.0", "trl": "1.16.0",
                          "deepspeed": "0.19.8", "accelerate": "1.15.0"},
             "torch_build": {"version": torch_version, "cuda": None, "hip": None},
             "gpus": gpus or {"source": None, "driver_version": None, "cuda_version": None, "devices": []}}
    path.write_text(json.dumps({"schema": 2, "facts": facts}))


def test_two_ranks_agree_measure_gloo_bandwidth_and_verify_every_sum(tmp_path):
    code, out, err = finish(torchrun(2, "--json", "--out", str(tmp_path / "out")))
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    by_id = {f["id"]: f for f in doc["findings"]}
    assert by_id["cluster-consistency"]["severity"] == "ok"
    assert by_id["collective-correctness"]["severity"] == "ok" and "exact on every rank" in by_id["collective-correctness"]["title"]
    sizes = by_id["collective-bandwidth"]["evidence"]["sizes"]
    assert sizes and all(0 < s["busbw_gbps"] < 1e4 and s["busbw_gbps"] == pytest.approx(s["algbw_gbps"]) for s in sizes)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["findings.json", "rank-0.json", "rank-1.json"]


def test_a_node_with_another_torch_is_named_and_the_sweep_runs_across_nodes(tmp_path):
    snapshot(tmp_path / "a.json")
    snapshot(tmp_path / "b.json", torch_version="2.4.1+cu121")
    port = free_port()
    template = str(tmp_path / "{node}.json")
    procs = [torchrun(2, "--facts", template, "--json", "--out", str(tmp_path / node), node=node, nnodes=2,
                      port=port, node_rank=i) for i, node in enumerate("ab")]
    results = [finish(p) for p in procs]
    assert all(code == 1 for code, _, _ in results), [r[2][-2000:] for r in results]
    doc = json.loads(next(out for _, out, _ in results if out.strip()))
    [odd] = [f for f in doc["findings"] if f["id"] == "cluster-consistency"]
    # two ranks on each side: a tie, so both nodes are named
    assert odd["title"] == "torch differs across ranks: node a (ranks 0, 1); node b (ranks 2, 3) disagree"
    assert "2.4.1+cu121 on 2 ranks" in odd["detail"]
    groups = {g["name"] for g in doc["facts"]["cluster"]["sweep"]["groups"]}
    assert groups == {"node a", "node b", "across nodes"}


def test_two_ranks_on_one_gpu_is_the_duplicate_gpu_error_before_nccl_says_it(tmp_path):
    snapshot(tmp_path / "snap.json", gpus=recorded_gpus(A100x4))
    code, out, err = finish(torchrun(2, "--facts", str(tmp_path / "snap.json"), "--out", str(tmp_path / "out"),
                                     env={"CUDA_VISIBLE_DEVICES": "0"}))
    assert code == 1, err[-3000:]
    assert "ranks 0 and 1 would share one GPU" in out and "sftdoctor explain nccl-error" in out


def test_a_rank_that_never_joins_is_named_within_the_bound_and_nothing_is_left_running(tmp_path):
    began = time.monotonic()
    proc = torchrun(2, "--bound", "5", "--drill", "absent:1", "--out", str(tmp_path / "out"))
    code, out, err = finish(proc)
    assert code != 0
    assert "rank 1 did not join within 5 s" in out
    assert time.monotonic() - began < 90
    leftover = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path / "out") in " ".join(p.info["cmdline"] or [])]
    assert leftover == []
