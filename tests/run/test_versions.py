"""PEP 440 versions read and ordered as the installed `packaging` reads them (sftdoctor does not import it into
the CLI), on hand-picked versions and on generated ones: valid in every spelling PEP 440 normalises, and
strings made of the same characters that are not versions at all."""

import pytest
from hostile import UNPARSEABLE_VERSIONS
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import InvalidVersion, Version

from sftdoctor.run.versions import at_least, in_range, version_key


def packaging_key(text):
    try:
        return Version(text)
    except (InvalidVersion, TypeError, ValueError):  # ValueError: int() of a number too long to read
        return None


SEP = st.sampled_from(["", ".", "-", "_"])
NUM = st.one_of(st.just(""), st.integers(0, 12).map(str), st.just("007"))
PRE = st.sampled_from(["a", "alpha", "b", "beta", "c", "rc", "pre", "preview", "RC", "Alpha"])
POST = st.sampled_from(["post", "rev", "r", "POST"])
LOCAL = st.lists(st.sampled_from(["cpu", "cu128", "1", "02", "git", "abc", "ubuntu", "Ab"]), min_size=1, max_size=3)


@st.composite
def spelled(draw):
    """A version as people write them: every part optional but the release, every separator PEP 440 allows."""
    text = draw(st.sampled_from(["", "v", "V", " ", "\t"]))
    if draw(st.booleans()):
        text += f"{draw(st.integers(0, 3))}!"
    text += ".".join(str(n) for n in draw(st.lists(st.integers(0, 20), min_size=1, max_size=4)))
    if draw(st.booleans()):
        text += draw(SEP) + draw(PRE) + draw(SEP) + draw(NUM)
    if draw(st.booleans()):
        text += draw(st.one_of(st.integers(0, 9).map(lambda n: f"-{n}"), st.tuples(SEP, POST, SEP, NUM).map("".join)))
    if draw(st.booleans()):
        text += draw(SEP) + draw(st.sampled_from(["dev", "DEV"])) + draw(SEP) + draw(NUM)
    if draw(st.booleans()):
        text += "+" + draw(st.sampled_from([".", "-", "_"])).join(draw(LOCAL))
    return text + draw(st.sampled_from(["", " ", "\n"]))


GARBLED = st.text(alphabet="0123456789.!+-_ vVabcdeoprstuvw☃١", max_size=14)


@pytest.mark.slow  # about 4 s
@settings(max_examples=600, deadline=None)
@given(st.one_of(spelled(), GARBLED, st.sampled_from(UNPARSEABLE_VERSIONS)))
def test_a_string_is_a_version_exactly_when_packaging_reads_it(text):
    assert (version_key(text) is None) == (packaging_key(text) is None), text


@pytest.mark.slow  # about 7 s
@settings(max_examples=600, deadline=None)
@given(spelled(), spelled())
def test_versions_sort_as_packaging_sorts_them(a, b):
    assert (version_key(a) < version_key(b)) == (Version(a) < Version(b)), (a, b)
    assert (version_key(a) == version_key(b)) == (Version(a) == Version(b)), (a, b)


@pytest.mark.parametrize(
    "lower, higher",
    [
        ("0.19.0.dev0", "0.19.0a1"),
        ("0.19.0a1", "0.19.0b1"),
        ("0.19.0b1", "0.19.0rc1"),
        ("0.19.0rc1", "0.19.0"),
        ("0.19.0", "0.19.0+cpu"),
        ("0.19.0+cpu", "0.19.0.post1"),
        ("0.19.0.post1.dev0", "0.19.0.post1"),
        ("2.13.0+abc", "2.13.0+1"),
        ("9.9", "1!0.1"),
    ],
)
def test_pep440_order(lower, higher):
    assert version_key(lower) < version_key(higher)


def test_a_leading_v_and_blanks_are_spellings_and_the_rest_of_the_hostile_list_is_not_a_version():
    assert version_key("v0.14.0") == version_key(" 0.14.0 ") == version_key("0.14") == version_key("0.14.0")
    readable = {v for v in UNPARSEABLE_VERSIONS if version_key(v) is not None}
    assert readable == {"v0.14.0", "0.14.0 "}
    assert version_key(None) is None and version_key("9" * 5000) is None


def test_ranges_and_bounds():
    assert in_range("0.18.3+cpu", "0.18.3", "0.18.4") and not in_range("0.18.3rc1", "0.18.3", "0.18.4")
    assert in_range("0.19.0rc1", None, "0.19.0") and not in_range("0.19.0.post1", None, "0.19.0")
    assert in_range("banana", None, "0.19.0") is None and at_least("banana", "1") is None
    assert at_least("4.46.0.dev0", "4.46") is False and at_least("v4.46", "4.46") is True
