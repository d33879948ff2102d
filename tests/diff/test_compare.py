"""What differs between two run directories, on run directories written as `sftdoctor train` writes them."""

import json

import pytest

from sftdoctor.diff.compare import differences, recorded, where_they_part
from sftdoctor.errors import InputError

PLAN = {
    "version": 8,
    "learning_rate": 3e-3,
    "precision": "bf16",
    "output_dir": "runs/a",
    "master_port": 29500,
    "train_files": ["a/train.jsonl"],
    "reasons": {"precision": "auto"},
}
FACTS = {
    "packages": {"torch": "2.13.0", "transformers": "5.25.0", "requests": "2.32"},
    "torch_build": {"version": "2.13.0+cu128", "cuda": "12.8"},
    "gpus": {
        "driver_version": "570.86",
        "cuda_version": "12.8",
        "devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}] * 8,
    },
    "env": {"NCCL_IB_DISABLE": "0", "MASTER_PORT": "29500"},
}
DATA = {"a/train.jsonl": {"sha256": "ab" * 32, "bytes": 1000}}


def run(folder, plan=None, facts=None, data=None, losses=None):
    folder.mkdir(parents=True)
    (folder / "resolved.json").write_text(json.dumps({**PLAN, **(plan or {})}))
    if facts is not False:
        (folder / "facts.json").write_text(
            json.dumps({"schema": 2, "facts": {**FACTS, **(facts or {})}, "data_files": data or DATA})
        )
    if losses:
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in losses))
    return folder


def found(a, b):
    return [(d.area, d.what, d.a, d.b) for d in differences(recorded(a), recorded(b))]


def test_two_runs_that_differ_only_where_they_ran_differ_in_nothing(tmp_path):
    a = run(tmp_path / "a")
    b = run(
        tmp_path / "b",
        plan={"output_dir": "runs/b", "master_port": 40001, "train_files": ["b/train.jsonl"]},
        facts={"env": {"NCCL_IB_DISABLE": "0", "MASTER_PORT": "40001"}},
        data={"b/train.jsonl": DATA["a/train.jsonl"]},
    )  # the same bytes elsewhere
    assert found(a, b) == []


def test_the_likely_causes_come_first(tmp_path):
    a = run(tmp_path / "a")
    b = run(
        tmp_path / "b",
        plan={"learning_rate": 3e-4},
        facts={
            "packages": {**FACTS["packages"], "transformers": "5.24.0"},
            "env": {"NCCL_IB_DISABLE": "1"},
            "gpus": {**FACTS["gpus"], "driver_version": "550.54"},
        },
        data={"a/train.jsonl": {"sha256": "cd" * 32, "bytes": 990}},
    )
    assert found(a, b) == [
        (
            "data",
            "data files (sha256)",
            [f"train.jsonl {'ab' * 6} (1000 bytes)"],
            [f"train.jsonl {'cd' * 6} (990 bytes)"],
        ),
        ("plan", "learning_rate", 3e-3, 3e-4),
        ("stack", "transformers", "5.25.0", "5.24.0"),
        ("gpus", "driver_version", "570.86", "550.54"),
        ("env", "NCCL_IB_DISABLE", "0", "1"),
    ]


def test_a_run_without_facts_is_compared_on_its_plan_alone(tmp_path):
    a, b = run(tmp_path / "a"), run(tmp_path / "b", plan={"precision": "fp16"}, facts=False)
    assert found(a, b) == [("plan", "precision", "bf16", "fp16")]
    assert recorded(b).facts is None


def test_the_step_where_the_losses_part(tmp_path):
    a = run(tmp_path / "a", losses=[(1, 5.0), (2, 4.0), (3, 3.0), (4, 2.5)])
    b = run(tmp_path / "b", losses=[(1, 5.0), (2, 4.02), (3, 3.5), (4, 3.1), (5, 3.0)])
    assert where_they_part(a, b) == {
        "step": 3,
        "a": 3.0,
        "b": 3.5,
        "common_steps": 4,
        "both_non_finite": None,
        "non_finite": {"a": None, "b": None},
        "last": {"a": [4, 2.5], "b": [5, 3.0]},
    }
    assert where_they_part(a, a)["step"] is None  # a 0.5% wobble (step 2) is not a parting; equal runs never part


