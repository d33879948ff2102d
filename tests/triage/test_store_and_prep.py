"""Two readings of the other ranks' failure while they wait for rank 0 (issue 39, classes 13 and 14):

- store-lost: rank 0 (the TCPStore's host) died, and they lost its store: rank 0's death is the cause, and what
  the log shows of why it died is the root cause;
- nccl-timeout, read as data-prep-timeout: rank 0 was alive but still preparing the data when their wait (a
  barrier, a store get) ran out at start-up.

On the real public logs of the corpus (index.json cites each), pasted plain, as a markdown quote, wrapped at 80
columns and both, and on torch 2.13's own words recorded from a real two-process run."""

import io
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES
from triage.helpers import LOGS, by_file, diagnosis_of, everything, log_bytes, problems, quoted, wrapped

from sftdoctor.findings import Severity
from sftdoctor.triage import diagnose

MINE = [
    e
    for e in LOGS
    if e["file"].startswith(("dist-store-lost-", "dist-data-prep-timeout-"))
    and e["expect"] in (["store-lost"], ["nccl-timeout"])
]
# store lines that are not the cause: a log with no failure, and a job torn down after another rank failed
QUIET = [e for e in LOGS if e["file"].startswith("dist-store-lost-") and e not in MINE]
RANK0_RAISES = (FIXTURES / "train" / "rank0-raises-others-lose-store-2ranks.log").read_bytes()


def pasted(data: bytes, form: str) -> bytes:
    text = data.decode()
    return {
        "plain": text,
        "quoted": quoted(text),
        "wrapped": wrapped(text),
        "quoted+wrapped": quoted(wrapped(text, 78)),
    }[form].encode()


def test_each_class_has_three_real_logs_from_three_projects():
    for prefix in ("dist-store-lost-", "dist-data-prep-timeout-"):
        mine = [e for e in MINE if e["file"].startswith(prefix)]
        assert len(mine) >= 3 and len({e["project"] for e in mine}) >= 3


@pytest.mark.parametrize("form", ["plain", "quoted", "wrapped", "quoted+wrapped"])
@pytest.mark.parametrize("entry", MINE, ids=by_file(MINE))
def test_each_real_log_names_its_cause_however_it_was_pasted(entry, form):
    diagnosis = diagnose(io.BytesIO(pasted(log_bytes(entry["file"]), form)))
    found = problems(diagnosis)
    assert sorted(found) == entry["expect"], form
    [topic] = entry["expect"]
    assert diagnosis.root.finding.id == topic
    if topic == "store-lost":
        assert found[topic]["dead_rank"] == 0 and "rank 0 died first" in diagnosis.root.finding.title
        assert "not a network fault" in diagnosis.root.finding.detail
    else:  # rank 0 was busy, not dead: the finding names what it was doing
        assert diagnosis.root.finding.explain == "data-prep-timeout"
        assert found[topic]["data_prep"] == entry["evidence"][topic]["data_prep"]
        assert "ddp_timeout" in diagnosis.root.finding.fix


@pytest.mark.parametrize("form", ["plain", "quoted", "wrapped", "quoted+wrapped"])
@pytest.mark.parametrize("entry", QUIET, ids=by_file(QUIET))
def test_store_lines_that_are_not_the_cause_are_info_only_however_they_were_pasted(entry, form):
    diagnosis = diagnose(io.BytesIO(pasted(log_bytes(entry["file"]), form)))
    assert sorted(problems(diagnosis)) == entry["expect"], form
    [lost] = [loc.finding for loc in diagnosis.findings if loc.finding.id == "store-lost"]
    assert lost.severity is Severity.INFO and "rank 0 died" not in lost.title


def test_two_real_logs_of_store_lines_that_are_not_the_cause():
    assert len(QUIET) >= 2 and len({e["project"] for e in QUIET}) >= 2


def test_the_data_prep_title_says_who_waited_how_long_and_how_far_rank_0_had_got():
    root = diagnosis_of("dist-data-prep-timeout-watchdog-allreduce-numel1-running-tokenizer-llamafactory.log").root
    assert root.finding.title == (
        "ranks 1-3 gave up after 1800 s waiting for rank 0, which was still preparing the data (Running tokenizer on "
        "dataset: 280000/2969526 rows (9%) after 29:55): the process-group timeout is shorter than the data "
        "preparation"
    )


