"""One cgroup per sandboxed sample: its memory (and, where the hierarchy has them, its processes and one
CPU) limited together, its CPU time and out-of-memory kills read from outside, and all of it killed at once at
the end.

rlimits count per process: four processes under a 1 GiB RLIMIT_AS hold 4 GiB, and memfd or tmpfs pages count
against none of them. A memory cgroup counts every page its processes charge (anonymous memory, tmpfs, shared
memory, page cache), so `--workers N` times the limits is the whole cost.

Both layouts are used as they come: the unified hierarchy (v2: memory.max, pids.max, cpu.max, cpu.stat,
cgroup.kill) and the per-controller hierarchies of hybrid and v1 machines (memory.limit_in_bytes,
cpuacct.usage, pids.max). The sample's cgroups are created under the evaluator's own cgroup (so a
container's limits still count them) or, for v2, under the hierarchy's root where the evaluator's own cgroup
holds processes and so cannot have children with controllers (v2's no-internal-processes rule). Where no
cgroup with a memory limit can be made (not root, no delegation, a read-only mount), `Layout.why_not` says
why and the sandbox falls back to the per-process rlimits, saying so in its summary.

Processes join before bwrap starts: the sandbox is started through `/bin/sh`, which writes itself into the
cgroups' `cgroup.procs` and then execs bwrap (as root through `setpriv`, which drops to the sandbox's uid),
so nothing the sample forks can start outside them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"
OWN = "/proc/self/cgroup"
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Layout:
    """Where each role's cgroup is made (a parent directory), or why none can be."""

    memory: tuple[int, Path] | None = None  # (cgroup version, parent directory)
    pids: tuple[int, Path] | None = None  # None: RLIMIT_NPROC, counted in the sandbox's user namespace
    cpu: tuple[int, Path] | None = None  # v2's CPU quota (one CPU); None: no rate limit, the CPU time still counts
    usage: tuple[int, Path] | None = None  # CPU time used (v2 cpu.stat, v1 cpuacct)
    why_not: str | None = None

    @property
    def usable(self) -> bool:
        return self.why_not is None

    def describe(self) -> str:
        if not self.usable:
            return f"per process (rlimits): {self.why_not}"
        versions = sorted({f"v{role[0]}" for role in self.roles()})
        return f"per sample (cgroup {'+'.join(versions)})"

    def roles(self) -> list[tuple[int, Path]]:
        return [role for role in (self.memory, self.pids, self.cpu, self.usage) if role is not None]


def layout() -> Layout:
    """The cgroup roles this process can use, read from /proc; the answer is the same for its life."""
    try:
        mounts = _mounts(Path(MOUNTINFO).read_text())
        own = _own(Path(OWN).read_text())
    except OSError as exc:
        return Layout(why_not=f"cannot read the cgroup mounts ({exc.strerror or exc})")
    return _choose(mounts, own)


def _mounts(text: str) -> list[tuple[str, Path, str, set[str]]]:
    """(fstype, mount point, root within the hierarchy, v1 controllers) of each writable cgroup mount
    (proc(5): ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS)."""
    found = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        if "ro" in fields[5].split(","):  # a container's read-only /sys/fs/cgroup: no cgroup can be made
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        controllers = set(tail[2].split(",")) if tail[0] == "cgroup" else set()
        found.append((tail[0], point, root, controllers))
    return found


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def _own(text: str) -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _directory(point: Path, root: str, own: str | None) -> Path | None:
    if own is None or not (own == root or own.startswith(root.rstrip("/") + "/")):
        return None
    return point / own[len(root) :].lstrip("/")