@pytest.mark.parametrize(
    "resolved, says",
    [
        (None, "not a folder; expected a run directory of `sftdoctor train`"),
        ("", "holds no resolved.json"),
        ("[1]", "expected a JSON object"),
        ("{", "not valid JSON"),
    ],
)
def test_what_is_not_a_run_is_named(tmp_path, resolved, says):
    folder = tmp_path / "x"
    if resolved is not None:
        folder.mkdir()
        if resolved:
            (folder / "resolved.json").write_text(resolved)
    with pytest.raises(InputError, match=says):
        recorded(folder)


@pytest.mark.parametrize(
    "kept, areas, says",
    [
        ('{"facts": [], "data_files": {}}', ("stack", "gpus", "env"), "facts: expected an object of facts, got list"),
        ('{"facts": {"packages": "x"}}', ("stack",), "facts.packages: expected an object, got str"),
        ('{"facts": {"gpus": {"devices": "y"}}}', ("gpus",), "facts.gpus.devices: "),
        (
            '{"facts": {}, "data_files": {"a": "b"}}',
            ("data",),
            "data_files: expected an object of file name -> {sha256, bytes}",
        ),
    ],
)
def test_a_broken_facts_json_is_named_and_its_areas_not_compared(tmp_path, kept, areas, says):
    """facts.json is optional (older runs have none): a damaged one costs its areas, named with why, not the diff."""
    folder = run(tmp_path / "a", facts=False)
    (folder / "facts.json").write_text(kept)
    gaps = [g for g in recorded(folder).gaps if f"{folder / 'facts.json'}: {says}" in g.why]
    assert len(gaps) == 1 and gaps[0].areas == areas, recorded(folder).gaps


def test_unreadable_metrics_are_said_not_read_as_no_loss(tmp_path):
    a = run(tmp_path / "a", losses=[(1, 5.0)])
    b = run(tmp_path / "b")
    (b / "metrics.jsonl").write_text("garbage\n")
    assert where_they_part(a, b)["error"].startswith(f"{b / 'metrics.jsonl'}: line 1: expected one JSON object")
    assert where_they_part(a, run(tmp_path / "c"))["error"] == f"{tmp_path / 'c'} has no metrics.jsonl"
    (b / "metrics.jsonl").write_text('{"step": 1, "learning_rate": 0.1}\n')
    assert where_they_part(a, b)["error"] == f"{b} logged no train loss"


def test_runs_logged_at_no_common_step_are_not_said_to_agree(tmp_path):
    a = run(tmp_path / "a", losses=[(1, 5.0), (3, 4.0)])
    b = run(tmp_path / "b", losses=[(2, 5.0), (4, 4.0)])
    assert where_they_part(a, b) == {"error": "the two runs logged their losses at no common step"}


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "losses_b, step, both, b_from",
    [
        ([(1, 5.0), (2, 4.0), (3, NAN), (4, NAN)], 3, None, 3),  # one a number, the other not: they part there
        ([(1, 5.0), (2, INF), (3, 3.0), (4, 2.5)], 2, None, 2),  # an inf spike that came back
    ],
)
def test_a_loss_that_stops_being_a_number_is_where_they_part(tmp_path, losses_b, step, both, b_from):
    """Every comparison with NaN is false: compared as numbers, a NaN run "agreed at every common step"."""
    a = run(tmp_path / "a", losses=[(1, 5.0), (2, 4.0), (3, 3.0), (4, 2.5)])
    b = run(tmp_path / "b", losses=losses_b)
    parted = where_they_part(a, b)
    assert (parted["step"], parted["both_non_finite"], parted["non_finite"]["a"]) == (step, both, None)
    assert parted["non_finite"]["b"]["step"] == b_from


def test_two_nan_losses_are_both_non_finite_not_agreement(tmp_path):
    a = run(tmp_path / "a", losses=[(1, 5.0), (2, 4.0), (3, NAN), (4, NAN)])
    b = run(tmp_path / "b", losses=[(1, 5.0), (2, 4.0), (3, NAN), (4, NAN)])
    parted = where_they_part(a, b)
    assert parted["step"] is None and parted["both_non_finite"] == 3
    assert parted["non_finite"]["a"] == {"step": 3, "value": "NaN", "count": 2, "of": 4, "to_end": True}


