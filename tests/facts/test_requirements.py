"""package_requires: the Requires-Dist of the stack's libraries, read without importlib.metadata, and the small
requirement reader the api-renames check judges them with."""

import importlib.metadata

import pytest

from sftdoctor.facts.distributions import requires
from sftdoctor.facts.requirements import probe_package_requires, requirement_on, satisfies


@pytest.mark.parametrize("name", ["trl", "transformers", "peft", "accelerate", "torch"])
def test_requires_is_what_importlib_metadata_says(name):
    assert requires(name) == importlib.metadata.requires(name)


def test_the_probe_reads_the_installed_stack_and_nothing_else():
    found = probe_package_requires(None)
    assert sorted(found) == ["accelerate", "peft", "transformers", "trl"]
    assert requirement_on(found["trl"], "transformers") == (">=4.56.2", None)  # trl 1.16.0's METADATA
    assert requires("no-such-distribution") is None


@pytest.mark.parametrize(
    "lines, provider, expected",
    [
        (["transformers>=4.40.0", "accelerate"], "transformers", (">=4.40.0", None)),  # trl 0.11.4 setup.py
        (["transformers>=4.40.0", "accelerate"], "accelerate", ("", None)),  # required, no bound
        (
            ["accelerate (>=0.21.0) ; extra == 'accelerate'", "accelerate (>=0.21.0) ; extra == 'torch'"],
            "accelerate",
            (">=0.21.0", "accelerate"),
        ),  # the transformers 4.39.0 wheel: only under extras
        (['peft>=0.13.0; extra == "peft"', "transformers>=4.56.2"], "PEFT", (">=0.13.0", "peft")),
        (["numpy<2.0.0,>=1.18.2"], "numpy", ("<2.0.0,>=1.18.2", None)),
        (["torch>=1.4.0"], "transformers", None),
    ],
)
def test_requirement_on_reads_the_forms_metadata_uses(lines, provider, expected):
    assert requirement_on(lines, provider) == expected


@pytest.mark.parametrize(
    "version, spec, expected",
    [
        ("5.25.0", ">=4.56.2", True),
        ("4.50.0", ">=4.56.2", False),
        ("4.39.3", ">=4.40.0", False),
        ("1.18.5", "<2.0.0,>=1.18.2", True),
        ("2.0.0", "<2.0.0,>=1.18.2", False),
        ("1.4.2", "~=1.4", True),
        ("2.0", "~=1.4", False),
        ("1.4.9", "~=1.4.2", True),
        ("1.5.0", "~=1.4.2", False),
        ("4.46.3", "==4.*", True),
        ("5.0.0", "==4.*", False),
        ("4.46.3", "!=4.46.3", False),
        ("4.46.3", "", True),
        ("0.15.2.dev0", ">=0.15.0", True),
        (None, ">=1", None),
        ("1.0", "@ git+https://x", None),
    ],
)
def test_satisfies(version, spec, expected):
    assert satisfies(version, spec) is expected
