"""The Slurm fact (facts/slurm.py): the allocation's environment, and node lists expanded as Slurm does.

The reference is Slurm's own `scontrol show hostnames`, which needs a slurm.conf but no running daemon: the
fixture writes a minimal one. Slurm answers a list it refuses with "Invalid hostlist" on stderr, nothing on
stdout and exit code 0 (22.05 as Debian 12 ships it)."""

import string
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm import require_slurm

from sftdoctor.facts.slurm import expand_nodelist, hostnames, probe_slurm


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    """`scontrol show hostnames`, as a function of the list: Slurm's hosts, or None where it refuses the list."""
    require_slurm("scontrol")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n"
    )

    def expand(text):
        out = subprocess.run(
            ["scontrol", "show", "hostnames", text],
            capture_output=True,
            text=True,
            timeout=10,
            env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"},
        )
        assert "Could not establish a configuration source" not in out.stderr, out.stderr
        return out.stdout.split() or None

    return expand


VALID = [
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("login5", ["login5"]),
    ("a[1-2],b7,c[09-10]", ["a1", "a2", "b7", "c09", "c10"]),
    ("rack[1-2]-n[3-4]", ["rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"]),
    ("node-[001-002]", ["node-001", "node-002"]),
    ("a[9-11]", ["a9", "a10", "a11"]),
    ("a[1-2] b3", ["a1", "a2", "b3"]),
]
REFUSED = ["a[3-1]", "a[1-2]x", "a[1-2]-x", "a[[1]]", "a[]", "a[x-y]", "a[1,,2]", "a[-2]"]


@pytest.mark.parametrize("text, hosts", VALID)
def test_node_lists_expand_as_slurm_expands_them(text, hosts, scontrol):
    assert expand_nodelist(text) == hosts
    assert scontrol(text) == hosts


@pytest.mark.parametrize("text", REFUSED)
def test_a_list_slurm_refuses_is_refused_not_guessed(text, scontrol):
    assert scontrol(text) is None
    with pytest.raises(ValueError):
        expand_nodelist(text)


NAME = st.text(string.ascii_lowercase + "-", min_size=1, max_size=4).filter(lambda s: s[0] != "-")


@st.composite
def node_lists(draw):
    """Lists of names with bracket groups, valid ones and the ways Slurm refuses one (backwards range, text
    after the group)."""
    names = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(NAME)
        for _ in range(draw(st.integers(0, 2))):
            pieces = []
            for _ in range(draw(st.integers(1, 2))):
                low, span, width = draw(st.integers(0, 30)), draw(st.integers(-2, 3)), draw(st.integers(1, 3))
                pieces.append(str(low).zfill(width) + ("" if span == 0 else f"-{low + span}"))
            name += "[" + ",".join(pieces) + "]" + draw(st.sampled_from(["", "", "x"]))
        names.append(name)
    return ",".join(names)


@settings(max_examples=150, deadline=None)
@given(node_lists())
def test_any_node_list_expands_as_scontrol_does_or_is_refused_as_it_is(scontrol, text):
    expected = scontrol(text)
    if expected is None:
        with pytest.raises(ValueError):
            expand_nodelist(text)
    else:
        assert expand_nodelist(text) == expected


def test_an_unreadable_node_list_gives_no_hosts_and_says_why(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: the parser is the only reader
    hosts, how = hostnames("gpu[4-2]")
    assert hosts == [] and "unreadable SLURM_JOB_NODELIST 'gpu[4-2]'" in how and "backwards range" in how


def test_outside_an_allocation_there_is_no_slurm_fact(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert probe_slurm(None) is None


def test_inside_an_allocation_every_task_reads_its_node(monkeypatch):
    for name, value in {
        "SLURM_JOB_ID": "812",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "cn[3-4]",
        "SLURM_GPUS_ON_NODE": "8",
    }.items():
        monkeypatch.setenv(name, value)
    fact = probe_slurm(None)
    assert (fact["job_id"], fact["nnodes"], fact["node_id"], fact["hosts"], fact["gpus_on_node"]) == (
        "812",
        2,
        1,
        ["cn3", "cn4"],
        8,
    )
