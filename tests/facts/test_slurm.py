"""The Slurm fact (facts/slurm.py): the allocation's environment, and node lists expanded as Slurm does."""

import shutil
import subprocess

import pytest

from sftdoctor.facts.slurm import expand_nodelist, probe_slurm


@pytest.mark.parametrize("text, hosts", [
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("login5", ["login5"]),
    ("a[1-2],b7,c[09-10]", ["a1", "a2", "b7", "c09", "c10"]),
    ("rack[1-2]-n[3-4]", ["rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"]),
    ("node-[001-002]", ["node-001", "node-002"]),
])
def test_node_lists_expand_as_slurm_expands_them(text, hosts):
    assert expand_nodelist(text) == hosts
    if shutil.which("scontrol"):  # the reference: Slurm's own expansion, where it is installed
        out = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            assert out.stdout.split() == hosts


def test_outside_an_allocation_there_is_no_slurm_fact(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert probe_slurm(None) is None


def test_inside_an_allocation_every_task_reads_its_node(monkeypatch):
    for name, value in {"SLURM_JOB_ID": "812", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
                        "SLURM_JOB_NODELIST": "cn[3-4]", "SLURM_GPUS_ON_NODE": "8"}.items():
        monkeypatch.setenv(name, value)
    fact = probe_slurm(None)
    assert (fact["job_id"], fact["nnodes"], fact["node_id"], fact["hosts"], fact["gpus_on_node"]) == \
        ("812", 2, 1, ["cn3", "cn4"], 8)
