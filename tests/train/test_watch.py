"""The watchers on real runs: drills through `sftdoctor train`, a killed rank, an absurd learning rate."""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from conftest import install_plugin
from flight_dumps import claims_all
from hostile import no_hang
from trainrun import HANG_EXIT, NAN_EXIT, complete, config, job_processes, metrics, runtime_findings, start, train

from sftdoctor.train.watch import TRAINING_PHASE, arrived, attribute, behind, proc_state


def triage(proc):
    from sftdoctor.triage import diagnose

    return diagnose(io.BytesIO((proc.stdout + proc.stderr).encode()))


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_nan_drill_stops_every_rank_before_the_poisoned_step_is_saved(tmp_path, tiny_data, ranks):
    cfg = config(
        tmp_path, tiny_data["messages"], launch={"nproc_per_node": ranks}, training={"max_steps": 8, "save_steps": 2}
    )
    proc = train(cfg, "--drill", "nan-loss@5")
    assert proc.returncode == NAN_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "drill-nan-loss"  # a drill runs in a directory of its own
    [finding] = runtime_findings(run_dir)
    assert finding["id"] == "nan-loss" and finding["step"] == 5 and finding["severity"] == "error"
    assert "Re-running the batch" in finding["detail"] and "checkpoint-4" in finding["detail"]
    assert complete(run_dir) == ["checkpoint-2", "checkpoint-4"]
    assert not list(run_dir.glob("checkpoint-5*")) and not (run_dir / "final").exists()
    assert [m["step"] for m in metrics(run_dir)][-1] == 4
    assert f"rank(s) {', '.join(map(str, range(ranks)))}" in finding["detail"]
    # injected in the loss, not in the data: the step's micro-batches re-run in fp32 are finite, and their rows named
    assert finding["evidence"]["rows"]["verdict"] == "not-reproduced"  # the tiny run trains in fp32
    assert (
        all(
            mb["fp32"]["finite"] and len(mb["rows"]) == 4
            for t in finding["evidence"]["rows"]["ranks"].values()
            for mb in t["micro_batches"]
        )
        and len(finding["evidence"]["rows"]["ranks"]) == ranks
    )
    if ranks == 2:
        # torchrun's report of the ranks' exit code is in train.log; the terminal has sftdoctor's own line
        assert (run_dir / "train.log").read_text().count("exitcode  : 86") >= 1 and "exitcode  : 86" not in proc.stdout
    root = triage(proc).root.finding  # what `sftdoctor explain --log` makes of this run's console
    assert root.id == "nan-loss" and root.title.startswith("sftdoctor: non-finite loss at step 5: stopped")
    # a stopped run still gets its report, up to the step it reached, with the nan-loss marked at its step
    assert f"sftdoctor: report of the run up to step 4: {run_dir / 'report.html'} (5 panels)" in proc.stdout
    page = (run_dir / "report.html").read_text()
    assert "stopped by nan-loss at step 4" in page
    assert "<td>runtime</td><td>5</td><td class='error'>nan-loss</td><td>non-finite loss at step 5: stopped" in page


