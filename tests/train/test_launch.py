"""The launcher: the workers' environment, the torchrun command the plan gives, how a failed launch is told."""

import json

import pytest
from conftest import make_run, plan_of

from sftdoctor.train.launch import command, worker_env

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"


def test_workers_load_a_cached_hub_model_offline(tmp_path, monkeypatch):
    """Every hub model in the cache: the workers never wait on a hub that may be unreachable. (A model neither
    cached nor reachable, a report backend not installed: refused before the checks,
    tests/facts/test_launch_inputs.py.)"""
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "snapshots" / "abc" / "config.json").write_text("{}")
    (repo / "snapshots" / "abc" / "tokenizer_config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cached = plan_of(make_run(tmp_path, model={"path": "Qwen/Qwen2.5-7B"}))
    assert worker_env(cached, tmp_path / "run.toml", tmp_path)["HF_HUB_OFFLINE"] == "1"
    (repo / "refs" / "main").unlink()  # a snapshot of another revision: main is not cached
    assert "HF_HUB_OFFLINE" not in worker_env(cached, tmp_path / "run.toml", tmp_path)


def test_torchrun_gets_the_node_rank_as_who_hosts_the_rendezvous(tmp_path):
    def two(rank):
        return plan_of(
            make_run(
                tmp_path,
                launch={
                    "nproc_per_node": 2,
                    "nnodes": 2,
                    "node_rank": rank,
                    "master_addr": "node0",
                    "master_port": 29400,
                },
            )
        )

    head, other = command(tmp_path / "r.json", two(0), False, None), command(tmp_path / "r.json", two(1), True, None)
    assert "--rdzv-conf=is_host=true,join_timeout=600" in head and "--rdzv-conf=is_host=false,join_timeout=600" in other
    assert "--rdzv-endpoint=node0:29400" in head and "--nnodes=2" in head and other[-1] == "--resume"
    single = command(tmp_path / "r.json", plan_of(make_run(tmp_path)), False, 2)
    assert "torch.distributed.run" not in single and single[-1] == "--stop-after=2"


def test_a_busy_default_port_does_not_block_train(tmp_path, tiny_data):
    """Something on the host holds 29500: a one-node run moves to a free port instead of refusing to start."""
    import socket
    import subprocess
    import sys

    from trainrun import config

    cfg = config(tmp_path, tiny_data["text"], training={"packing": False}, launch={"nproc_per_node": 2})
    cfg.write_text(cfg.read_text().replace('master_port = "auto"\n', ""))  # the default, not a choice
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("", 29500))
        holder.listen()
    except OSError:
        pass  # already held by something else on this host: the same situation
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sftdoctor", "train", str(cfg), "--dry-run"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        holder.close()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the default 29500 is taken here: a free port" in proc.stdout
    assert "sftdoctor train uses port" in proc.stdout and "rendezvous      127.0.0.1:29500" not in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("asked", ["auto", "bf16", "fp16", "fp32"])
def test_check_dry_run_and_the_worker_agree_on_the_precision(tmp_path, tiny_data, asked):
    """One decision read three ways: `check --json` (its plan fact), `train --dry-run`, and
    the resolved.json the workers read (written by a rehearsal)."""
    import subprocess
    import sys

    from trainrun import config, train

    from sftdoctor.run import Plan

    cfg = config(
        tmp_path,
        tiny_data["text"],
        training={"packing": False},
        extra={"model": {"path": str(tiny_data["text"] / "model"), "weights": "random", "precision": asked}},
    )
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "sftdoctor", "check", "--json", "--config", str(cfg)], capture_output=True, text=True
        ).stdout
    )
    decided = doc["facts"]["facts"]["plan"]["precision"]
    assert decided == ("fp32" if asked == "auto" else asked)  # no GPU here
    dry = train(cfg, "--dry-run")
    assert f"precision       {decided} " in dry.stdout
    if asked in ("auto", "fp32"):  # the CPU trains these; the rehearsal writes what the workers read
        smoke = train(cfg, "--smoke", "--force")
        assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-2000:]
        plan = Plan.from_json(json.loads((tmp_path / "out" / "smoke" / "resolved-smoke.json").read_text()))
        assert plan.precision == decided and plan.load_dtype == "float32"


def test_a_failure_no_signature_knows_is_told_by_its_last_words_not_torchruns_rule(tmp_path):
    from sftdoctor.train.launch import failure_cause

    log = tmp_path / "train.log"
    log.write_text("loading the model\nrank 1 exited with code 1\n" + "=" * 60 + "\n")  # no exception to quote
    assert (
        failure_cause(log)
        == f"rank 1 exited with code 1 (line 2 of {log}; no known cause: `sftdoctor explain --log {log}`)"
    )
    log.write_text("loading the model\nbye\n" + "=" * 60 + "\n")  # nothing that shows a failure: its last words
    assert failure_cause(log) == "bye"
