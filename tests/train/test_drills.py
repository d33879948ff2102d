"""`--drill`: parsed, and refused when it could never fire."""

import re

import pytest
from conftest import make_run, plan_of
from hypothesis import given, settings
from hypothesis import strategies as st

from sftdoctor.errors import InputError
from sftdoctor.train.drills import KINDS, check_drill, parse_drill


def test_a_drill_that_can_never_fire_is_bad_input(tmp_path):
    one = plan_of(make_run(tmp_path, training={"max_steps": 10}))
    with pytest.raises(InputError, match="rank 5 does not exist: the run has 1 process"):
        check_drill(parse_drill("hang@3:5"), one)
    with pytest.raises(InputError, match="step 11 comes after the run's last step"):
        check_drill(parse_drill("nan-loss@11"), one)
    check_drill(parse_drill("hang@3:0"), one)  # fires
    with pytest.raises(InputError, match="desync needs two processes or more"):
        check_drill(parse_drill("desync@3"), one)
    assert parse_drill("desync@3:1") == {"kind": "desync", "step": 3, "rank": 1}


@pytest.mark.parametrize("text", ["nan-loss@0", "hang", "boom@3", "hang@x", "nan-loss@3:y"])
def test_a_drill_that_means_nothing_is_bad_input(text):
    with pytest.raises(InputError, match="--drill"):
        parse_drill(text)


def test_a_slow_drill_needs_another_rank_and_a_forward_of_its_own(tmp_path):
    one = plan_of(make_run(tmp_path, training={"max_steps": 10}))
    with pytest.raises(InputError, match="slow needs two processes or more: a straggler is slower than the other"):
        check_drill(parse_drill("slow@2:0"), one)
    sharded = plan_of(make_run(tmp_path, training={"max_steps": 10}, launch={"nproc_per_node": 2}, fsdp={}))
    with pytest.raises(InputError, match="FSDP and ZeRO-3 fill with all-gathers.*use slow-data@STEP:RANK"):
        check_drill(parse_drill("slow@2:1"), sharded)
    check_drill(parse_drill("slow-data@2:1"), sharded)  # the data time is each rank's own there too
    assert parse_drill("slow-data@2:1") == {"kind": "slow-data", "step": 2, "rank": 1}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="slow-dathngecynr@:0123456789 \u00b2\u0663", max_size=24))
def test_any_drill_text_is_a_drill_or_one_line_naming_the_option(text):
    try:
        drill = parse_drill(text)
    except InputError as refused:
        assert str(refused).startswith("--drill: expected nan-loss@STEP[:RANK]") and "\n" not in str(refused)
        return
    assert re.fullmatch(r"[a-z-]+@[0-9]+(:[0-9]+)?", text) and drill["kind"] in KINDS and drill["step"] >= 1


@given(st.sampled_from(KINDS), st.integers(1, 10**6), st.none() | st.integers(0, 512))
def test_every_drill_reads_back_as_written(kind, step, rank):
    text = f"{kind}@{step}" + ("" if rank is None else f":{rank}")
    assert parse_drill(text) == {"kind": kind, "step": step, "rank": rank}
