"""Dumps from some ranks only, and dump folders holding what is not a dump (a FIFO, /dev/zero, a file even root
cannot read, a dangling link, a folder, a huge file, a truncated pickle, a pickle naming a class): the reader
names what it could not read, analyses the rest, and no sentence speaks for a rank whose dump is not there."""

import os
import pickle
import shutil
from pathlib import Path

import pytest
from cli_contract import sftdoctor
from flight_dumps import FLIGHT_RECORDER, claims_all, only_rank_0
from hostile import SPECIAL, no_hang, special_file

from sftdoctor.checks._collectives import describe, dumps_finding, whole
from sftdoctor.facts.flight_recorder import dumps_in, read
from sftdoctor.triage.command import world_of


def test_rank_0s_dump_alone_speaks_for_rank_0_and_names_rank_1_as_sending_none(tmp_path):
    fr = read(only_rank_0(tmp_path), world=2)
    assert (fr["dumps"], fr["no_dump"], fr["world"], fr["world_known"]) == ([0], [1], 2, True)
    headline, detail = describe(fr)
    assert headline == "rank 0 is inside broadcast #31 on default_pg [[16]] Float; rank 1 sent no dump"
    assert f"Flight recorder (rank 0 of 2, {tmp_path / 'flight-recorder'}): rank 0 entered broadcast #31" in detail
    assert "Rank 1 sent no dump: nothing is known of rank 1" in detail
    assert not claims_all(headline + detail)
    finding = dumps_finding(fr)
    assert finding.severity.value == "error" and "cat /proc/PID/stack" in finding.fix and "ps -o stat=" in finding.fix


def test_without_the_worlds_size_rank_0s_dump_is_not_every_rank(tmp_path):
    """Gloo's dumps name no group's ranks: alone, rank 0's dump cannot tell a 1-rank run from a 2-rank one."""
    fr = read(only_rank_0(tmp_path))
    assert fr["world_known"] is False and not whole(fr)
    headline, detail = describe(fr)
    assert headline.endswith("; the world's size unknown") and "do not say how many ranks the run had" in detail
    assert not claims_all(headline + detail)


def nccl_pair(tmp_path: Path) -> Path:
    """The public NCCL case with both ranks inside the same gather: the one case "every rank" may be said."""
    import json

    doc = json.loads((FLIGHT_RECORDER / "miaai-117.json").read_text())
    for rank, dump in doc["dumps"].items():
        for e in dump["entries"]:
            e["process_group"] = tuple(e["process_group"])
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    dump = pickle.loads((tmp_path / "nccl_trace_rank_0").read_bytes())
    dump["entries"].append(pickle.loads((tmp_path / "nccl_trace_rank_1").read_bytes())["entries"][-1])
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump))
    return tmp_path


def test_every_rank_is_said_only_when_every_ranks_dump_is_read(tmp_path):
    folder = nccl_pair(tmp_path)
    assert describe(read(folder))[0].startswith("every rank is inside _all_gather_base #288710")
    assert describe(read(folder, world=3))[0] == (
        "ranks 0-1 are inside _all_gather_base #288710 on default_pg [[18, 64640]] BFloat16; rank 2 sent no dump"
    )
    (folder / "nccl_trace_rank_1").unlink()
    headline, detail = describe(read(folder))
    assert headline.startswith("rank 0 is inside _all_gather_base #288710") and not claims_all(headline + detail)


def test_completed_collectives_of_some_ranks_are_not_said_of_all(tmp_path):
    folder = nccl_pair(tmp_path)
    for rank in (0, 1):  # both ranks' last collective completed
        dump = pickle.loads((folder / f"nccl_trace_rank_{rank}").read_bytes())
        dump["entries"] = [{**e, "state": "completed"} for e in dump["entries"][:-1]]
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    assert describe(read(folder))[0] == "no rank is inside a collective"
    headline, detail = describe(read(folder, world=4))
    assert headline == "ranks 0-1: no collective open; ranks 2-3 sent no dump" and not claims_all(detail)


