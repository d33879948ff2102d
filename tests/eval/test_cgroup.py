"""The samples' cgroups: where each role goes on real machines' cgroup mounts (recorded mountinfo, cited in
tests/fixtures/cgroup/index.json, on a copy of their directory tree), and on this machine for real: the
limits written, the processes counted, the whole tree killed, nothing left behind."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sftdoctor.eval import cgroup

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"
ROOT = os.geteuid() == 0  # as CI runs: there a cgroup can always be made, so a missing one fails


def tree(tmp_path: Path, mountinfo: str, dirs: dict[str, str]) -> list:
    """The recorded mounts moved under tmp_path, with the given directories and their subtree_control."""
    text = (FIXTURES / mountinfo).read_text().replace(" /sys/fs/cgroup", f" {tmp_path}/sys/fs/cgroup")
    for directory, subtree in dirs.items():
        path = tmp_path / directory.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        if subtree is not None:
            (path / "cgroup.subtree_control").write_text(subtree)
    return cgroup._mounts(text)


def test_the_hybrid_machine_takes_memory_and_cpu_time_from_v1_where_joining_is_cheap(tmp_path, monkeypatch):
    own = cgroup._own((FIXTURES / "hybrid_sftdoctor_ci.cgroup").read_text())
    memory_own = own["memory"]
    mounts = tree(
        tmp_path,
        "hybrid_sftdoctor_ci.mountinfo",
        {
            f"sys/fs/cgroup/memory{memory_own}": None,
            "sys/fs/cgroup/pids": None,
            "sys/fs/cgroup/cpu": None,
            "sys/fs/cgroup/cpuacct": None,
            "sys/fs/cgroup/unified": "",
        },
    )
    monkeypatch.setattr(cgroup, "_kernel", lambda: (6, 18))
    found = cgroup._choose(mounts, own)
    base = tmp_path / "sys/fs/cgroup"
    assert found.memory == (1, base / f"memory{memory_own}")  # under the container's own memory cgroup
    assert found.usage == (1, base / "cpuacct") and found.pids is None and found.cpu is None
    assert found.describe() == "per sample (cgroup v1)"
    group = cgroup.SampleCgroup(found)
    group.directories = {base / "memory/x": 1, base / "cpuacct/x": 1}
    assert group.join_files() == [str(base / "memory/x/tasks"), str(base / "cpuacct/x/tasks")]  # one thread, no lock
    monkeypatch.setattr(cgroup, "_kernel", lambda: (5, 10))  # RLIMIT_NPROC counted host-wide: join pids too
    assert cgroup._choose(mounts, own).pids == (1, base / "pids")


def test_pure_v2_with_a_busy_own_cgroup_goes_under_the_root(tmp_path):
    own = {"": "/system.slice/sftdoctor.service"}
    mounts = tree(
        tmp_path,
        "talos_v2.mountinfo",
        {"sys/fs/cgroup": "cpuset cpu io memory pids", "sys/fs/cgroup/system.slice/sftdoctor.service": ""},
    )
    found = cgroup._choose(mounts, own)
    root = tmp_path / "sys/fs/cgroup"
    assert found.memory == found.pids == found.cpu == found.usage == (2, root)
    assert found.describe() == "per sample (cgroup v2)"
    # its own cgroup hands controllers down (delegated): the samples go under it, in its accounting
    (root / "system.slice/sftdoctor.service/cgroup.subtree_control").write_text("memory pids")
    found = cgroup._choose(mounts, own)
    assert found.memory == found.pids == (2, root / "system.slice/sftdoctor.service") and found.cpu is None


def test_a_read_only_or_controllerless_mount_falls_back_with_the_reason(tmp_path):
    ro = cgroup._choose(tree(tmp_path, "docker_desktop_v2_ro.mountinfo", {"sys/fs/cgroup": "memory pids"}), {"": "/"})
    assert not ro.usable and "no memory or usage controller" in ro.why_not
    assert ro.describe().startswith("per process (rlimits): ")
    v1 = cgroup._mounts((FIXTURES / "centos7_v1_excerpt.mountinfo").read_text())
    assert [(kind, str(point), controllers - {"rw"}) for kind, point, _, controllers in v1][-1] == (
        "cgroup",
        "/sys/fs/cgroup/cpu,cpuacct",
        {"cpu", "cpuacct"},
    )
    found = cgroup._choose(v1, {"cpu": "/", "cpuacct": "/"})
    assert not found.usable and "no memory or usage controller" in found.why_not


def test_mountinfo_escapes_and_foreign_roots():
    line = r"41 31 0:38 /ctr /sys/fs/cgroup/my\040unified rw,relatime - cgroup2 cgroup2 rw"
    [(kind, point, root, _)] = cgroup._mounts(line)
    assert (kind, str(point), root) == ("cgroup2", "/sys/fs/cgroup/my unified", "/ctr")
    assert cgroup._directory(point, root, "/ctr/a/b") == Path("/sys/fs/cgroup/my unified/a/b")
    assert cgroup._directory(point, root, "/other") is None  # our cgroup is not under this mount
    assert cgroup._own("0::/\n4:memory:/x/y\n1:cpu,cpuacct:/z\n") == {
        "": "/",
        "memory": "/x/y",
        "cpu": "/z",
        "cpuacct": "/z",
    }


# --- this machine ------------------------------------------------------------------------------------------


@pytest.fixture
def here():
    found = cgroup.layout()
    if not found.usable:
        assert not ROOT, f"as root, a sample cgroup must be possible here: {found.why_not}"
        pytest.skip(found.why_not)
    return found


def busy_for(group: cgroup.SampleCgroup, seconds: float) -> float:
    """Wait until the group's processes have used `seconds` of CPU (a loaded machine takes longer): its usage."""
    deadline = time.monotonic() + 30
    while (used := group.cpu_seconds()) < seconds:
        assert time.monotonic() < deadline, f"the CPU time stayed at {used} s"
        time.sleep(0.05)
    return used


