"""CI (.ci/run) installs every part the tests use, runs the README's test command, and there a skip for a
missing part is a failure (conftest.pytest_runtest_makereport); unit tests reach no other host."""

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _apt_packages(text: str) -> list[str]:
    match = re.search(r"apt-get install -y -qq ([^&>\n]+)", text)
    assert match, "no apt-get install line"
    return match.group(1).split()


def test_ci_installs_what_the_readme_test_command_installs_and_every_part_the_tests_need():
    ci, readme = (ROOT / ".ci/run").read_text(), (ROOT / "README.md").read_text()
    assert _apt_packages(ci) == _apt_packages(readme)
    for part in ("bubblewrap", "chromium", "slurm-wlm", "munge", "iproute2", "iptables"):
        assert part in _apt_packages(ci), part
    assert 'export CI="${CI:-true}"' in ci


SKIPPING = """
import pytest

def test_needs_a_part():
    pytest.skip("no Slurm here")
"""


@pytest.mark.parametrize("ci, outcome", [("true", "1 failed"), ("", "1 skipped")])
def test_a_skip_for_a_missing_part_fails_under_ci_and_only_there(tmp_path, ci, outcome):
    (tmp_path / "test_part.py").write_text(SKIPPING)
    (tmp_path / "conftest.py").write_text(  # the project's hook, in a project of one skipping test
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('project_conftest', {str(ROOT / 'tests' / 'conftest.py')!r})\n"
        "project = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(project)\n"
        "pytest_runtest_makereport = project.pytest_runtest_makereport\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-o",
            "addopts=",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CI": ci},
        cwd=tmp_path,
        timeout=120,
    )
    assert outcome in out.stdout, out.stdout
    if ci:
        assert "skipped under CI, where every part is installed: no Slurm here" in out.stdout


def test_a_unit_test_cannot_reach_another_host_but_loopback_works():
    with (
        socket.socket() as sock,
        pytest.raises(AssertionError, match=r"a unit test reached the network: connect\(\('192.0.2.1'"),
    ):
        sock.connect(("192.0.2.1", 80))  # TEST-NET-1: never routed
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())
