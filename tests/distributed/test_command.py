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
from pathlib import Path

import psutil
import pytest
from conftest import recorded_gpus

from sftdoctor.distributed.command import Launcher, absent_rank, launcher, snapshot_path
from sftdoctor.errors import InputError

A100x4 = "a100_80g_pcie_4x_driver525_princeton.txt"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc, *args, env=None, node=None, nnodes=1, port=None, node_rank=0):
    launch = (
        ["--standalone"]
        if nnodes == 1
        else [
            "--nnodes",
            str(nnodes),
            "--node-rank",
            str(node_rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "sftdoctor-test",
        ]
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launch,
        "--nproc-per-node",
        str(nproc),
        "-m",
        "sftdoctor",
        "check",
        "--distributed",
        "--seconds",
        "2",
        *args,
    ]
    full_env = {**os.environ, **(env or {}), **({"SFTDOCTOR_NODE": node} if node else {})}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)


def finish(proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def snapshot(path, torch_version="2.13.0+cpu", gpus=None):
    facts = {
        "packages": {
            "torch": torch_version.split("+")[0],
            "transformers": "5.24.0",
            "trl": "1.16.0",
            "deepspeed": "0.19.8",
            "accelerate": "1.15.0",
        },
        "torch_build": {"version": torch_version, "cuda": None, "hip": None},
        "gpus": gpus or {"source": None, "driver_version": None, "cuda_version": None, "devices": []},
    }
    path.write_text(json.dumps({"schema": 2, "facts": facts}))


@pytest.mark.slow  # end-to-end: sftdoctor under torchrun
def test_two_ranks_agree_measure_gloo_bandwidth_and_verify_every_sum(tmp_path):
    code, out, err = finish(torchrun(2, "--json", "--out", str(tmp_path / "out")))
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    by_id = {f["id"]: f for f in doc["findings"]}
    assert by_id["cluster-consistency"]["severity"] == "ok"
    assert (
        by_id["collective-correctness"]["severity"] == "ok"
        and "exact on every rank" in by_id["collective-correctness"]["title"]
    )
    sizes = by_id["collective-bandwidth/measured"]["evidence"]["sizes"]  # gloo on one host: no link promises more
    assert sizes and all(0 < s["busbw_gbps"] < 1e4 and s["busbw_gbps"] == pytest.approx(s["algbw_gbps"]) for s in sizes)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["findings.json", "rank-0.json", "rank-1.json"]


@pytest.mark.slow  # end-to-end: sftdoctor under torchrun
def test_a_node_with_another_torch_is_named_and_the_sweep_runs_across_nodes(tmp_path):
    snapshot(tmp_path / "a.json")
    snapshot(tmp_path / "b.json", torch_version="2.4.1+cu121")
    port = free_port()
    template = str(tmp_path / "{node}.json")
    procs = [
        torchrun(
            2, "--facts", template, "--json", "--out", str(tmp_path / node), node=node, nnodes=2, port=port, node_rank=i
        )
        for i, node in enumerate("ab")
    ]
    results = [finish(p) for p in procs]
    assert all(code == 1 for code, _, _ in results), [r[2][-2000:] for r in results]
    doc = json.loads(next(out for _, out, _ in results if out.strip()))
    [odd] = [f for f in doc["findings"] if f["id"] == "cluster-consistency/stack-differs"]
    # two ranks on each side: a tie, so both nodes are named
    assert odd["title"] == "torch differs across ranks: node a (ranks 0, 1); node b (ranks 2, 3) disagree"
    assert "2.4.1+cu121 on 2 ranks" in odd["detail"]
    groups = {g["name"] for g in doc["facts"]["cluster"]["sweep"]["groups"]}
    assert groups == {"node a", "node b", "across nodes"}


@pytest.mark.slow  # end-to-end: sftdoctor under torchrun
def test_two_ranks_on_one_gpu_is_the_duplicate_gpu_error_before_nccl_says_it(tmp_path):
    snapshot(tmp_path / "snap.json", gpus=recorded_gpus(A100x4))
    code, out, err = finish(
        torchrun(
            2, "--facts", str(tmp_path / "snap.json"), "--out", str(tmp_path / "out"), env={"CUDA_VISIBLE_DEVICES": "0"}
        )
    )
    assert code == 1, err[-3000:]
    assert "ranks 0 and 1 would share one GPU" in out and "sftdoctor explain nccl-error" in out


@pytest.mark.slow  # end-to-end: sftdoctor under torchrun
def test_a_rank_that_never_joins_is_named_within_the_bound_and_nothing_is_left_running(tmp_path):
    began = time.monotonic()
    proc = torchrun(2, "--bound", "5", "--drill", "absent:1", "--out", str(tmp_path / "out"))
    code, out, err = finish(proc)
    assert code != 0
    assert "rank 1 did not join within 5 s" in out
    assert time.monotonic() - began < 90
    leftover = [
        p for p in psutil.process_iter(["cmdline"]) if str(tmp_path / "out") in " ".join(p.info["cmdline"] or [])
    ]
    assert leftover == []


# ---------------------------------------------------------------- the launcher's environment

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "node-a", "MASTER_PORT": "29400"}


