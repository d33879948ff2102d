"""What the terminal shows of the workers' output, and what train.log keeps."""

import io
from pathlib import Path

import pytest

from sftdoctor.train.console import Console

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "train" / "torchrun-ds-batch-mismatch-2ranks.log"


def shown(data: bytes, piece: int = 1 << 20) -> tuple[str, bytes]:
    log, terminal = io.BytesIO(), io.BytesIO()
    console = Console(log, terminal)
    for start in range(0, len(data), piece):
        console.feed(data[start : start + piece])
    console.close()
    return terminal.getvalue().decode(), log.getvalue()


@pytest.mark.parametrize("piece", [1, 7, 700, 1 << 20])
def test_a_two_rank_crash_shows_each_traceback_once_prefixed_and_not_torchruns_report(piece):
    data = RECORDED.read_bytes()
    terminal, log = shown(data, piece)
    assert log == data  # the log keeps every byte, however the output arrived
    assert "[rank0]: [rank0]:" not in terminal and "[rank1]: [rank1]:" not in terminal
    assert terminal.count("[rank0]: ValueError: Please correct the following DeepSpeed config values") == 1
    assert terminal.count("[rank1]: - ds train_batch_size=999 vs hf train_batch_size (calculated)=8") == 1
    # torchrun's own traceback and ChildFailedError report restate the failure: one line of it stays
    assert "ChildFailedError" not in terminal and "Root Cause" not in terminal and "launch_agent" not in terminal
    assert terminal.rstrip().splitlines()[-1].endswith("(torchrun's traceback and report: in train.log)")
    assert "failed (exitcode: 1) local_rank: 0" in terminal.rstrip().splitlines()[-1]
    # the distributed check's table and DeepSpeed's CPU notice are the ranks' own output: still shown
    assert "collective-correctness" in terminal


def test_a_progress_bar_redrawn_with_carriage_returns_passes_as_it_comes():
    log, terminal = io.BytesIO(), io.BytesIO()
    console = Console(log, terminal)
    console.feed(b"\r 10%|#         | 1/10")
    assert terminal.getvalue() == b"\r 10%|#         | 1/10"  # not held back until a newline
    console.feed(b"\r 20%|##        | 2/10\n")
    assert terminal.getvalue().endswith(b"2/10\n")


def test_a_restarted_rank_after_a_failure_is_still_shown():
    """With max_restarts torchrun reports the failure, then starts the ranks again: no report follows."""
    data = (
        b"E1201 13:14:09.686000 15254 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
        b"(exitcode: -9) local_rank: 0 (pid: 15275) of binary: /venv/bin/python3\n"
        b"W1201 13:14:10.000000 15254 torch/distributed/elastic/agent/server/api.py:725] Restarting workers\n"
        b"step 3/60  loss 2.1\n"
    )
    terminal, _ = shown(data)
    assert "Restarting workers" in terminal and "step 3/60  loss 2.1" in terminal


def test_the_stacks_harmless_lines_are_kept_out_of_the_terminal_only():
    data = (
        b"DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully\n"
        b"/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: "
        b"`torch.distributed.all_gather_into_tensor` is deprecated. "
        b"Please use `torch.distributed.all_gather_single` instead.\n"
        b"  return func(*args, **kwargs)\n"
        b"step 1/4  loss 5.9\n"
    )
    terminal, log = shown(data)
    assert terminal == "step 1/4  loss 5.9\n" and log == data


STOPPED = RECORDED.parent / "ctrl-c-2ranks.log"


def test_after_ctrl_c_the_ranks_dying_tracebacks_go_to_the_log_only():
    first, rest = STOPPED.read_bytes().split(b"\n", 1)
    log, terminal = io.BytesIO(), io.BytesIO()
    console = Console(log, terminal)
    console.feed(first + b"\n")
    console.stopping = True  # what the launcher's signal handler sets
    console.feed(rest)
    console.close()
    assert terminal.getvalue().decode() == "step 12/400  eval_loss 4.6605\n"  # shown before the stop, nothing after
    assert log.getvalue() == STOPPED.read_bytes() and log.getvalue().count(b"KeyboardInterrupt") == 2


def test_after_sigterm_the_ranks_own_save_lines_still_show():
    """Recorded from a 2-rank run stopped by SIGTERM (the same run as ctrl-c-2ranks.log, 2026-12-04)."""
    terminal = io.BytesIO()
    console = Console(io.BytesIO(), terminal)
    console.stopping = True
    console.feed(
        b"sftdoctor: SIGTERM (seen first by rank 0): every rank stops after step 9 with a checkpoint "
        b"(saving takes about 0.0 s; 30 s of grace left)\n"
        b"step 9/400  loss 5.3302  grad_norm 1.882  lr 0.002  tok/s 1363\n"
        b"[rank1]: [rank1]: sftdoctor: SIGTERM: checkpoint-9 saved in 0.0 s\n"
    )
    shown_lines = terminal.getvalue().decode().splitlines()
    assert [line[:40] for line in shown_lines] == [
        "sftdoctor: SIGTERM (seen first by rank 0",
        "[rank1]: sftdoctor: SIGTERM: checkpoint-",
    ]