def test_rank_0s_own_exception_is_the_root_cause_when_nothing_else_names_it():
    """torch 2.13's words, recorded from a real run: rank 0 raises, rank 1's store call finds the store gone."""
    diagnosis = diagnose(io.BytesIO(RANK0_RAISES))
    root = diagnosis.root.finding
    assert root.id == "store-lost" and diagnosis.root.role == "root"
    assert root.title == (
        "rank 1 lost rank 0's TCPStore (Failed to recv, got 0 bytes): rank 0 died first: ValueError: "
        "rank 0 fails while preparing its data"
    )
    assert root.evidence["rank"] == 0 and root.evidence["line"] == 4  # where rank 0's exception is
    assert root.evidence["store"] == "[::ffff:127.0.0.1]:29734"
    assert [loc.finding.id for loc in diagnosis.findings] == ["store-lost"]


def test_an_oom_on_rank_0_is_the_root_cause_and_the_lost_store_its_symptom():
    oom = (
        b"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        b"capacity of 79.15 GiB of which 1.05 GiB is free.\n"
    )
    log = oom + log_bytes("dist-store-lost-nccl-unique-id-reset-rank1-tcpstore-frames-arctictraining.log")
    diagnosis = diagnose(io.BytesIO(log))
    assert [(loc.finding.id, loc.role) for loc in diagnosis.findings] == [
        ("cuda-oom", "root"),
        ("store-lost", "symptom"),
    ]
    lost = diagnosis.findings[1].finding
    assert "rank 0 died first: torch.OutOfMemoryError: CUDA out of memory" in lost.title
    assert lost.detail.startswith("after the cuda-oom at line 1, probably its consequence")


def test_rank_0_killed_by_the_host_is_the_root_cause_from_torchruns_failure_block():
    block = b"".join(
        line.encode() + b"\n"
        for line in (
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            "Root Cause (first observed failure):",
            "[0]:",
            "  time      : 2026-12-06_06:01:51",
            "  host      : node0",
            "  rank      : 0 (local_rank: 0)",
            "  exitcode  : -9 (pid: 22878)",
            "  error_file: <N/A>",
            "  traceback : Signal 9 (SIGKILL) received by PID 22878",
        )
    )
    log = log_bytes("dist-store-lost-nccl-unique-id-reset-multinode-allreduce-pytorch.log") + block
    diagnosis = diagnose(io.BytesIO(log))
    assert diagnosis.root.finding.id == "host-oom" and "rank 0 was killed with SIGKILL" in diagnosis.root.finding.title
    lost = next(loc for loc in diagnosis.findings if loc.finding.id == "store-lost")
    assert lost.role == "symptom"
    assert "rank 0 died first: the launcher saw it exit with exitcode -9 (SIGKILL)" in lost.finding.title


def test_the_heartbeats_warnings_at_the_end_of_a_healthy_run_are_info_only():
    """torch 2.4-2.13's heartbeat monitor polls rank 0's store; rank 0 exiting first makes the others print this."""
    log = (
        b"{'train_runtime': 120.5, 'train_loss': 1.234, 'epoch': 3.0}\n"
        b"[rank1]:[W1206 06:02:34.496713522 ProcessGroupNCCL.cpp:1771] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        b'Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too early), '
        b"with error: Connection reset by peer\n"
        b"[rank1]:[W1206 06:02:34.496713522 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=76, "
        b"addr=[localhost]:60902, remote=[localhost]:29500): Connection reset by peer\n"
    )
    diagnosis = diagnose(io.BytesIO(log))
    assert not diagnosis.problems
    [note] = diagnosis.findings
    assert note.finding.severity is Severity.INFO and note.finding.id == "store-lost"
    assert "this log shows no failure" in note.finding.title