def rows_of(line_numbers, data_file):
    return [json.loads(data_file.read_text().splitlines()[n - 1]) for n in line_numbers]


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True])
def test_a_poisoned_row_is_traced_to_its_file_and_line_on_every_rank(tmp_path, tiny_data, packing):
    from transformers import AutoTokenizer

    data = tiny_data["messages"]
    cfg = config(
        tmp_path, data, launch={"nproc_per_node": 2}, training={"max_steps": 8, "save_steps": 2, "packing": packing}
    )
    proc = train(cfg, "--drill", "nan-row@3:1")
    assert proc.returncode == NAN_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "drill-nan-row"
    [finding] = runtime_findings(run_dir)
    rows = finding["evidence"]["rows"]
    assert rows["verdict"] == "rows" and rows["again"] == ["rank 1 micro-batch 1"]
    [culprit] = rows["culprits"]
    assert f"traced to {culprit}" in finding["title"] and "not numerics" in finding["detail"]
    assert "read the rows named" in finding["fix"]
    # on its own: the drill's tokens are that line's row as the chat template renders it, and no other row of the batch
    poisoned = json.loads((run_dir / "drill-row.json").read_text())["tokens"]
    tokenizer = AutoTokenizer.from_pretrained(data / "model")
    train_file = data / "data" / "train.jsonl"

    def tokens(line):
        [row] = rows_of([line], train_file)
        return list(tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)["input_ids"])[:128]

    assert culprit.startswith("train.jsonl line ") and tokens(int(culprit.split()[-1])) == poisoned
    for rank in ("0", "1"):  # every rank's rows named, every one a line whose tokens are not the poisoned ones
        [mb] = rows["ranks"][rank]["micro_batches"]
        assert mb["rows"] and all(r.startswith("train.jsonl line ") for name in mb["rows"] for r in name.split(" = "))
        lines = [int(name.split(" = ")[0].split()[-1]) for name in mb["rows"]]
        assert (rank == "1") == (int(culprit.split()[-1]) in lines)
        assert mb["fp32"]["finite"] is (rank == "0")
    assert len(rows["ranks"]["0"]["micro_batches"][0]["rows"]) == 4 or packing  # per_device_batch_size 4


