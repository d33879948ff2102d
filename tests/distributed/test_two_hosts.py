"""Two real hosts (network namespaces joined by a veth pair, each with its own address and hostname; see
tests/hosts.py): `check --distributed` and `sftdoctor train` run the same command on both, as on a cluster."""

import json
import re
import time
from pathlib import Path

import pytest
from conftest import install_plugin
from hosts import torchrun, train_on, two_node_config
from trainrun import metrics

from sftdoctor.facts.system import free_port

pytestmark = pytest.mark.slow


def test_check_distributed_names_both_hosts_and_measures_across_them(hosts, tmp_path):
    port = free_port()
    procs = [
        torchrun(host, port, "check", "--distributed", "--seconds", "2", "--out", str(tmp_path / host.name))
        for host in hosts
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    text = outs[0][0]  # rank 0, on node0, prints the verdict
    assert re.search(r"✓  cluster-consistency +2 ranks on 2 nodes agree", text), text
    assert re.search(r"collective-bandwidth/measured +across nodes: bus bandwidth", text) and "(gloo, 2 ranks)" in text
    records = [json.loads(p.read_text()) for p in tmp_path.glob("node*/rank-*.json")]
    assert sorted((r["rank"], r["node"], r["host"]) for r in records) == [(0, "node0", "node0"), (1, "node1", "node1")]


@pytest.mark.parametrize("deepspeed", [None, {"zero_stage": 2}], ids=["ddp", "zero2"])
def test_the_same_train_command_on_both_hosts_trains_together(hosts, tmp_path, tiny_data, deepspeed):
    cfg = two_node_config(tmp_path, tiny_data["text"], free_port(), deepspeed=deepspeed, rehearse=False)
    procs = [train_on(host, cfg) for host in hosts]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[0][-3000:] + o[1][-3000:] for o in outs]
    run_dir = tmp_path / "out"
    node0, node1 = (o[0] for o in outs)
    assert "node rank       0 (master_addr node0 is this host: it hosts the rendezvous)" in node0
    assert "node rank       1 (master_addr node0 is another host" in node1
    assert "world size      2 (1 per node x 2 nodes)" in node0
    # both nodes say the same of the run: the summary is read from the one metrics.jsonl rank 0 wrote
    ends = [o[o.index("sftdoctor: run complete") :].splitlines()[:3] for o in (node0, node1)]
    assert ends[0][1:] == ends[1][1:], ends
    assert (
        (run_dir / "final").is_dir() and (run_dir / "train.log").is_file() and (run_dir / "train-node1.log").is_file()
    )
    plan = json.loads((run_dir / "resolved.json").read_text())
    assert plan["node_rank"] == 0 and plan["world_size"] == 2
    assert [h.pids() for h in hosts] == [[], []]  # nothing left running on either host


def long_run(folder: Path, data: Path, steps: int, save_steps: int, **launch) -> Path:
    """A two-node run long enough to lose a node in, unrehearsed, its watchdog's hang timeout 60 s."""
    return two_node_config(
        folder,
        data,
        free_port(),
        training={"max_steps": steps, "save_steps": save_steps},
        extra={"watch": {"hang_timeout_s": 60}},
        rehearse=False,
        **launch,
    )


def saved(run_dir, step: int, node0) -> None:
    """Waits (at most 300 s) for the run's complete checkpoint of `step`; node0's output if it never comes."""
    done = run_dir / f"checkpoint-{step}" / "sftdoctor-complete"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not done.exists():
        time.sleep(0.2)
    assert done.exists(), node0.communicate()


def test_a_node_that_dies_mid_run_stops_the_other_and_leaves_nothing_running(hosts, tmp_path, tiny_data):
    """Every process of node1 killed at once after the first checkpoint: node0's workers stop well within the
    hang timeout, its launcher says why, and no process of the run is left on either host."""
    cfg = long_run(tmp_path, tiny_data["text"], steps=400, save_steps=2)
    node0, node1 = (train_on(host, cfg) for host in hosts)
    run_dir = tmp_path / "out"
    saved(run_dir, 2, node0)
    killed = time.monotonic()
    assert hosts[1].kill_all()
    out, err = node0.communicate(timeout=180)
    stopped_in = time.monotonic() - killed
    node1.wait(timeout=10)
    assert node0.returncode not in (0, None) and stopped_in < 60, (stopped_in, out[-3000:], err[-3000:])
    [failed] = [line for line in out.splitlines() if line.startswith("sftdoctor: the run failed")]
    assert f"the connection to the process at {hosts[1].addr} (gloo, port" in failed, failed
    assert [h.pids() for h in hosts] == [[], []]