def test_a_progress_bar_does_not_turn_a_mid_run_timeout_into_a_data_preparation_one():
    """SeqNum 2415 is far into training: an eval set's map bar printed before it says nothing of the hang."""
    bar = "Map: 100%|██████████| 500/500 [00:01<00:00, 400.00 examples/s]\n".encode()
    watchdog = (
        b"[rank1]:[E1206 06:01:51.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
        b"operation timeout: WorkNCCL(SeqNum=2415, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, "
        b"Timeout(ms)=1800000) ran for 1800058 milliseconds before timing out.\n"
    )
    root = diagnose(io.BytesIO(bar + watchdog)).root.finding
    assert root.title == "NCCL collective timed out: ALLREDUCE SeqNum=2415 after 1800 s on rank 1"
    assert root.explain == "nccl-timeout"


def test_a_store_wait_at_start_up_without_a_bar_still_says_rank_0_was_busy_not_dead():
    log = (
        b"[rank2]: torch.distributed.DistBackendError: [2] is setting up NCCL communicator and retrieving "
        b"ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
        b"Socket Timeout\n"
    )
    diagnosis = diagnose(io.BytesIO(log))
    assert list(problems(diagnosis)) == ["nccl-timeout"]
    assert diagnosis.root.finding.title.startswith(
        "rank 2 gave up waiting for rank 0 to reach its first collective "
        "(ncclUniqueId get from rank 0): rank 0 was still busy"
    )


@pytest.mark.parametrize(
    "path",
    [
        FIXTURES / "logs" / "dist-data-prep-timeout-waitforinput-tokenizing-prompts-axolotl.log",
        FIXTURES / "train" / "rank0-raises-others-lose-store-2ranks.log",
    ],
    ids=lambda p: p.name,
)
def test_a_log_cut_into_many_small_ranges_is_read_as_in_one_pass(path):
    """The bar before the timeout and rank 0's exception before the lost store travel across ranges of 97 bytes."""
    with open(path, "rb") as handle:
        alone = diagnose(handle, path.name)
    with open(path, "rb") as handle:
        split = diagnose(handle, path.name, jobs=2, range_size=97)
    assert everything(split) == everything(alone)


@pytest.mark.slow
def test_a_real_rank_0_that_raises_leaves_the_others_a_lost_store_that_names_rank_0s_exception(tmp_path):
    """Two processes on torch 2.13 (gloo, env://: rank 0 hosts the store, as under the deepspeed launcher)."""
    script = tmp_path / "rank0dies.py"
    script.write_text(
        "import time\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
        "if dist.get_rank() == 0:\n    time.sleep(1.0)\n    raise ValueError('rank 0 fails here')\n"
        "dist.distributed_c10d._get_default_store().get('0')\n"
    )
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29700 + os.getpid() % 200),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in (0, 1)
    ]
    log = b"".join(proc.communicate(timeout=120)[0] for proc in procs)
    assert [proc.returncode for proc in procs] == [1, 1]
    root = diagnose(io.BytesIO(log)).root
    assert root.finding.id == "store-lost" and root.role == "root"
    assert root.finding.title.endswith("rank 0 died first: ValueError: rank 0 fails here")


def test_store_warnings_in_a_job_that_failed_elsewhere_are_a_symptom_not_rank_0s_death():
    """Rank 3's OOM: torchrun tears the job down, and the heartbeat of the others then finds the store gone."""
    oom = (
        b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
        b"capacity of 79.15 GiB of which 1.05 GiB is free.\n"
    )
    heartbeat = (
        b"[rank1]:[W1206 06:02:34.496713522 ProcessGroupNCCL.cpp:1771] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        b'Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too '
        b"early), with error: Broken pipe\n"
        b"[rank1]:[W1206 06:02:34.496713522 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=67, "
        b"addr=[localhost]:36214, remote=[localhost]:43145): Broken pipe\n"
    )
    for log in (oom + heartbeat, heartbeat + oom):
        diagnosis = diagnose(io.BytesIO(log))
        assert diagnosis.root.finding.id == "cuda-oom"
        lost = next(loc for loc in diagnosis.findings if loc.finding.id == "store-lost")
        assert lost.role == "context" and lost.finding.severity is Severity.INFO
        assert "rank 0 died" not in lost.finding.title