@pytest.mark.slow
def test_a_row_whose_token_has_a_broken_embedding_is_traced_to_its_line(tmp_path, tiny_data):
    """The public case (unslothai/unsloth#1056): rows holding a token whose embedding row was never trained make
    the loss NaN. Here a checkpoint whose row for one token is garbage (inf, as uninitialised memory can read), and
    one training row, appended last, that uses that token. The gate refuses that checkpoint before launch; forced
    past it, the watcher names the row."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    data = tiny_data["messages"]
    tokenizer = AutoTokenizer.from_pretrained(data / "model")
    lines = (data / "data" / "train.jsonl").read_text().splitlines()

    def ids(messages):
        return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]

    used = {t for line in lines for t in ids(json.loads(line)["messages"])}
    for token in range(len(tokenizer)):
        word = tokenizer.decode([token]).strip()
        row = {"messages": [{"role": "user", "content": f"say: {word}"}, {"role": "assistant", "content": word}]}
        if token not in used and word.isalpha() and token in ids(row["messages"]):
            break
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(lines + [json.dumps(row)]) + "\n")
    torch.manual_seed(0)
    untied = AutoConfig.from_pretrained(data / "model", tie_word_embeddings=False)  # tied, every logit would be huge
    model = AutoModelForCausalLM.from_config(untied)
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = float("inf")
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    cfg = config(tmp_path, data, training={"max_steps": 45, "save_steps": 100, "learning_rate": 1e-4})
    cfg.write_text(
        cfg.read_text()
        .replace(str(data / "data" / "train.jsonl"), str(folder / "train.jsonl"))
        .replace(f'path = "{data / "model"}"\nweights = "random"', f'path = "{folder / "model"}"')
    )
    refused = train(cfg, "--dry-run")  # the gate reads the row first (untrained-tokens): the run never starts
    assert refused.returncode == 1 and "holds NaN/inf: the checkpoint is broken" in refused.stdout, refused.stdout[
        -3000:
    ]
    proc = train(cfg, "--force")  # forced past the gate, the watcher traces the NaN to the row
    assert proc.returncode == NAN_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]
    [finding] = runtime_findings(tmp_path / "out")
    assert finding["evidence"]["rows"]["culprits"] == [f"train.jsonl line {len(lines) + 1}"], finding["detail"]
    assert f"traced to train.jsonl line {len(lines) + 1}" in finding["title"]


@pytest.mark.slow
def test_skip_policy_drops_the_update_and_finishes(tmp_path, tiny_data):
    cfg = config(
        tmp_path,
        tiny_data["text"],
        training={"max_steps": 6, "save_steps": 3},
        extra={"watch": {"on_nan": "skip", "max_skips": 2}},
    )
    proc = train(cfg, "--drill", "nan-loss@3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [finding] = runtime_findings(tmp_path / "out" / "drill-nan-loss")
    assert finding["step"] == 3 and "update skipped (1 of at most 2)" in finding["title"]
    steps = metrics(tmp_path / "out" / "drill-nan-loss")
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6] and all(m["loss"] == m["loss"] for m in steps[3:])
    assert (tmp_path / "out" / "drill-nan-loss" / "final").is_dir()


def drill_config(tmp_path, tiny_data):
    """Two ranks of the chat data for 8 steps, no checkpoint due, the watchdog's timeout 8 s: for a drill that
    stalls a rank."""
    return config(
        tmp_path,
        tiny_data["messages"],
        launch={"nproc_per_node": 2},
        training={"max_steps": 8, "save_steps": 100},
        extra={"watch": {"hang_timeout_s": 8}},
    )


@pytest.mark.slow
def test_hang_drill_names_the_rank_behind_and_leaves_no_process(tmp_path, tiny_data):
    cfg = drill_config(tmp_path, tiny_data)
    began = time.monotonic()
    proc = train(cfg, "--drill", "hang@3:1")
    took = time.monotonic() - began
    assert proc.returncode == HANG_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "drill-hang"
    [finding] = runtime_findings(run_dir)
    assert finding["id"] == "nccl-timeout" and "behind: rank 1" in finding["title"]
    assert "rank 1: step 3, drill" in finding["detail"]
    assert {p.name for p in (run_dir / "stacks").iterdir()} == {"rank-0.txt", "rank-1.txt"}
    assert "all_reduce" in (run_dir / "stacks" / "rank-1.txt").read_text()
    assert took < 90  # start-up + 2 steps + 8 s + the report, not NCCL's or gloo's 30 minutes
    assert job_processes(run_dir) == []
    root = triage(proc).root.finding
    assert root.id == "nccl-timeout" and "behind: rank 1" in root.title
    # the flight recorder, read by torch's analyzer: rank 1 stayed out of the step's first collective (DDP's
    # buffer broadcast before the forward), which rank 0 is in
    assert {p.name for p in (run_dir / "flight-recorder").iterdir()} == {"rank-0", "rank-1"}
    fr = finding["evidence"]["flight_recorder"]
    default = next(g for g in fr["groups"] if g["group"] == "default_pg")
    assert list(default["inside"]) == ["0"] and list(default["absent"]) == ["1"] and not default["other"]
    assert default["absent"]["1"]["seq"] == default["seq"] - 1  # its last one: the step before's
    assert f"rank 1 never entered {default['collective']} #{default['seq']} on default_pg" in finding["title"]
    # and rank 1 is inside an all_reduce of a group of its own, which rank 0 never entered
    drill = next(g for g in fr["groups"] if g["group"] != "default_pg")
    assert (
        list(drill["inside"]) == ["1"]
        and list(drill["absent"]) == ["0"]
        and "on_step_begin" in drill["inside"]["1"]["where"]
    )


@pytest.mark.slow
def test_desync_drill_names_the_rank_that_called_another_collective(tmp_path, tiny_data):
    cfg = drill_config(tmp_path, tiny_data)
    proc = train(cfg, "--drill", "desync@3:1")
    assert proc.returncode == HANG_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "drill-desync"
    [finding] = runtime_findings(run_dir)
    [group] = finding["evidence"]["flight_recorder"]["groups"]
    assert group["group"] == "default_pg" and list(group["other"]) == ["1"] and not group["absent"]
    assert group["other"]["1"]["collective"] == "broadcast" and group["other"]["1"]["sizes"] == [[2**20]]
    # rank 0 went on with the step: at that sequence number it called something else (DDP's buffer broadcast)
    mine = group["inside"]["0"]
    assert mine["seq"] == group["seq"] == group["other"]["1"]["seq"] and mine["sizes"] != [[2**20]]
    assert (
        f"rank 1 called broadcast #{group['seq']} on default_pg [[1048576]] Float where rank 0 called"
        in finding["title"]
    )
    assert "on_step_begin" in group["other"]["1"]["where"] and "watch.py" in finding["detail"]
    assert job_processes(run_dir) == []


def kill_rank_1_after_first_checkpoint(cfg, run_dir):
    """Start the run, SIGKILL rank 1 once checkpoint-4 is complete, and return (exit code, output)."""
    launcher = start("train", cfg, "--no-rehearse", stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (run_dir / "checkpoint-4" / "sftdoctor-complete").exists():
        time.sleep(0.1)
    victims = [
        p
        for p in psutil.Process(launcher.pid).children(recursive=True)
        if "sftdoctor.train.sft" in " ".join(p.cmdline()) and p.environ().get("RANK") == "1"
    ]
    assert victims, "no rank-1 worker found"
    victims[0].kill()
    try:
        out, _ = launcher.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        for proc in psutil.Process(launcher.pid).children(recursive=True) + [psutil.Process(launcher.pid)]:
            proc.kill()
        out, _ = launcher.communicate()
        return None, out
    return launcher.returncode, out


@pytest.mark.slow
def test_slow_drill_names_the_straggler_with_its_host_and_device_and_the_run_goes_on(tmp_path, tiny_data):
    """Rank 1's forward pass slowed from step 2: named once, as a warning, with its host and "CPU"; rank 0, which
    waits for it in every all-reduce, is not; the run ends well."""
    cfg = drill_config(tmp_path, tiny_data)
    proc = train(cfg, "--drill", "slow@2:1", "--no-rehearse")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "drill-slow"
    [finding] = runtime_findings(run_dir)
    host = socket.gethostname()
    assert finding["id"] == "straggler/forward" and finding["severity"] == "warning"
    assert finding["title"].startswith(f"straggler: rank 1 ({host}, CPU) takes ")
    assert finding["evidence"]["rank"] == 1 and finding["evidence"]["steps"][0] == 2
    assert f"straggler: rank 1 ({host}, CPU)" in proc.stdout and "sftdoctor explain straggler" in proc.stdout
    # each rank's own seconds per step in metrics.jsonl: the drilled rank's forward far above the other's
    drilled = [m for m in metrics(run_dir) if m["step"] >= 2]
    assert all(m["rank_forward_s"][1] >= 0.5 > 5 * m["rank_forward_s"][0] for m in drilled), drilled
    assert all(None not in m["rank_data_s"] for m in drilled)
    assert (run_dir / "final").is_dir()


@pytest.mark.slow
def test_a_killed_rank_is_restarted_and_the_run_resumes(tmp_path, tiny_data):
    """SIGKILL rank 1 after the first checkpoint: torchrun restarts the group (each round on a store of its
    own, see launch.worker_env) and training resumes from the newest complete checkpoint. No retry."""
    cfg = config(
        tmp_path,
        tiny_data["text"],
        launch={"nproc_per_node": 2, "max_restarts": 3},
        training={"max_steps": 12, "save_steps": 4},
    )
    code, out = kill_rank_1_after_first_checkpoint(cfg, tmp_path / "out")
    assert code == 0, out[-4000:]
    run_dir = tmp_path / "out"
    assert "resuming from" in out and (run_dir / "final").is_dir()
    assert "connectFullMesh" not in (run_dir / "train.log").read_text()
    assert complete(run_dir)[-1] == "checkpoint-12"
    assert job_processes(run_dir) == []


@pytest.mark.slow
def test_an_absurd_learning_rate_is_caught_without_a_drill(tmp_path, tiny_data):
    cfg = config(
        tmp_path,
        tiny_data["messages"],
        training={"learning_rate": 1.0, "warmup_steps": 0, "max_steps": 10, "save_steps": 100, "max_grad_norm": 0.0},
    )
    proc = train(cfg)
    findings = runtime_findings(tmp_path / "out")
    assert {f["id"].split("/")[0] for f in findings} & {"loss-spike", "nan-loss"}, proc.stdout[-3000:]
    assert "sftdoctor explain loss-spike" in proc.stdout or "sftdoctor explain nan-loss" in proc.stdout


def report(step, phase=TRAINING_PHASE, where="graph.py:829 _engine_run_backward"):
    return {"step": step, "phase": phase, "stalled_s": 300.0, "where": where}


def tiny_model():
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from sftdoctor.facts.packing_probe import shrink

    config = Qwen2Config()
    shrink(config)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def test_the_rank_behind_a_hang():
    assert behind({0: report(7), 2: report(7), 3: report(7)}, 4) == [1]  # never reported: dead or frozen
    assert behind({0: report(7), 1: report(6), 2: report(7)}, 3) == [1]  # still on an earlier step
    assert behind({0: report(7), 1: report(7, "drill: blocked")}, 2) == [1]  # a different phase breaks a tie
    assert behind({0: report(7), 1: report(7, where="dataset.py:12 __getitem__"), 2: report(7)}, 3) == [1]
    assert behind({0: report(7), 1: report(7)}, 2) == []  # nothing tells them apart


def test_attribution_names_the_first_module_that_went_non_finite():
    import torch

    model = tiny_model()
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "labels": torch.tensor([[5, 6, 7, 8]])}
    assert "every module's output and the loss were finite" in attribute(model, inputs)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("inf")
    said = attribute(model, inputs)
    assert "model.layers.1.mlp.up_proj (Linear)" in said
    assert "Weights already non-finite: model.layers.1.mlp.up_proj.weight" in said


RUNTIME_PLUGIN = """
from sftdoctor.checks import check
from sftdoctor.findings import warning

