"""The watchers under FSDP2 on 2 CPU ranks, as under DDP: every rank's rows of a non-finite step named by file and
line, a hang named by the rank behind and read by the flight recorder (FSDP's own all-gather), and SIGTERM saving
the sharded state both ranks agree on, from which --resume finishes the run."""

import pytest
from trainrun import (
    HANG_EXIT,
    NAN_EXIT,
    complete,
    config,
    job_processes,
    metrics,
    runtime_findings,
    stopped_by_sigterm,
    train,
)

pytestmark = pytest.mark.slow  # end-to-end: real 2-rank FSDP2 runs


def fsdp_config(tmp_path, data, training=None, launch=None, watch=None):
    return config(
        tmp_path,
        data,
        launch={"nproc_per_node": 2, **(launch or {})},
        training={"max_steps": 8, "save_steps": 100, **(training or {})},
        extra={"fsdp": {}, **({"watch": watch} if watch else {})},
    )


def said(proc) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_poisoned_row_is_named_on_its_rank_under_fsdp2_without_a_collective_rerun(tmp_path, tiny_data):
    """Every rank names its step's rows (file and line); the fp32 re-run that finds the culprit alone is not made
    under FSDP (as under ZeRO-3): each forward gathers weights collectively and the ranks would re-run unequal
    numbers of sequences, a hang. The verdict says so instead of guessing."""
    import json

    from transformers import AutoTokenizer

    data = tiny_data["messages"]
    proc = train(fsdp_config(tmp_path, data, training={"packing": False}), "--drill", "nan-row@3:1", "--no-rehearse")
    assert proc.returncode == NAN_EXIT, said(proc)
    run_dir = tmp_path / "out" / "drill-nan-row"
    [finding] = runtime_findings(run_dir)
    rows = finding["evidence"]["rows"]
    assert rows["verdict"] == "unknown" and rows["why"] == "FSDP gathers each layer's weights collectively", rows
    poisoned = json.loads((run_dir / "drill-row.json").read_text())["tokens"]
    tokenizer = AutoTokenizer.from_pretrained(data / "model")
    lines = (data / "data" / "train.jsonl").read_text().splitlines()

    def tokens(name):
        row = json.loads(lines[int(name.split(" = ")[0].split()[-1]) - 1])
        return list(tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)["input_ids"])[:128]

    named = {rank: rows["ranks"][rank]["micro_batches"][0]["rows"] for rank in ("0", "1")}
    assert all(name.startswith("train.jsonl line ") for names in named.values() for name in names), named
    assert any(tokens(name) == poisoned for name in named["1"]) and not any(tokens(n) == poisoned for n in named["0"])
    assert not list(run_dir.glob("checkpoint-*"))  # stopped before the poisoned step could be saved
    assert job_processes(run_dir) == []


def test_a_hang_under_fsdp2_names_the_rank_behind_and_fsdps_collective(tmp_path, tiny_data):
    cfg = fsdp_config(tmp_path, tiny_data["messages"], watch={"hang_timeout_s": 8})
    proc = train(cfg, "--drill", "hang@3:1", "--no-rehearse")
    assert proc.returncode == HANG_EXIT, said(proc)
    run_dir = tmp_path / "out" / "drill-hang"
    [finding] = runtime_findings(run_dir)
    assert finding["id"] == "nccl-timeout" and "behind: rank 1" in finding["title"]
    assert {p.name for p in (run_dir / "flight-recorder").iterdir()} == {"rank-0", "rank-1"}
    default = next(g for g in finding["evidence"]["flight_recorder"]["groups"] if g["group"] == "default_pg")
    assert list(default["inside"]) == ["0"] and list(default["absent"]) == ["1"], default
    # rank 0 waits in the all-gather FSDP2 issues to unshard the next layer, which rank 1 never entered
    assert "all_gather" in default["collective"] or "allgather" in default["collective"].lower(), default
    assert f"rank 1 never entered {default['collective']} #{default['seq']} on default_pg" in finding["title"]
    assert job_processes(run_dir) == []


def test_sigterm_under_fsdp2_saves_the_agreed_step_sharded_and_the_resume_finishes(tmp_path, tiny_data):
    cfg = fsdp_config(
        tmp_path,
        tiny_data["text"],
        launch={"stop_grace_s": 60},
        training={"packing": False, "max_steps": 30, "save_steps": 1000, "logging_steps": 1},
    )
    run_dir = tmp_path / "out"
    code, out, stop = stopped_by_sigterm(cfg, run_dir)
    assert code == 143, out[-3000:]
    assert complete(run_dir) == [f"checkpoint-{stop}"]
    shards = sorted(p.name for p in (run_dir / f"checkpoint-{stop}" / "pytorch_model_fsdp_0").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], shards
    resumed = train(cfg, "--resume", "--no-rehearse")
    assert resumed.returncode == 0, said(resumed)
    assert f"sftdoctor: resuming from {run_dir / f'checkpoint-{stop}'}" in resumed.stdout
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, 31)) and (run_dir / "final").is_dir()
