"""Flight-recorder dumps read with torch's analyzer: real Gloo dumps of the drills (torch 2.13), and a public
NCCL case rebuilt from its report (tests/fixtures/flight_recorder/README.md)."""

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from sftdoctor.checks._collectives import describe, dumps_finding, ranks_text
from sftdoctor.facts.flight_recorder import dumps_in, read

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"


def test_gloo_dumps_torchs_analyzer_cannot_pair_are_read():
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    folder = FIXTURES / "gloo-broadcast-vs-all-reduce"
    args = JobConfig().parse_args([str(folder), "-p", "trace-"])
    details, version = read_dir(args)
    with pytest.raises(KeyError):  # torch 2.13: gloo's pg_config is keyed "" (see the module docstring)
        build_db(details, args, version)
    fr = read(folder)
    [group] = fr["groups"]
    assert (group["group"], group["seq"], fr["backend"]) == ("default_pg", 6, "gloo")
    assert group["inside"]["0"]["collective"] == "all_reduce" and group["other"]["1"]["collective"] == "broadcast"
    assert group["other"]["1"]["where"] == "exp.py:24 <module>"  # torch's own wrappers left out


def test_a_rank_that_never_entered_the_collective_is_named_with_its_last_one():
    fr = read(FIXTURES / "gloo-hang-drill", world=2, groups={"0": [0, 1], "1": [0, 1]})
    default, drill = fr["groups"]
    assert (default["group"], default["collective"], default["seq"]) == ("default_pg", "broadcast", 31)
    assert list(default["inside"]) == ["0"] and default["absent"]["1"]["seq"] == 30
    assert "compute_loss" in default["inside"]["0"]["where"]
    # the drill's own group: rank 1 inside, rank 0 never there
    assert (
        list(drill["inside"]) == ["1"]
        and list(drill["absent"]) == ["0"]
        and "on_step_begin" in drill["inside"]["1"]["where"]
    )
    headline, detail = describe(fr)
    assert headline == "rank 1 never entered broadcast #31 on default_pg [[16]] Float"
    assert "rank 1 never entered it (rank 1 last: all_gather #30 [[1]] Long" in detail
    assert "rank 0 never entered it (rank 0: no collective on this group recorded)" in detail


def test_groups_of_an_earlier_process_group_with_the_same_name_are_not_paired():
    """The preflight's group "1" (199 all_reduces, destroyed) and the drill's group "1" (one all_reduce): paired by
    name, the analyzer would compare the drill's all_reduce of 1 with the preflight's first one of 8,192."""
    fr = read(FIXTURES / "gloo-hang-drill", world=2, groups={"0": [0, 1], "1": [0, 1]})
    assert [g["group"] for g in fr["groups"]] == ["default_pg", "group 1"]
    assert all(op["sizes"] != [[8192]] for g in fr["groups"] for op in [*g["inside"].values(), *g["other"].values()])


def test_a_rank_that_called_another_collective_is_named_against_the_others():
    fr = read(FIXTURES / "gloo-desync-drill")
    [group] = fr["groups"]
    assert group["other"]["1"]["sizes"] == [[2**20]] and group["inside"]["0"]["sizes"] == [[16]]
    headline, _ = describe(fr)
    assert (
        headline
        == "rank 1 called broadcast #31 on default_pg [[1048576]] Float where rank 0 called broadcast #31 [[16]] Float"
    )


def nccl_case(tmp_path: Path) -> Path:
    doc = json.loads((FIXTURES / "miaai-117.json").read_text())
    for rank, dump in doc["dumps"].items():
        for e in dump["entries"]:
            e["process_group"] = tuple(e["process_group"])  # a tuple in torch's pickle
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    return tmp_path


def test_the_public_nccl_case_names_the_rank_and_the_gather(tmp_path):
    fr = read(nccl_case(tmp_path))
    [group] = fr["groups"]
    assert (group["collective"], group["seq"], group["sizes"]) == ("_all_gather_base", 288710, [[18, 64640]])
    assert list(group["inside"]) == ["1"] and group["absent"]["0"]["seq"] == 288709  # "missing ranks: {0}"
    headline, detail = describe(fr)
    assert headline == "rank 0 never entered _all_gather_base #288710 on default_pg [[18, 64640]] BFloat16"
    assert "tensor_model_parallel_all_gather" in detail and "_gather_logits" in detail
    assert fr["last"]["0"]["completed"] and not fr["last"]["1"]["completed"]


def test_ranks_outside_a_group_are_not_said_to_have_stayed_out_of_it(tmp_path):
    """The TP group of the public case spans ranks 0-1 of a 4-rank job; ranks 2-3 run their own group."""
    folder = nccl_case(tmp_path)
    for rank in (0, 1):
        dump = pickle.loads((folder / f"nccl_trace_rank_{rank}").read_bytes())
        for e in dump["entries"]:
            e["process_group"] = ("1", "tp")
        dump["pg_config"] = {
            "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"},
            "2": {"name": "2", "desc": "tp", "ranks": "[2, 3]"},
        }
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    for rank in (2, 3):  # the other pair, in step on their own group
        dump = pickle.loads((folder / "nccl_trace_rank_0").read_bytes())
        for e in dump["entries"]:
            e["process_group"] = ("2", "tp")
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    [group] = read(folder)["groups"]
    assert list(group["absent"]) == ["0"] and list(group["inside"]) == ["1"] and group["no_dump"] == []