def _choose(mounts, own: dict[str, str]) -> Layout:
    """The cheapest hierarchies that give a memory limit, the CPU time and the tree's processes. Joining
    costs: writing a process into v2's cgroup.procs waits for an RCU grace period (about 8 ms here, more than
    bwrap itself), while v1's `tasks` takes a single thread (the shell, before it forks) without that lock.
    So v2 is used where it has the memory controller (one join gives everything), else the v1 hierarchies.
    Processes: pids.max where v2 has it; RLIMIT_NPROC already counts per user namespace since Linux 5.14, so
    only older kernels join the v1 pids hierarchy for it. The CPU quota (one CPU) where v2 has the controller;
    the CPU time is enforced from outside either way."""
    problems: list[str] = []
    for fstype, point, root, _ in mounts:
        mine = _directory(point, root, own.get("")) if fstype == "cgroup2" else None
        parent = _v2_parent(point, mine, problems) if mine is not None else None
        if parent is not None:
            enabled = set(_read(parent / "cgroup.subtree_control").split())
            if "memory" in enabled:
                return Layout(
                    **{role: (2, parent) for role in ("memory", "pids", "cpu") if role in enabled}, usage=(2, parent)
                )  # cpu.stat's usage_usec is in every v2 cgroup
    roles: dict[str, tuple[int, Path]] = {}
    wanted = [("memory", "memory"), ("usage", "cpuacct")] + ([("pids", "pids")] if _kernel() < (5, 14) else [])
    for fstype, point, root, controllers in mounts:
        for role, needs in wanted:
            if fstype == "cgroup" and needs in controllers and role not in roles:
                mine = _directory(point, root, own.get(needs))
                if mine is not None and os.access(mine, os.W_OK):
                    roles[role] = (1, mine)
    missing = [role for role, _ in wanted if role not in roles]
    if missing:
        why = "; ".join(problems) or (
            f"no {' or '.join(missing)} controller this process may create cgroups "
            "with (run as root, or in a cgroup delegated to this user)"
        )
        return Layout(why_not=why)
    return Layout(**roles)


def _kernel() -> tuple[int, int]:
    numbers = [int(part) for part in os.uname().release.split("-")[0].split(".")[:2] if part.isdecimal()]
    return (numbers + [0, 0])[0], (numbers + [0, 0])[1]


def _v2_parent(point: Path, mine: Path, problems: list[str]) -> Path | None:
    """Where the samples' v2 cgroups go: under this process's own cgroup when that is the hierarchy's root or
    already hands controllers down, else under the root (which needs root)."""
    for candidate in (mine, point):
        if not os.access(candidate, os.W_OK):
            continue
        if candidate == point or _read(candidate / "cgroup.subtree_control").split():
            return candidate
    if not os.access(point, os.W_OK):
        problems.append(f"cgroup v2 at {point} is not writable by uid {os.geteuid()}")
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


PREFIX = "sftdoctor-sample-"