@check("site-loss-log", "a third-party runtime check", phase="runtime")
def site_loss_log(log_stats):
    return warning(f"plugin saw the loss at step {log_stats['step']}")
"""


@pytest.mark.slow
def test_a_third_party_runtime_check_runs_during_training(tmp_path, tiny_data):
    site = tmp_path / "site"
    site.mkdir()
    env = install_plugin(site, RUNTIME_PLUGIN)
    for folder, switch in (("on", {}), ("off", {"SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})):
        (tmp_path / folder).mkdir()
        cfg = config(
            tmp_path / folder, tiny_data["text"], training={"packing": False, "max_steps": 2, "logging_steps": 1}
        )
        proc = subprocess.run(
            [sys.executable, "-m", "sftdoctor", "train", str(cfg)],
            capture_output=True,
            text=True,
            env={**env, **switch},
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        seen = [r["step"] for r in runtime_findings(tmp_path / folder / "out") if r["id"] == "site-loss-log"]
        assert seen == ([1, 2] if folder == "on" else []), folder
        assert ("plugin saw the loss at step 2" in proc.stdout) is (folder == "on")


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_every_rank_and_says_how_to_resume(tmp_path, tiny_data, sig, code):
    cfg = config(
        tmp_path,
        tiny_data["text"],
        launch={"nproc_per_node": 2},
        training={"packing": False, "max_steps": 400, "save_steps": 2, "logging_steps": 1},
    )
    run_dir = tmp_path / "out"
    launcher = start("train", cfg, "--no-rehearse")
    deadline = time.monotonic() + 240
    while not complete(run_dir) and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert complete(run_dir), launcher.communicate()[0][-3000:] if launcher.poll() is not None else "no checkpoint"
    sent = time.monotonic()
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == code, out[-2000:] + err[-2000:]
    assert time.monotonic() - sent < 30
    assert not job_processes(run_dir)  # no rank left training, no torchrun
    last = [line for line in out.splitlines() if line.startswith("sftdoctor: stopped by")]
    assert last and f"resume with: sftdoctor train {cfg} --resume" in last[0] and "checkpoint-" in last[0]
    # the one line, and none of what the two ranks and torchrun print as they stop (train.log keeps that)
    assert out.rstrip().splitlines()[-1] == last[0]
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err and "death signal" not in out + err
    newest = complete(run_dir)[-1]
    assert (run_dir / newest / "trainer_state.json").is_file()  # intact: marked complete only when whole
    assert not (run_dir / "final").exists()


def test_the_watchers_pass_only_runtime_facts_of_the_catalogue():
    """A misspelt name would leave the checks that ask for the real one waiting for ever."""
    from sftdoctor.train.watch import RuntimeFacts

    assert RuntimeFacts({"step_stats": {"step": 1}}).known("step_stats")
    with pytest.raises(ValueError, match=r"not runtime facts of the catalogue: \['step_stat'\]"):
        RuntimeFacts({"step_stat": {"step": 1}})


# ---------------------------------------------------------------- a rank really frozen (SIGSTOP), not a drill
# As a stuck NFS read, a D-state process or a wedged GPU freezes it: the watchdog names it as the rank that sent
# nothing, says nothing of collectives it may not have entered, and the run leaves no process behind (a stopped
# process ignores SIGTERM until continued; SIGKILL ends it).


def freeze_a_rank_after_two_steps(cfg, run_dir, rank):
    """Start the run, SIGSTOP `rank` once two steps are logged; (exit code, output, seconds from the freeze to the
    end, the frozen process)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "sftdoctor", "train", str(cfg), "--no-rehearse"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # 2 ranks' reports swap in milliseconds: a frozen store is given 5 s beyond the swap's deadline, not 30
        env={**os.environ, "SFTDOCTOR_SWAP_MARGIN_S": "5"},
    )
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and launcher.poll() is None:
            if (run_dir / "metrics.jsonl").is_file() and len(metrics(run_dir)) >= 2:
                break
            time.sleep(0.2)
        victims = [
            p
            for p in psutil.Process(launcher.pid).children(recursive=True)
            if "sftdoctor.train.sft" in " ".join(p.cmdline()) and p.environ().get("RANK") == str(rank)
        ]
        assert victims, f"no rank-{rank} worker found"
        os.kill(victims[0].pid, signal.SIGSTOP)
        frozen = time.monotonic()
        out, _ = launcher.communicate(timeout=180)
        return launcher.returncode, out, time.monotonic() - frozen, victims[0]
    finally:
        if launcher.poll() is None:  # SIGKILL ends a stopped process too
            for proc in [*psutil.Process(launcher.pid).children(recursive=True), psutil.Process(launcher.pid)]:
                proc.kill()
            launcher.communicate()


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 0])  # 0 also serves the ranks' store: the other reports alone
def test_a_frozen_rank_is_named_as_the_rank_that_sent_nothing(tmp_path, tiny_data, rank):
    cfg = config(
        tmp_path,
        tiny_data["messages"],
        launch={"nproc_per_node": 2, "stop_grace_s": 5},
        training={"max_steps": 400, "save_steps": 1000},
        extra={"watch": {"hang_timeout_s": 8}},
    )
    run_dir, other = tmp_path / "out", 1 - rank
    code, out, took, frozen = freeze_a_rank_after_two_steps(cfg, run_dir, rank)
    assert code == HANG_EXIT, out[-4000:]
    # 8 s, the report, torchrun's 5 s for the frozen rank, then SIGKILL (rank 0: the store's silence, 11.6 s more)
    assert took < (60 if rank else 75)
    [finding] = runtime_findings(run_dir)
    title, detail = finding["title"], finding["detail"]
    assert title.startswith(
        f"hang: no progress for 8 s; behind: rank {rank} (sent nothing: no report, no stacks, no dump"
    )
    if rank:  # its state, read from /proc by rank 0 (the pid came through the store)
        assert f"; process {frozen.pid} on " in title and ": T (stopped (SIGSTOP))" in title
        assert f"kill -CONT {frozen.pid}" in finding["fix"]
    else:
        assert "The ranks' store (TCP, served from rank 0's process) did not answer either" in detail
    assert "cat /proc/PID/stack" in finding["fix"] and "ps -o stat=" in finding["fix"] and "dmesg" in finding["fix"]
    assert not claims_all(title + detail), detail
    # per rank, what arrived: the other rank's report, stacks and dump; nothing from the frozen one
    arrived = finding["evidence"]["arrived"]
    assert arrived[str(other)]["report"] and arrived[str(other)]["stacks"].endswith(f"stacks/rank-{other}.txt")
    assert arrived[str(other)]["dump"].endswith(f"flight-recorder/rank-{other}")
    assert [arrived[str(rank)][what] for what in ("report", "stacks", "dump")] == [False, None, None]
    assert detail.startswith(f"Rank {rank} sent nothing: its process is unresponsive")
    assert f"rank {other}: step " in detail and f"stacks {run_dir / 'stacks' / f'rank-{other}.txt'}" in detail
    assert f"rank {rank}: nothing (no report, no stacks, no dump)" in detail
    assert f"Flight recorder (rank {other} of 2, " in detail
    assert f"Rank {rank} sent no dump: nothing is known of rank {rank}" in detail
    assert {p.name for p in (run_dir / "stacks").iterdir()} == {f"rank-{other}.txt"}
    assert {p.name for p in (run_dir / "flight-recorder").iterdir()} == {f"rank-{other}"}
    # nothing of the run is left, the frozen rank included
    assert not psutil.pid_exists(frozen.pid) or frozen.status() == psutil.STATUS_ZOMBIE
    assert job_processes(run_dir) == []
    # the triage of the output, and of the log with the dump beside it, gives the same root
    from sftdoctor.triage import diagnose

    root = diagnose(io.BytesIO(out.encode())).root.finding
    assert root.id == "nccl-timeout" and f"behind: rank {rank} (sent nothing" in root.title
    explained = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "explain", "--log", str(run_dir / "train.log")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert explained.returncode == 1 and "root cause: nccl-timeout" in explained.stdout, explained.stdout
    assert f"behind: rank {rank} (sent nothing" in explained.stdout
    assert f"rank {rank} sent no dump" in explained.stdout
    assert not claims_all(explained.stdout), explained.stdout


