"""`--drill`: parsed, and refused when it could never fire."""

import pytest
from conftest import make_run, plan_of

from sftdoctor.errors import InputError
from sftdoctor.train.drills import check_drill, parse_drill


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