def _pid_namespace() -> int:
    """The inode of this process's PID namespace: a pid in a cgroup's name means something only within it
    (another container's evaluator may share the hierarchy)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _name() -> str:
    return f"{PREFIX}{_pid_namespace()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def sweep(found: Layout) -> int:
    """Kill and remove the sample cgroups an evaluator left when it died (SIGKILL, out of memory) before its
    own cleanup: those made in this PID namespace whose evaluator pid (in the name) is gone. A live pid,
    reused or not, is left alone, and so is every cgroup of another namespace. Returns how many went."""
    removed, namespace = 0, str(_pid_namespace())
    for parent in {role[1] for role in found.roles()}:
        try:
            names = [entry.name for entry in os.scandir(parent) if entry.name.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            fields = name[len(PREFIX) :].split("-")
            if len(fields) == 3 and fields[0] == namespace and not os.path.exists(f"/proc/{fields[1]}"):
                stale = SampleCgroup(
                    found, {role[1] / name: role[0] for role in found.roles() if (role[1] / name).is_dir()}, name
                )
                stale.kill(wait_s=2)
                stale.remove()
                removed += 1
    return removed


@dataclass
class SampleCgroup:
    """The cgroups of one sample, one per hierarchy that serves a role."""

    layout: Layout
    directories: dict[Path, int] = field(default_factory=dict)  # directory -> cgroup version
    name: str = field(default_factory=_name)

    def create(self, memory_bytes: int, processes: int) -> None:
        """Make the directories and set the limits; OSError (with everything made so far removed) when the
        kernel refuses."""
        try:
            for role in self.layout.roles():
                if role[1] / self.name not in self.directories:
                    (role[1] / self.name).mkdir()
                    self.directories[role[1] / self.name] = role[0]
            self._limit(memory_bytes, processes)
        except OSError:
            self.remove()
            raise

    def _limit(self, memory_bytes: int, processes: int) -> None:
        version, directory = self._at(self.layout.memory)
        if version == 2:
            _write(directory / "memory.max", memory_bytes)
            _write_if(directory / "memory.swap.max", 0)
            _write_if(directory / "memory.oom.group", 1)  # an OOM kill takes the whole sample
        else:
            _write(directory / "memory.limit_in_bytes", memory_bytes)
            _write_if(directory / "memory.memsw.limit_in_bytes", memory_bytes)  # no swap beyond the limit
        if self.layout.pids is not None:
            _write(self._at(self.layout.pids)[1] / "pids.max", processes)
        if self.layout.cpu is not None:  # one CPU (v2 only): N workers use at most N CPUs, whatever they spawn
            _write(self._at(self.layout.cpu)[1] / "cpu.max", f"{CPU_PERIOD_US} {CPU_PERIOD_US}")

    def _at(self, role: tuple[int, Path]) -> tuple[int, Path]:
        return role[0], role[1] / self.name

    def join_files(self) -> list[str]:
        """Where a single-threaded process writes 0 to join: v1's `tasks` (no global lock), v2's cgroup.procs."""
        return [
            str(directory / ("cgroup.procs" if version == 2 else "tasks"))
            for directory, version in self.directories.items()
        ]

    def cpu_seconds(self) -> float | None:
        if self.layout.usage is None:
            return None
        version, directory = self._at(self.layout.usage)
        if version == 2:
            for line in _read(directory / "cpu.stat").splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            return None
        text = _read(directory / "cpuacct.usage").strip()
        return int(text) / 1e9 if text.isdecimal() else None

    def oom_kills(self) -> int:
        version, directory = self._at(self.layout.memory)
        text = _read(directory / ("memory.events" if version == 2 else "memory.oom_control"))
        for line in text.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def memory_peak(self) -> int | None:
        version, directory = self._at(self.layout.memory)
        text = _read(directory / ("memory.peak" if version == 2 else "memory.max_usage_in_bytes")).strip()
        return int(text) if text.isdecimal() else None

    def pids(self) -> set[int]:
        found: set[int] = set()
        for directory in self.directories:
            found.update(int(p) for p in _read(directory / "cgroup.procs").split() if p.isdecimal())
        return found

    def kill(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every process of the sample and wait until none is left; False if some outlived wait_s.
        v2's cgroup.kill (Linux 5.14+) takes the whole tree at once; else each process is killed, again and
        again until none is left (a fork racing the kill is bounded by the process limit)."""
        for directory, version in self.directories.items():
            if version == 2 and (directory / "cgroup.kill").exists():
                _write_if(directory / "cgroup.kill", 1)
        deadline = time.monotonic() + wait_s
        while True:
            left = self.pids()
            if not left:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in left:
                self._kill(pid)
            time.sleep(0.002)

    def _kill(self, pid: int) -> None:
        """SIGKILL through a pidfd, once the process it holds is seen in this sample's cgroup: a pid read from
        cgroup.procs could have been reused by another process in between."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            if f"/{self.name}" in _read(Path(f"/proc/{pid}/cgroup")):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)

    def remove(self) -> None:
        for directory in list(self.directories):
            for _ in range(200):  # rmdir fails with EBUSY until the last process is reaped
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)
            self.directories.pop(directory, None)


def _write(path: Path, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _write_if(path: Path, value) -> None:
    """A file that only some kernels have (swap accounting, memory.oom.group)."""
    with contextlib.suppress(FileNotFoundError):
        _write(path, value)