@pytest.mark.parametrize("kind", [*SPECIAL, "huge", "truncated", "class"])
def test_a_dump_that_is_not_one_is_named_and_the_others_read(tmp_path, kind):
    folder = only_rank_0(tmp_path)
    hostile(folder / "rank-1", kind)
    with no_hang(20):
        found = dumps_in(folder)
        fr = read(folder, world=2)
    assert set(found) == {0, 1} and fr["dumps"] == [0] and fr["unreadable"]["1"].startswith("rank-1: ")
    headline, detail = describe(fr)
    assert headline == "rank 0 is inside broadcast #31 on default_pg [[16]] Float; rank 1's dump unreadable"
    assert f"Rank 1's dump could not be read ({fr['unreadable']['1']})" in detail and not claims_all(detail)


def hostile(path: Path, kind: str) -> None:
    good = (FLIGHT_RECORDER / "gloo-hang-drill" / "rank-1").read_bytes()
    if kind == "huge":  # sparse: a size no dump has, never read
        with open(path, "wb") as handle:
            handle.truncate(300 * 2**20)
    elif kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "class":
        path.write_bytes(pickle.dumps({"version": "2.10", "entries": [Path("x")]}))
    else:
        special_file(path, kind)


def test_a_fifo_among_the_dumps_is_never_opened(tmp_path):
    folder = only_rank_0(tmp_path)
    os.mkfifo(folder / "rank-1")
    with no_hang(20):
        fr = read(folder, world=2)
    assert fr["unreadable"] == {"1": "rank-1: expected a flight-recorder dump file, got a named pipe"}


def test_the_world_of_a_run_directory_beside_the_log(tmp_path):
    assert world_of(tmp_path) is None
    (tmp_path / "resolved.json").write_text('{"world_size": 2}')
    assert world_of(tmp_path) == 2
    for bad in ('{"world_size": true}', '{"world_size": 0}', "[1]", "{", '{"world_size": "2"}'):
        (tmp_path / "resolved.json").write_text(bad)
        assert world_of(tmp_path) is None, bad
    (tmp_path / "resolved.json").unlink()
    special_file(tmp_path / "resolved.json", "fifo")
    with no_hang(10):
        assert world_of(tmp_path) is None


@pytest.mark.slow
def test_explain_log_beside_hostile_dumps_gives_its_verdict(tmp_path):
    """An unreadable dump beside a log used to turn the triage into a traceback (issue 40)."""
    folder = only_rank_0(tmp_path)
    for rank, kind in enumerate(("unreadable", "fifo", "dev-zero", "dangling", "folder", "truncated"), start=1):
        hostile(folder / f"rank-{rank}", kind)
    (tmp_path / "resolved.json").write_text('{"world_size": 8}')
    (tmp_path / "train.log").write_text("step 2 loss 3.1\n")
    with no_hang(60):
        result = sftdoctor(["explain", "--log", tmp_path / "train.log"], tmp_path, [tmp_path])
    assert result.exit_code == 1
    out = result.stdout
    assert "root cause: nccl-timeout in the flight-recorder dumps beside the log" in out
    assert (
        "rank 0 is inside broadcast #31 on default_pg [[16]] Float; rank 7 sent no dump; ranks 1-6's dumps unreadable"
    ) in out
    for why in (
        "rank-1: cannot read flight-recorder dump: Input/output error",
        "rank-2: expected a flight-recorder dump file, got a named pipe",
        "rank-3: expected a flight-recorder dump file, got a character device",
        "rank-4: flight-recorder dump not found",
        "rank-5: expected a flight-recorder dump file, got a directory",
        "rank-6: not a readable flight-recorder dump",
    ):
        assert why in out
    assert not claims_all(out) and "Flight recorder (rank 0 of 8," in out


KINDS = ["good", "missing", *SPECIAL, "huge", "truncated", "class"]


def layout(root: Path, kinds: list[str], inside: bool, resolved: bool) -> Path:
    """A run directory: train.log, the ranks' dumps (the NCCL pair for ranks 0-1, rank 1's again beyond) or what
    stands in their place, in flight-recorder/ or beside the log, and resolved.json naming the world or not."""
    (root / "pair").mkdir(parents=True)
    pair = nccl_pair(root / "pair")
    folder = root / "run" / ("flight-recorder" if inside else "")
    folder.mkdir(parents=True, exist_ok=True)
    for rank, kind in enumerate(kinds):
        path = folder / f"nccl_trace_rank_{rank}"
        if kind == "good":
            shutil.copy(pair / f"nccl_trace_rank_{min(rank, 1)}", path)
        elif kind != "missing":
            hostile(path, kind)
    shutil.rmtree(pair)
    if resolved:
        (root / "run" / "resolved.json").write_text(f'{{"world_size": {len(kinds)}}}')
    (root / "run" / "train.log").write_text("step 2 loss 3.1\n")
    return root / "run"