def test_the_watchdog_lists_what_arrived_from_each_rank(tmp_path):
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "rank-0.txt").write_text("Thread 0x1")
    (tmp_path / "flight-recorder").mkdir()
    (tmp_path / "flight-recorder" / "rank-0").write_bytes(b"\x80")
    said = arrived(tmp_path, 2, {0: {"step": 3}})
    assert said == {
        "0": {
            "report": True,
            "stacks": str(tmp_path / "stacks" / "rank-0.txt"),
            "dump": str(tmp_path / "flight-recorder" / "rank-0"),
        },
        "1": {"report": False, "stacks": None, "dump": None, "process": None},
    }


def test_a_process_state_is_read_from_proc():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(50):
            if proc_state(child.pid)["state"].startswith("T"):
                break
            time.sleep(0.05)
        assert proc_state(child.pid)["state"] == "T (stopped (SIGSTOP))"
    finally:
        child.kill()
        child.wait()
    assert proc_state(child.pid) == {"state": "gone (no such process on this host)"}


@pytest.mark.slow
def test_a_frozen_store_host_does_not_hold_the_watchdog(tmp_path, monkeypatch):
    """The c10d store is served from rank 0's process: frozen, every store read waits for ever (torch 2.13's
    set_timeout does not bound a reply). The watchdog then reports alone, the store taken as gone."""
    import datetime
    import socket

    import torch.distributed as dist

    from sftdoctor.train import watch

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import datetime, time, torch.distributed as d; "
            f"s = d.TCPStore('127.0.0.1', {port}, 2, True, timeout=datetime.timedelta(seconds=60), "
            "wait_for_workers=False); "
            "print('up', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "up"
        store = dist.PrefixStore(
            "default_pg", dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
        )
        os.kill(server.pid, signal.SIGSTOP)
        monkeypatch.setattr(watch, "SWAP_MARGIN_S", 0.0)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "1")
        dog = watch.HangWatchdog(1.0, reporter=None, run_dir=tmp_path)
        (tmp_path / "stacks").mkdir()
        (tmp_path / "stacks" / "rank-1.txt").write_text("Thread 0x1")
        began = time.monotonic()
        reports = {1: {"step": 3}}
        with no_hang(60):
            assert dog._swap_bounded(store, reports, None) == (True, None)
        assert time.monotonic() - began < 2 * dog.poll + 5 + 3 and reports == {1: {"step": 3}}
    finally:
        server.kill()
        server.wait()