def test_a_node_that_never_comes_is_named_after_the_join_timeout(hosts, tmp_path, tiny_data):
    """node1 never starts: node0's launcher gives up after [launch] join_timeout_s, naming who came, not a hang."""
    cfg = two_node_config(tmp_path, tiny_data["text"], free_port(), rehearse=False, join_timeout_s=10)
    began = time.monotonic()
    out, err = train_on(hosts[0], cfg).communicate(timeout=300)
    assert time.monotonic() - began < 120
    [refused] = [line for line in out.splitlines() if line.startswith("sftdoctor: not starting")]
    assert "1 of 2 nodes reached the gate within 10 s (node0); the others never came" in refused, out[-2000:]
    assert hosts[0].pids() == []


SITE_CHECK = """
from sftdoctor.checks import check
from sftdoctor.findings import error

@check("site-scratch", "this node's scratch disk")
def site_scratch(env):
    return error("/scratch is full on this node", fix="clean /scratch")
"""


def test_a_node_whose_checks_fail_stops_every_node_before_any_starts(hosts, tmp_path, tiny_data):
    """Only node1 has a site check that finds an error: both launchers refuse, naming node1 and its error,
    and neither starts torchrun (the verdicts meet at node0's address before any launch)."""
    cfg = two_node_config(tmp_path, tiny_data["text"], free_port())
    (tmp_path / "site").mkdir()
    env = install_plugin(tmp_path / "site", SITE_CHECK)
    procs = [train_on(hosts[0], cfg), train_on(hosts[1], cfg, env=env)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    assert "sftdoctor: not starting: the checks on node1 found errors: /scratch is full on this node" in outs[0]
    assert "sftdoctor: the other nodes passed their checks: " in outs[1]
    assert "sftdoctor: not starting: the checks above found errors" in outs[1]
    assert not (tmp_path / "out" / "train.log").exists() and not (tmp_path / "out" / "rehearsal.log").exists()
    assert [h.pids() for h in hosts] == [[], []]


def test_a_node_that_comes_back_rejoins_and_the_run_resumes_from_the_newest_checkpoint(hosts, tmp_path, tiny_data):
    """With max_restarts, node1 killed whole after a checkpoint and started again (`--resume`, as a person or
    an orchestrator does): it finds the run in progress and joins torchrun's restart round on node0, and both
    go on from the newest complete checkpoint to the end."""
    cfg = long_run(tmp_path, tiny_data["text"], steps=60, save_steps=4, max_restarts=1, join_timeout_s=180)
    node0, node1 = (train_on(host, cfg) for host in hosts)
    run_dir = tmp_path / "out"
    saved(run_dir, 8, node0)
    assert hosts[1].kill_all()
    node1.wait(timeout=10)
    back = train_on(hosts[1], cfg, "--resume")
    out1, err1 = back.communicate(timeout=400)
    out0, err0 = node0.communicate(timeout=120)
    assert [node0.returncode, back.returncode] == [0, 0], (out0[-3000:] + err0[-3000:], out1[-3000:] + err1[-3000:])
    assert "sftdoctor: the run is in progress at node0:" in out1 and "this node rejoins it" in out1
    assert "waiting for all 2 nodes' checks" not in out1  # no gate: node0 passed it long ago
    resumed = [line for line in (run_dir / "train.log").read_text().splitlines() if "resuming from" in line]
    assert resumed and all("checkpoint-" in line for line in resumed), resumed
    newest_before_restart = int(resumed[-1].rsplit("checkpoint-", 1)[1])
    assert newest_before_restart >= 8
    steps = [m["step"] for m in metrics(run_dir)]
    assert steps[-1] == 60 and set(steps) == set(range(1, 61)) and (run_dir / "final").is_dir()  # the restart
    # logs the steps after the checkpoint again; the report reads the later records
    assert [h.pids() for h in hosts] == [[], []]