def test_the_launchers_variables_place_the_rank():
    assert launcher(TORCHRUN) == Launcher(rank=1, world=2, local_rank=1, master_addr="node-a", master_port=29400)
    assert launcher({**TORCHRUN, "LOCAL_RANK": "0"}).local_rank == 0
    no_local = {k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}  # some launchers leave it out
    assert launcher(no_local).local_rank == 0


@pytest.mark.parametrize(
    "change, says",
    [
        ({"RANK": "2"}, "RANK: expected an integer 0..1, got '2'"),
        ({"RANK": "-1"}, "RANK: expected an integer 0..1, got '-1'"),
        ({"RANK": None}, "RANK: not set; expected an integer 0..1 from the launcher"),
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE: expected an integer >= 1, got 'abc'"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE: expected an integer >= 1, got '0'"),
        ({"LOCAL_RANK": "x"}, "LOCAL_RANK: expected an integer 0..1, got 'x'"),
        ({"MASTER_ADDR": None}, "MASTER_ADDR: not set; expected the host of rank 0"),
        ({"MASTER_ADDR": " "}, "MASTER_ADDR: not set; expected the host of rank 0"),
        ({"MASTER_PORT": "99999"}, "MASTER_PORT: expected an integer 1..65535, got '99999'"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT: expected an integer 1..65535, got 'http'"),
    ],
)
def test_a_bad_launcher_variable_is_named(change, says):
    environ = {k: v for k, v in {**TORCHRUN, **change}.items() if v is not None}
    with pytest.raises(InputError) as caught:
        launcher(environ)
    assert str(caught.value).startswith(f"environment: {says}")


def test_the_absent_drill_names_an_existing_rank():
    assert absent_rank(None, 2) is None and absent_rank("absent:1", 2) == 1
    for drill in ("absent:2", "absent:-1", "absent:", "gone:1", ""):
        with pytest.raises(InputError, match=r"--drill: expected absent:RANK with RANK 0\.\.1"):
            absent_rank(drill, 2)


def test_a_per_rank_facts_template_is_filled_or_refused():
    assert snapshot_path("snaps/{node}-{rank}.json", 3, 1, "gpu7") == Path("snaps/gpu7-3.json")
    assert snapshot_path(None, 0, 0, "n") is None
    for template in ("{host}.json", "{0}.json", "{rank.json"):
        with pytest.raises(InputError, match="--facts: expected a path with only"):
            snapshot_path(template, 0, 0, "n")


@pytest.mark.parametrize(
    "env, args, says",
    [
        ({"RANK": "0", "WORLD_SIZE": "1"}, [], "environment: MASTER_ADDR: not set"),
        (
            {**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"},
            ["--drill", "absent:3"],
            "--drill: expected absent:RANK",
        ),
        (
            {**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"},
            ["--out", "FILE"],
            "exists and is not a folder",
        ),
    ],
)
def test_a_rank_with_bad_input_says_so_in_one_line(tmp_path, env, args, says):
    """No KeyError traceback from each rank: one line, exit 2, before any store or process group."""
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / a) if a == "FILE" else a for a in args]
    clean = {k: v for k, v in os.environ.items() if k not in TORCHRUN}
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--distributed", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("sftdoctor: error: ") and says in line