def test_ranks_in_the_same_collective_that_never_completes_point_at_the_transport(tmp_path):
    folder = nccl_case(tmp_path)
    dump = pickle.loads((folder / "nccl_trace_rank_0").read_bytes())
    dump["entries"].append({**pickle.loads((folder / "nccl_trace_rank_1").read_bytes())["entries"][-1]})
    (folder / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump))
    fr = read(folder)
    assert fr["groups"] == []
    headline, detail = describe(fr)
    assert headline == "every rank is inside _all_gather_base #288710 on default_pg [[18, 64640]] BFloat16"
    assert "the collective itself is stuck" in detail
    assert dumps_finding(fr).severity.value == "error"


class Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/sftdoctor-pwned",))


def test_a_dump_is_never_unpickled_into_code(tmp_path):
    (tmp_path / "trace-0").write_bytes(pickle.dumps({"version": "2.10", "entries": [Boom()]}))
    fr = read(tmp_path)
    assert (
        "not a flight-recorder dump (it names posix.system)" in fr["error"]
        and not Path("/tmp/sftdoctor-pwned").exists()
    )
    finding = dumps_finding(fr)
    assert finding.severity.value == "warning" and "could not be analysed" in finding.title  # never a silent pass


def test_dumps_that_cannot_be_read_are_said_unreadable_not_clean(tmp_path):
    """Issue 40: the dumps that can be read are analysed, the others named; none is read as clean."""
    shutil.copy(FIXTURES / "gloo-broadcast-vs-all-reduce" / "trace-0", tmp_path / "trace-0")
    (tmp_path / "trace-1").write_bytes((FIXTURES / "gloo-broadcast-vs-all-reduce" / "trace-1").read_bytes()[:100])
    fr = read(tmp_path)
    assert fr["dumps"] == [0] and fr["no_dump"] == [1]
    assert fr["unreadable"]["1"].startswith("trace-1: not a readable flight-recorder dump")
    headline, detail = describe(fr)
    assert headline == "rank 0 is inside all_reduce #6 on default_pg [[1000]] Float; rank 1's dump unreadable"
    assert "Rank 1's dump could not be read (trace-1: not a readable flight-recorder dump" in detail
    assert "every rank" not in detail


def test_dumps_that_recorded_nothing_cannot_judge(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank-{rank}").write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": []}))
    fr = read(tmp_path)
    assert fr["groups"] == [] and describe(fr) == (
        "",
        f"Flight recorder (ranks 0-1, {tmp_path}): the dumps hold no "
        "collective (the recorder off, TORCH_FR_BUFFER_SIZE=0?): they "
        "cannot say which collective; read the stacks.",
    )
    finding = dumps_finding(fr)
    assert finding.severity.value == "warning" and "could not be analysed" in finding.title


def test_which_files_are_dumps(tmp_path):
    assert read(tmp_path) == {"folder": str(tmp_path), "dumps": []}
    for name in ("rank-0", "rank-1", "rank-2.pkl"):
        (tmp_path / name).write_bytes(b"\x80\x04stuff")
    (tmp_path / "train.log").write_text("x")
    (tmp_path / "checkpoint-4").write_bytes(b"not a pickle")  # a number at the end, but no pickle
    assert {r: p.name for r, p in dumps_in(tmp_path).items()} == {0: "rank-0", 1: "rank-1", 2: "rank-2.pkl"}


def test_ranks_text():
    assert ranks_text([3]) == "rank 3" and ranks_text(["0", "1", "2", "5"]) == "ranks 0-2, 5"


def test_any_pickled_data_is_a_result_or_an_error_never_a_crash(tmp_path):
    """Dumps from other tools, versions or a broken disk: `read` answers with groups or an error, and never says
    nothing was wrong about data it could not pair."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=4), st.floats(allow_nan=True))
    names = st.sampled_from(["gloo:all_reduce", "nccl:broadcast", "nccl:send 0->1", "x", "gloo:bogus", ""])
    entry = st.fixed_dictionaries(
        {
            "process_group": st.one_of(
                st.tuples(st.sampled_from(["0", "1"]), st.sampled_from(["default_pg", "undefined"])), scalars
            ),
            "collective_seq_id": st.one_of(st.integers(0, 4), scalars),
            "profiling_name": st.one_of(names, scalars),
            "record_id": st.integers(0, 8),
            "pg_id": st.integers(0, 2),
            "p2p_seq_id": st.integers(0, 2),
            "input_sizes": st.one_of(st.just([[4]]), st.just([[5]]), scalars),
            "output_sizes": st.just([[4]]),
            "state": st.sampled_from(["scheduled", "started", "completed"]),
            "frames": st.just([]),
        }
    )
    dump = st.fixed_dictionaries(
        {
            "version": st.sampled_from(["2.10", "2.4", "x"]),
            "pg_config": st.one_of(st.just({}), st.just({"": {"ranks": "[]"}}), scalars),
            "entries": st.lists(entry, max_size=5),
        }
    )

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(dump, min_size=1, max_size=3))
    def check(dumps):
        folder = tmp_path / "fuzz"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        for rank, d in enumerate(dumps):
            (folder / f"rank-{rank}").write_bytes(pickle.dumps(d))
        fr = read(folder)
        assert fr["dumps"] == list(range(len(dumps)))
        assert "error" in fr or isinstance(fr["groups"], list)
        describe(fr)  # and it can be said

    check()