def joined(group: cgroup.SampleCgroup, command: str) -> subprocess.Popen:
    files = " ".join(group.join_files())
    return subprocess.Popen(["/bin/sh", "-c", f'for f in {files}; do echo 0 > "$f"; done; {command}'])


def test_a_sample_cgroup_limits_counts_kills_and_goes(here):
    group = cgroup.SampleCgroup(here)
    group.create(64 << 20, 5)
    try:
        directories = list(group.directories)
        version, memory = group._at(here.memory)
        limit = (memory / ("memory.max" if version == 2 else "memory.limit_in_bytes")).read_text().strip()
        assert int(limit) == 64 << 20
        starter = joined(group, "sleep 100 & sleep 100 & sleep 100 & wait")
        deadline = time.monotonic() + 5
        while len(group.pids()) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(group.pids()) == 4  # the shell and its three sleeps
        assert group.cpu_seconds() < 0.2
        busy = joined(group, "while :; do :; done")
        busy_for(group, 0.3)  # counted, read from outside
        assert group.kill(wait_s=5) and group.pids() == set()
        assert starter.wait(timeout=5) == -9 and busy.wait(timeout=5) == -9
        assert group.oom_kills() == 0
    finally:
        group.remove()
    assert not any(directory.exists() for directory in directories)


def test_a_v2_cgroup_counts_cpu_time_and_kills_the_tree_at_once(here):
    """This machine's v2 hierarchy has no memory controller, but its core files work as on a v2 host: the
    CPU time from cpu.stat, the tree killed by cgroup.kill, joined through cgroup.procs."""
    unified = [
        (point, root)
        for kind, point, root, _ in cgroup._mounts(Path(cgroup.MOUNTINFO).read_text())
        if kind == "cgroup2"
    ]
    if not unified:
        assert not ROOT, "as root on this kind of machine, a cgroup2 mount is expected"
        pytest.skip("no cgroup2 mount here")
    point, root = unified[0]
    own = cgroup._directory(point, root, cgroup._own(Path(cgroup.OWN).read_text()).get(""))
    group = cgroup.SampleCgroup(cgroup.Layout(memory=here.memory, usage=(2, own)))
    group.create(64 << 20, 8)
    try:
        assert str(own / group.name / "cgroup.procs") in group.join_files()
        assert group.cpu_seconds() < 0.2
        busy = joined(group, "while :; do :; done & while :; do :; done & wait")
        busy_for(group, 0.3)
        assert group.kill(wait_s=2) and busy.wait(timeout=5) == -9 and group.pids() == set()
    finally:
        group.remove()


def test_the_cgroups_of_an_evaluator_that_died_are_swept(here):
    """An evaluator killed by SIGKILL leaves its sample's cgroup, and maybe a process in it: the next one
    removes both. A cgroup whose evaluator lives, or that another PID namespace made, is not touched."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid, now free (a reused one would count as alive: left alone)
    namespace = cgroup._pid_namespace()
    stale = cgroup.SampleCgroup(here, name=f"{cgroup.PREFIX}{namespace}-{dead.pid}-{os.urandom(4).hex()}")
    elsewhere = cgroup.SampleCgroup(here, name=f"{cgroup.PREFIX}{namespace + 1}-{dead.pid}-{os.urandom(4).hex()}")
    mine = cgroup.SampleCgroup(here)
    for group in (stale, elsewhere, mine):
        group.create(64 << 20, 8)
    try:
        left = joined(stale, "sleep 100")
        deadline = time.monotonic() + 5
        while not stale.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cgroup.sweep(here) == 1
        assert left.wait(timeout=5) == -9 and not any(d.exists() for d in stale.directories)
        assert all(d.exists() for d in [*mine.directories, *elsewhere.directories])  # another PID namespace's
    finally:
        for group in (stale, elsewhere, mine):
            group.remove()
