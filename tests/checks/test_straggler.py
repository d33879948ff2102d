"""The straggler check over recorded per-rank times: what is sustained, what is an event, what is noise, and what
is unknown."""

import pytest

from sftdoctor.checks import load_checks, run_check
from sftdoctor.checks.straggler import INTERVALS, MIN_STEPS, RATIO
from sftdoctor.findings import Severity
from sftdoctor.train.watch import RuntimeFacts

HOSTS = [{"host": "node-a", "gpu": "cuda:0 NVIDIA H100 80GB HBM3 (GPU-1111)"}, {"host": "node-b", "gpu": "CPU"}]


@pytest.fixture(scope="module")
def judge():
    [spec] = [s for s in load_checks(plugins=False).phase("runtime") if s.id == "straggler"]
    return lambda **times: run_check(spec, RuntimeFacts({"rank_times": {"ranks": HOSTS, **times}}))


def interval(step, data, forward, steps=1, step_time=0.6):
    return {"step": step, "steps": steps, "step_time_s": step_time, "data_s": data, "forward_s": forward}


def run(forwards, datas=None, steps=1, step_time=0.6):
    """Intervals from per-interval [rank 0, rank 1, ...] forward (and data) seconds per step."""
    datas = datas or [[0.001] * len(f) for f in forwards]
    return [interval((i + 1) * steps, d, f, steps, step_time) for i, (d, f) in enumerate(zip(datas, forwards))]


def test_a_rank_slow_in_every_interval_is_named_with_its_host_and_gpu(judge):
    [finding] = judge(intervals=run([[0.10, 0.45]] * MIN_STEPS))
    assert finding.id == "straggler/forward" and finding.severity == Severity.WARNING
    assert finding.title.startswith("straggler: rank 1 (node-b, CPU) takes 0.45 s per step in its forward passes")
    assert "4.5x the other rank's 0.1 s, for 6 steps (since step 1)" in finding.title
    assert finding.evidence["key"] == "forward/1" and finding.evidence["steps"] == [1, 6]
    assert "about 0.35 s of each 0.6 s step (58%) is spent waiting for rank 1" in finding.detail
    # named once: the watcher hands back what it published
    assert judge(intervals=run([[0.10, 0.45]] * MIN_STEPS), reported=["forward/1"]) == []
    # rank 0 on a GPU: the fix names the GPU's UUID for nvidia-smi
    [gpu] = judge(intervals=run([[0.45, 0.10]] * MIN_STEPS))
    assert "(node-a, cuda:0 NVIDIA H100 80GB HBM3 (GPU-1111))" in gpu.title and "-i GPU-1111" in gpu.fix


def test_data_time_names_data_loading(judge):
    datas = [[0.002, 0.30]] * MIN_STEPS
    [finding] = judge(intervals=run([[0.1, 0.1]] * MIN_STEPS, datas))
    assert finding.id == "straggler/data" and "fetching its batches" in finding.title
    assert "network file system" in finding.fix and "dataloader_num_workers = 0" in finding.detail


def test_one_slow_interval_is_an_event_not_a_straggler(judge):
    forwards = [[0.1, 0.1]] * (MIN_STEPS - 1) + [[0.1, 2.0]]  # a checkpoint save's page-cache flush, once
    assert judge(intervals=run(forwards)) == []
    forwards = [[0.1, 0.5], [0.1, 0.5], [0.1, 0.1], [0.1, 0.5], [0.1, 0.5], [0.1, 0.5]]  # broken by a normal one
    assert judge(intervals=run(forwards)) == []


def test_rank_0s_logging_and_saving_steps_do_not_make_it_a_straggler(judge):
    # every other interval rank 0 writes the logs and a checkpoint: its fetch after them is slower, never for long
    datas = [[1.5, 0.002] if i % 2 else [0.002, 0.002] for i in range(12)]
    assert judge(intervals=run([[0.1, 0.1]] * 12, datas)) == []


def test_a_short_run_of_slow_intervals_waits_for_enough_steps(judge):
    assert judge(intervals=run([[0.1, 0.5]] * (MIN_STEPS - 1))) == []  # 5 steps: not yet
    assert len(judge(intervals=run([[0.1, 0.5]] * INTERVALS, steps=2))) == 1  # 3 intervals of 2 steps: 6
    assert judge(intervals=run([[0.1, 0.5]] * (INTERVALS - 1), steps=10)) == []  # 20 steps, but 2 intervals


def test_tiny_or_cheap_differences_are_noise(judge):
    # 3x, but 2 ms more: microseconds and scheduling on tiny steps never fire
    assert judge(intervals=run([[0.001, 0.003]] * 10, step_time=0.005)) == []
    # 2x and 80 ms more, but on 2 s steps: 4% of the step, under the 5% share
    assert judge(intervals=run([[0.08, 0.16]] * 10, step_time=2.0)) == []
    # just under the ratio
    assert judge(intervals=run([[0.2, 0.2 * RATIO * 0.99]] * 10)) == []


def test_the_others_median_is_the_reference(judge):
    # 4 ranks: one fast by luck does not make the rest stragglers; the slow one is named against the median
    forwards = [[0.02, 0.1, 0.11, 0.5]] * MIN_STEPS
    [finding] = judge(intervals=run(forwards), ranks=HOSTS + [None, None])
    assert finding.evidence["rank"] == 3 and finding.evidence["others_median_s"][0] == 0.1
    assert "(host unknown, GPU unknown)" in finding.title and "median of the other 3 ranks'" in finding.title


def test_a_rank_whose_times_never_arrived_is_unknown_not_healthy(judge):
    forwards = [[0.1, None]] * INTERVALS
    [finding] = judge(intervals=run(forwards))
    assert finding.id == "straggler/unmeasured" and finding.severity == Severity.INFO
    assert "rank 1's forward time did not arrive" in finding.title and "unknown, not healthy" in finding.detail
    assert judge(intervals=run(forwards), reported=[finding.evidence["key"]]) == []
    [nobody] = judge(intervals=run([[0.1, 0.1]] * INTERVALS, [[None, None]] * INTERVALS))
    assert (
        nobody.title == "straggler: no rank's data time arrived for the last 3 logging intervals: they are not judged"
    )
    # once its times arrive, it is judged again
    assert judge(intervals=run(forwards + [[0.1, 0.1]])) == []


def test_a_signal_not_the_ranks_own_is_not_judged(judge):
    slow = run([[0.1, 0.5]] * MIN_STEPS)
    assert judge(intervals=slow, unjudged={"forward": "FSDP all-gathers each layer's weights"}) == []
    assert judge(intervals=[interval(3, [0.1], [0.5])] * MIN_STEPS) == []  # one rank: nothing to compare