def test_a_fact_one_run_lacks_is_not_compared_not_equal(tmp_path):
    """An older facts.json without gpus, or one whose probe failed: "{} == {}" said "0 differences" of it."""
    a = run(tmp_path / "a")
    b = run(tmp_path / "b")
    kept = json.loads((b / "facts.json").read_text())
    del kept["facts"]["gpus"]
    kept["unavailable"] = {"gpus": "nvidia-smi: not found"}
    (b / "facts.json").write_text(json.dumps(kept))
    assert found(a, b) == []
    [gap] = recorded(b).gaps
    assert gap.areas == ("gpus",)
    assert gap.why == f"has no facts.gpus in {b / 'facts.json'} (its probe said: nvidia-smi: not found)"


def test_data_whose_digest_could_not_be_taken_is_not_compared(tmp_path):
    broken = {"a/train.jsonl": {"error": "Permission denied"}}
    a, b = run(tmp_path / "a", data=broken), run(tmp_path / "b", data=broken)
    assert found(a, b) == []
    assert [g.areas for g in recorded(a).gaps] == [("data",)]
    assert recorded(a).gaps[0].why == "has no digest of a/train.jsonl (Permission denied)"


def test_a_setting_that_is_not_a_number_is_never_the_same(tmp_path):
    a, b = run(tmp_path / "a", plan={"learning_rate": NAN}), run(tmp_path / "b", plan={"learning_rate": NAN})
    found_ = [(d.area, d.what) for d in differences(recorded(a), recorded(b))]
    assert found_ == [("plan", "learning_rate (not a finite number)")]


def test_a_gpu_probe_that_failed_is_not_compared_as_no_gpus(tmp_path):
    """NVML and nvidia-smi both failing at two launches read as "no GPUs" in both: an agreement on nothing."""
    failed = {
        "source": None,
        "driver_version": None,
        "cuda_version": None,
        "devices": [],
        "error": "NVML: Driver Not Loaded",
    }
    a, b = run(tmp_path / "a", facts={"gpus": failed}), run(tmp_path / "b", facts={"gpus": failed})
    assert found(a, b) == []
    assert [(g.areas, g.why) for g in recorded(a).gaps] == [
        (("gpus",), f"has facts.gpus from a GPU probe that failed in {a / 'facts.json'}: NVML: Driver Not Loaded")
    ]
    none = {**failed, "error": "no NVIDIA kernel driver loaded (/proc/driver/nvidia/version is absent)"}
    assert recorded(run(tmp_path / "c", facts={"gpus": none})).gaps == ()  # a machine without GPUs: a fact


def test_a_hub_dataset_at_another_revision_or_split_differs_in_the_data_but_a_moved_folder_does_not(tmp_path):
    """The data source is compared by what it is (an id, its subset, split and revision; a folder by its files'
    digests), never by where a folder lies."""
    shard = {"sha256": "cd" * 32, "bytes": 500}
    hub = {"kind": "hub", "name": "org/name", "subset": "default", "split": "train", "eval_split": None}
    a = run(tmp_path / "a", plan={"data_source": {**hub, "revision": "1" * 40}}, data={"x/n-train.arrow": shard})
    b = run(tmp_path / "b", plan={"data_source": {**hub, "revision": "2" * 40}}, data={"y/n-train.arrow": shard})
    ((area, what, was, now),) = found(a, b)
    assert (area, what) == ("data", "data source")
    assert was == f"org/name (subset default, split train, revision {'1' * 40})" and now.endswith(f"{'2' * 40})")
    c = run(tmp_path / "c", plan={"data_source": {**hub, "revision": "1" * 40, "split": "test"}})
    assert ("data", "data source") in [(d[0], d[1]) for d in found(a, c)]
    folder = {"kind": "folder", "subset": "default", "split": "train", "eval_split": None, "revision": None}
    here = run(tmp_path / "d", plan={"data_source": {**folder, "name": "/x/hub"}}, data={"/x/hub/t.parquet": shard})
    moved = run(tmp_path / "e", plan={"data_source": {**folder, "name": "/y/hub"}}, data={"/y/hub/t.parquet": shard})
    assert found(here, moved) == []
    changed = run(
        tmp_path / "f",
        plan={"data_source": {**folder, "name": "/y/hub"}},
        data={"/y/hub/t.parquet": DATA["a/train.jsonl"]},
    )
    assert [d[:2] for d in found(here, changed)] == [("data", "data files (sha256)")]