def leaves_no_trace(kind: str, inside: bool) -> bool:
    """A rank's file the reader cannot see: none, or beside a log a regular file that does not start like a
    pickle (an empty or binary file there is someone else's, as train.log.1 is)."""
    return kind == "missing" or (not inside and kind in ("empty", "binary"))


def speaks_for_all(kinds: list[str], inside: bool, resolved: bool) -> bool:
    """Whether the readable dumps cover the world: every rank's dump good, and the world known (resolved.json,
    or the NCCL pair's pg_config, which names ranks 0-1). Without resolved.json, a rank beyond 0-1 whose file
    leaves no trace is not part of the world: the world the dumps name (2) is all there is to know."""
    while not resolved and len(kinds) > 2 and leaves_no_trace(kinds[-1], inside):
        kinds = kinds[:-1]
    return all(k == "good" for k in kinds) and (resolved or len(kinds) <= 2)


def folders():
    from hypothesis import strategies as st

    return st.tuples(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4), st.booleans(), st.booleans())


FROZEN_RANK = (["good", "missing"], True, True)  # the frozen rank: its dump never came
# the traceback: /proc/self/mem beside a log
PROC_MEM_BESIDE_A_LOG = (["good", "unreadable", "fifo"], False, False)
# CI's draw: an empty rank-2 file beside a log, outside the world of 2 that the dumps name
EMPTY_BEYOND_THE_WORLD = (["good", "good", "empty"], False, False)


def over_drawn_folders(tmp_path: Path, max_examples: int, examples: list[tuple], check) -> None:
    """`check(run, kinds, inside, resolved)` on each run directory that folders() draws (and on `examples`), each
    laid out afresh in tmp_path/case."""
    from hypothesis import HealthCheck, example, given, settings

    @settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(folders())
    def case(drawn):
        kinds, inside, resolved = drawn
        shutil.rmtree(tmp_path / "case", ignore_errors=True)
        check(layout(tmp_path / "case", kinds, inside, resolved), kinds, inside, resolved)

    for drawn in examples:
        case = example(drawn)(case)
    case()


@pytest.mark.slow
def test_the_reader_over_any_folder_of_dumps_never_claims_beyond_them(tmp_path):
    def check(run, kinds, inside, resolved):
        with no_hang(20):
            fr = read(run / "flight-recorder" if inside else run, world_of(run))
        said = " ".join(describe(fr)) + " " + dumps_finding(fr).title if fr["dumps"] or fr.get("unreadable") else ""
        assert not claims_all(said) or speaks_for_all(kinds, inside, resolved), said
        for rank, kind in enumerate(kinds):  # every rank that is not good is named, as unreadable or without a dump
            assert (rank in fr.get("dumps", [])) == (kind == "good") or not fr.get("dumps"), (rank, kind, fr)

    over_drawn_folders(tmp_path, 150, [FROZEN_RANK, PROC_MEM_BESIDE_A_LOG, EMPTY_BEYOND_THE_WORLD], check)


@pytest.mark.slow
def test_explain_log_over_any_folder_of_dumps_keeps_the_contract(tmp_path):
    """`explain --log` beside hostile dump folders: a verdict (never a traceback, never a block), the dumps it
    could read analysed, and no sentence about every rank unless every rank's dump was read."""

    def check(run, kinds, inside, resolved):
        with no_hang(90):
            result = sftdoctor(["explain", "--log", run / "train.log"], tmp_path / "case", [run])
        assert result.exit_code in (0, 1)
        assert not claims_all(result.stdout) or speaks_for_all(kinds, inside, resolved), result.stdout
        # what stands in a dump's place is named: in the watchdog's folder, or beside a real dump of that name
        if any(not leaves_no_trace(k, inside) and k != "good" for k in kinds) and (inside or "good" in kinds):
            assert "could not be read" in result.stdout, result.stdout

    over_drawn_folders(tmp_path, 10, [PROC_MEM_BESIDE_A_LOG], check)
