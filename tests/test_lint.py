"""ruff as .ci/run runs it: the tree lints and formats clean, so a developer running pytest sees a slip too (ruff
takes well under a second here). The rules and why each was chosen: pyproject.toml [tool.ruff]."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREE = ["sftdoctor", "tests", "bench", "examples"]  # what .ci/run lints


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_the_tree_is_ruff_clean(command):
    proc = subprocess.run([sys.executable, "-m", "ruff", *command, *TREE], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"ruff {' '.join(command)} (fix: ruff format; ruff check --fix):\n{proc.stdout}{proc.stderr}"
    )
