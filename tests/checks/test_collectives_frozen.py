"""The hang finding when a rank sent nothing (its process frozen: stopped, in D state, or its host gone), on the
facts the watchdog recorded: rank 0's report, stacks and dump of the 2-rank hang drill, nothing from rank 1."""

import pytest
from flight_dumps import claims_all, only_rank_0

from sftdoctor.checks import load_checks, run_check
from sftdoctor.facts.flight_recorder import read


class Moment:
    def __init__(self, values):
        self.values = values

    def known(self, name):
        return name in self.values

    def get(self, name):
        return self.values.get(name)

    def why_missing(self, name):
        return f"no {name}"


def nccl_timeout(hang):
    spec = next(s for s in load_checks(False).phase("runtime") if s.id == "nccl-timeout")
    [finding] = run_check(spec, Moment({"hang": hang}))
    return finding


@pytest.fixture(scope="module")
def rank_0_only(tmp_path_factory):
    return read(only_rank_0(tmp_path_factory.mktemp("run")), 2, {"0": [0, 1], "1": [0, 1]})


def frozen(fr, process=None):
    report = {"step": 3, "phase": "forward/backward", "stalled_s": 9.0, "where": "graph.py:829 _engine_run_backward"}
    return {
        "timeout_s": 8,
        "behind": [1],
        "world": 2,
        "stacks": "run/stacks",
        "flight_recorder": fr,
        "ranks": {"0": report},
        "arrived": {
            "0": {"report": True, "stacks": "run/stacks/rank-0.txt", "dump": "run/flight-recorder/rank-0"},
            "1": {"report": False, "stacks": None, "dump": None, "process": process},
        },
    }


def test_a_rank_that_sent_nothing_is_named_first_and_nothing_is_said_for_it(rank_0_only):
    finding = nccl_timeout(frozen(rank_0_only))
    assert finding.title == (
        "hang: no progress for 8 s; behind: rank 1 (sent nothing: no report, no stacks, no dump); "
        "rank 0 is inside broadcast #31 on default_pg [[16]] Float"
    )
    assert finding.detail.startswith(
        "Rank 1 sent nothing: its process is unresponsive (stopped, in uninterruptible "
        "sleep (D) on a stuck NFS read or a wedged GPU, or the host is gone), the first "
        "suspect. What arrived, per rank: rank 0: step 3, forward/backward, 9 s without "
        "progress; at graph.py:829 _engine_run_backward; stacks run/stacks/rank-0.txt; "
        "dump run/flight-recorder/rank-0 | rank 1: nothing (no report, no stacks, "
        "no dump)."
    )
    assert "Rank 1 sent no dump: nothing is known of rank 1" in finding.detail
    assert not claims_all(finding.title + finding.detail)
    for what in ("ps -o stat= -p PID", "cat /proc/PID/stack", "py-spy dump --pid PID", "dmesg", "NFS", "nvidia-smi"):
        assert what in finding.fix


def test_the_state_of_a_silent_rank_seen_on_this_host_leads_the_fix(rank_0_only):
    stopped = nccl_timeout(frozen(rank_0_only, {"host": "node-a", "pid": 4242, "state": "T (stopped (SIGSTOP))"}))
    assert "no dump; process 4242 on node-a: T (stopped (SIGSTOP)))" in stopped.title
    assert stopped.fix.startswith("rank 1's process 4242 was stopped") and "kill -CONT 4242" in stopped.fix
    blocked = nccl_timeout(
        frozen(
            rank_0_only,
            {
                "host": "node-a",
                "pid": 4242,
                "wchan": "rpc_wait_bit_killable",
                "state": "D (blocked in the kernel (uninterruptible sleep))",
            },
        )
    )
    assert "waiting in rpc_wait_bit_killable" in blocked.title and "cat /proc/4242/stack" in blocked.fix


def test_with_every_dump_there_the_transport_may_be_blamed(rank_0_only):
    """The one case the old sentence stands: every rank of the world dumped, all inside the same collective."""
    whole = {**rank_0_only, "world": 1, "world_known": True, "no_dump": [], "unreadable": {}}
    finding = nccl_timeout({**frozen(whole), "behind": [], "arrived": {}})
    assert "every rank is inside broadcast #31" in finding.title and "the collective itself is stuck" in finding.detail
