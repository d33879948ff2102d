"""Run a generated program in a sandbox, never in this process: bubblewrap by default (Linux), or Docker.

There is no unsandboxed mode. `available(kind)` says why a sandbox cannot be used here (None when it can),
and `sandbox(kind).run(program, limits)` runs one program to an `Outcome`:

    passed   the harness saw the program (and its test) run to the end: a token only the harness can write
             arrived on a descriptor the evaluator reads (inside.py). The exit code and the output never count.
    failed   it ended without that: an exception, a failed assertion, an exit of any kind before the end
    timeout  the wall-clock limit was reached: the whole sandbox was killed
    killed   the evaluator has evidence of a limit: the sample's cgroup out of memory, or over its CPU time
             (its processes together), or bwrap itself killed from outside. An exit code of 137 or 152, or a
             "MemoryError" printed by the program, is the program's own doing: failed.
    error    the sandbox itself could not run it (bwrap failed to set up, docker failed): not the program's fault

Limits. Each sample gets a cgroup of its own where the machine allows one (cgroup.py): memory (with tmpfs
and shared memory pages) for all of its processes together, and where the hierarchy has them its processes
and one CPU; its CPU time read from outside, and the whole tree killed at the end of every sample, however
it ended. The rlimits (CPU time,
address space, processes, file size, open files, no core dumps) are set in every case by the sandboxed
interpreter's first lines, soft = hard so that they cannot be raised. RLIMIT_NPROC counts per user namespace
(Linux 5.14+), so it counts this sandbox's processes; it does not bind uid 0, so bwrap runs as nobody.
Where no cgroup can be made, the rlimits are the limits, per process: `isolation()` says which.

A seccomp filter (seccomp.py) refuses what reaches past the walls: ptrace and the other ways into another
process (bubblewrap's PID 1 runs with the sample's uid), the kernel keyring, io_uring, memfd, new namespaces.
The sandbox has no /proc: nothing of PID 1's memory or descriptors to open. docs/sandbox.md is the threat model.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import platform
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from sftdoctor.eval import cgroup, seccomp

STATUSES = ("passed", "failed", "timeout", "killed", "error")
KINDS = ("bubblewrap", "docker")
NOBODY = 65534


# bwrap's namespaces and privileges (Bubblewrap.command).
BWRAP_ISOLATION = (
    # A user namespace: the program is an unprivileged uid inside, with no capabilities on the host,
    # and RLIMIT_NPROC counts the processes of this sandbox only.
    "--unshare-user",
    "--uid",
    str(NOBODY),
    "--gid",
    str(NOBODY),
    "--disable-userns",  # no nested user namespace, where it would hold all capabilities (attack surface)
    "--unshare-pid",  # its own PID namespace: it sees no host process, and all of it dies with its init
    "--unshare-net",  # no network: a namespace with only its own loopback (not the host's 127.0.0.1)
    "--unshare-ipc",  # no host SysV IPC or POSIX message queues
    "--unshare-uts",
    "--hostname",
    "sandbox",
    "--unshare-cgroup-try",  # its cgroup path is not the host's
    "--die-with-parent",  # SIGKILL to the sandbox if bwrap (or this evaluator) dies
    "--new-session",  # setsid: no controlling terminal, so no TIOCSTI keystrokes into the user's shell
    "--cap-drop",
    "ALL",  # when bwrap itself runs with privileges: none for the program
)
# The sample's whole environment.
BWRAP_ENVIRONMENT = (
    "--clearenv",
    "--setenv",
    "PATH",
    "/usr/bin:/bin",
    "--setenv",
    "HOME",
    "/tmp",
    "--setenv",
    "LANG",
    "C.UTF-8",
    "--setenv",
    "PYTHONDONTWRITEBYTECODE",
    "1",
)
INSTALL_BUBBLEWRAP = "apt-get install bubblewrap (dnf install bubblewrap; pacman -S bubblewrap)"
# The first interpreter that lives under /usr is used: /usr is bound read-only anyway, and an interpreter
# under a home directory (pyenv, conda) would need part of the home bound into the sandbox.
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
MARK = "# sftdoctor sandbox"  # in the argv of every sandboxed interpreter: `ps` shows what is ours
SOURCE_NAME, TEST_NAME = "/sandbox/main.py", "/sandbox/test.py"
_INSIDE = Path(__file__).with_name("inside.py").read_text(encoding="utf-8")
HARNESS = _INSIDE[_INSIDE.index('"""', 3) + 3 :].lstrip()  # its docstring is for readers, not for `ps`
# A JSON status line of bwrap's is small; more than this on its status pipe is not bwrap's.
STATUS_CAP = 1 << 16


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # wall clock, from outside: the whole sandbox is killed past it
    cpu_s: int = 10  # CPU time: of all the sample's processes (its cgroup), else RLIMIT_CPU of each
    memory_bytes: int = 1 << 30  # the cgroup's memory (all processes, tmpfs included) and each's RLIMIT_AS
    processes: int = 32  # the cgroup's pids.max and RLIMIT_NPROC (its own user namespace); threads count too
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE: no single file written larger
    tmp_bytes: int = 64 << 20  # size of the private /tmp, the only writable place
    output_bytes: int = 64 << 10  # kept of stdout and of stderr each (the last bytes); the rest read and dropped

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")

    def rlimits(self, processes: bool = True) -> list[tuple[str, int, int]]:
        """(RLIMIT name, soft, hard) as the harness sets them."""
        cpu = max(1, int(self.cpu_s))
        limits = [
            ("RLIMIT_CPU", cpu, cpu + 1),
            ("RLIMIT_AS", self.memory_bytes, self.memory_bytes),
            ("RLIMIT_FSIZE", self.file_bytes, self.file_bytes),
            ("RLIMIT_CORE", 0, 0),
            ("RLIMIT_NOFILE", 256, 256),
        ]
        if processes:
            limits.append(("RLIMIT_NPROC", self.processes, self.processes))
        return limits


@dataclass(frozen=True)
class Program:
    """What one sample runs: `source`, then (HumanEval) `test` compiled on its own and `check(entry_point)`.
    Without a test, the source running to its end is the pass."""

    source: str
    test: str | None = None
    entry_point: str | None = None

    def job(self, token: str) -> bytes:
        """What the harness reads on stdin: marshal (no import to pay for inside; the format of str, tuple and
        None has not changed since Python 3.4, so another Python in a Docker image reads it too)."""
        return marshal.dumps((token, self.source, self.test, self.entry_point), 4)


@dataclass
class Outcome:
    status: str  # one of STATUSES
    exit_code: int | None
    signal: int | None  # a signal the evaluator knows was sent (its own kill, or bwrap killed from outside)
    stdout: str  # the last Limits.output_bytes of each stream
    stderr: str
    wall_s: float
    error: str | None = None  # one line: the exception, the limit, why the sandbox failed
    dropped_bytes: int = 0  # output read beyond the caps and discarded (both streams)
    cpu_s: float | None = None  # CPU time of all its processes (with a cgroup)
    memory_peak_bytes: int | None = None  # the cgroup's peak memory (with a cgroup)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> dict:
        return asdict(self)


class Sandbox(Protocol):
    name: str

    def available(self) -> str | None:
        """Why this sandbox cannot run here, or None."""

    def isolation(self) -> str:
        """How the limits bind (per sample or per process) and what filters system calls, in a few words."""

    def run(self, program: Program | str, limits: Limits, cancel: Cancel | None = None) -> Outcome:
        """Run a Python program to its outcome; never raises for anything the program does. When `cancel` is
        set, the sandbox is killed at once (status error)."""


class Cancel:
    """Set once, seen at once by every run given it (a byte in a pipe each run's wait also watches): the
    evaluation was interrupted, so each run kills its sandbox's whole tree and returns."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()

    def set(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.write_fd, b"x")

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


def harness(limits: Limits, status_fd: int, processes: bool = True) -> str:
    """The text the sandboxed interpreter runs (-c): inside.py, then its main()."""
    return f"{MARK}\n{HARNESS}\nmain({limits.rlimits(processes)!r}, {status_fd}, {SOURCE_NAME!r}, {TEST_NAME!r})\n"


def sandbox(kind: str) -> Sandbox:
    if kind == "bubblewrap":
        return Bubblewrap()
    if kind == "docker":
        return Docker()
    raise ValueError(f"unknown sandbox {kind!r}; expected one of {', '.join(KINDS)}")


def available(kind: str) -> str | None:
    """Why the sandbox `kind` cannot be used on this machine (what to install), or None when it can."""
    if kind not in KINDS:
        return f"unknown sandbox {kind!r}; expected one of {', '.join(KINDS)}"
    return sandbox(kind).available()


def _program(program: Program | str) -> Program:
    return Program(program) if isinstance(program, str) else program


class Bubblewrap:
    """bwrap: namespaces and bind mounts, no daemon, no root needed. The program is copied into the sandbox
    (--ro-bind-data), not bound from the host; the job (token, sources) comes on stdin."""

    name = "bubblewrap"

    def __init__(self, python: str | None = None):
        self.python = python or interpreter()

    def available(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return "bubblewrap needs Linux; use --sandbox docker where a Docker daemon is reachable"
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            return f"bubblewrap (bwrap) not found on PATH: install it: {INSTALL_BUBBLEWRAP}"
        if self.python is None:
            return f"no python3 under /usr for the sandbox to run (looked for {', '.join(SYSTEM_PYTHONS)})"
        if seccomp.program() is None:
            return (
                f"no system-call filter for this machine's architecture ({platform.machine()}; sftdoctor's "
                f"table covers {', '.join(seccomp.ARCHES)}): use --sandbox docker"
            )
        return _bwrap_probe(bwrap, self.python)

    def isolation(self) -> str:
        return f"limits {layout().describe()}; seccomp filter, no /proc"

    def command(self, limits: Limits, fds: dict[str, int]) -> list[str]:
        """The bwrap argv; fds: source, test (files copied in), seccomp (the filter), status (the token's way
        out), json (bwrap's own status: the program's exit code, told apart from a failed setup)."""
        python = os.path.realpath(self.python)
        return [
            shutil.which("bwrap") or "bwrap",
            *BWRAP_ISOLATION,
            *BWRAP_ENVIRONMENT,
            *self._mounts(python, limits, fds),
            "--chdir",
            "/tmp",
            "--seccomp",
            str(fds["seccomp"]),
            "--json-status-fd",
            str(fds["json"]),
            "--",
            # -I: isolated (no PYTHON* variables, no user site, no script dir on sys.path); -S: no site-packages.
            python,
            "-I",
            "-S",
            "-c",
            harness(limits, fds["status"]),
        ]

    @staticmethod
    def _mounts(python: str, limits: Limits, fds: dict[str, int]) -> list[str]:
        """What the sandbox sees: the system read-only, a bounded /tmp, the sample and its test."""
        return [
            # The system read-only: /usr (with the interpreter and its standard library) and the usual
            # symlinks or directories; nothing of /etc but the linker's cache, no home, no /root, no /work.
            "--ro-bind",
            "/usr",
            "/usr",
            *_lib_links(),
            "--ro-bind-try",
            "/etc/ld.so.cache",
            "/etc/ld.so.cache",
            *_prefix_bind(python),
            # No /proc: PID 1 (bwrap's init, the sample's uid) has no memory or fd files to open.
            "--dev",
            "/dev",
            "--remount-ro",
            "/dev",  # null, zero, urandom, ...; /dev/shm is not writable
            # The only writable place: a fresh tmpfs of bounded size (RLIMIT_FSIZE bounds each file in it).
            "--size",
            str(limits.tmp_bytes),
            "--tmpfs",
            "/tmp",
            "--perms",
            "0444",
            "--ro-bind-data",
            str(fds["source"]),
            SOURCE_NAME,
            "--perms",
            "0444",
            "--ro-bind-data",
            str(fds["test"]),
            TEST_NAME,
            "--remount-ro",
            "/",  # bwrap's own root tmpfs, where the mount points live: read-only too
        ]

    def run(self, program: Program | str, limits: Limits, cancel: Cancel | None = None) -> Outcome:
        program = _program(program)
        start = time.monotonic()
        token = secrets.token_hex(16)
        group = None
        if layout().usable:
            group = cgroup.SampleCgroup(layout())
            try:
                group.create(limits.memory_bytes, limits.processes + 2)  # + bwrap and its PID 1
            except OSError as exc:
                return _error(f"cannot make the sample's cgroup: {exc}", start)
        try:
            with _Files(program, token) as files:
                try:
                    proc = subprocess.Popen(
                        _joining(group) + self.command(limits, files.fds),
                        stdin=files.job,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        pass_fds=files.passed,
                        start_new_session=True,  # its own process group
                        env={},
                        cwd="/",
                        **({} if group else _unprivileged()),
                    )
                except OSError as exc:
                    return _error(f"cannot start bwrap: {exc}", start)
                files.close_child_ends()
                reaper = _BwrapReaper(proc, group)
                return _Execution(proc, limits, start, token.encode(), reaper, group, cancel).finish(
                    files.status_r, files.json_r
                )
        finally:
            if group is not None:
                group.remove()


class _Files:
    """The descriptors one bwrap run needs: the job on stdin (an unlinked file), the source and test files it
    copies in, the seccomp filter, and two pipes out (the token, bwrap's JSON status)."""

    def __init__(self, program: Program, token: str):
        self.program, self.token = program, token
        self.opened: list = []
        self.fds: dict[str, int] = {}

    def __enter__(self):
        self.job = self._file(self.program.job(self.token))
        self.fds["source"] = self._file(self.program.source.encode("utf-8", errors="replace")).fileno()
        self.fds["test"] = self._file((self.program.test or "").encode("utf-8", errors="replace")).fileno()
        read, write = os.pipe()
        os.write(write, seccomp.program())  # a few hundred bytes: within the pipe's buffer
        os.close(write)
        self.fds["seccomp"] = read
        self.status_r, self.fds["status"] = os.pipe()
        self.json_r, self.fds["json"] = os.pipe()
        self.child_ends = [self.fds["seccomp"], self.fds["status"], self.fds["json"]]
        self.passed = tuple(self.fds.values())
        return self

    def _file(self, data: bytes):
        f = tempfile.TemporaryFile()  # noqa: SIM115 - the child reads it; closed with the others in __exit__
        self.opened.append(f)
        f.write(data)
        f.flush()
        f.seek(0)
        return f

    def close_child_ends(self) -> None:
        for fd in self.child_ends:
            os.close(fd)
        self.child_ends = []

    def __exit__(self, *exc) -> None:
        self.close_child_ends()
        for f in self.opened:
            f.close()


def _joining(group: cgroup.SampleCgroup | None) -> list[str]:
    """The argv prefix that puts the sandbox in the sample's cgroups before bwrap starts: a shell (one thread)
    writes itself into each, then execs bwrap (through setpriv as nobody when this is root, since uid
    0 is exempt from RLIMIT_NPROC)."""
    if group is None:
        return []
    script = (
        'for f do [ "$f" = -- ] && break; echo 0 > "$f" || { echo "sftdoctor: cannot join $f" >&2; '
        'exit 125; }; shift; done; shift; exec "$@"'
    )
    argv = ["/bin/sh", "-c", script, "sh", *group.join_files(), "--"]
    if os.geteuid() == 0:
        argv += [
            shutil.which("setpriv") or "setpriv",
            "--reuid",
            str(NOBODY),
            "--regid",
            str(NOBODY),
            "--clear-groups",
            "--",
        ]
    return argv


@lru_cache(maxsize=1)
def layout() -> cgroup.Layout:
    """The cgroups this process can give samples (with root, setpriv is needed too, to drop to nobody), once
    the cgroups of evaluators that died before their cleanup are swept."""
    found = cgroup.layout()
    if found.usable and os.geteuid() == 0 and shutil.which("setpriv") is None:
        return cgroup.Layout(why_not="setpriv (util-linux) not found: it drops the sandbox to nobody inside a cgroup")
    if found.usable:
        cgroup.sweep(found)
    return found


class _BwrapReaper:
    """Kills a bwrap sandbox's whole tree: the cgroup where there is one, else bwrap's PID 1 through a pidfd
    (the kernel then kills every process of its PID namespace), and bwrap's process group."""

    def __init__(self, proc: subprocess.Popen, group: cgroup.SampleCgroup | None):
        self.proc, self.group, self.init_fd = proc, group, None

    def saw_child(self, pid: int) -> None:
        """bwrap reported its PID 1: hold it by a pidfd, checked to be bwrap's child (so not a reused pid)."""
        if self.group is not None or self.init_fd is not None:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        if _parent(pid) == self.proc.pid:
            self.init_fd = fd
        else:
            os.close(fd)

    def kill(self) -> None:
        if self.group is not None:
            self.group.kill()
        elif self.init_fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.init_fd, signal.SIGKILL)
        _killpg(self.proc)

    def close(self) -> None:
        if self.init_fd is not None:
            os.close(self.init_fd)
            self.init_fd = None


def _parent(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]) if len(fields) > 1 else None


class Docker:
    """The docker CLI: no network, a read-only root with a tmpfs /tmp, memory, PID and CPU limits for the
    container (its cgroup), sftdoctor's seccomp profile, no capabilities, no new privileges, nobody's uid. The
    job goes in on stdin; the token comes back on stdout, where the evaluator looks for it in everything
    read. The container is removed at the end of every sample, however it ended."""

    name = "docker"

    def __init__(self, image: str = "python:3.12-slim", python: str = "python3"):
        self.image, self.python = image, python

    def available(self) -> str | None:
        docker = shutil.which("docker")
        if docker is None:
            return (
                "docker not found on PATH: install Docker and start its daemon, or use the default "
                f"--sandbox bubblewrap ({INSTALL_BUBBLEWRAP})"
            )
        try:
            done = subprocess.run(
                [docker, "info", "--format", "{{.ServerVersion}}"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
                return f"no Docker daemon reachable (docker info: {why})"
            # Runs never pull (a pull would eat the wall-clock limit): the image must be here already.
            image = subprocess.run(
                [docker, "image", "inspect", self.image],
                capture_output=True,
                timeout=20,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"no Docker daemon reachable ({exc})"
        if image.returncode != 0:
            return f"the image {self.image} is not on this Docker host: docker pull {self.image}"
        return None

    def isolation(self) -> str:
        return "limits per sample (the container's cgroup); sftdoctor's seccomp profile"

    def command(self, limits: Limits, name: str, profile: str) -> list[str]:
        memory = str(limits.memory_bytes)  # the container's cgroup: every process, tmpfs included
        cpu = max(1, int(limits.cpu_s))
        return [
            shutil.which("docker") or "docker",
            "run",
            "--rm",
            "-i",
            "--name",
            name,
            "--network",
            "none",  # no network at all
            "--read-only",
            "--tmpfs",
            f"/tmp:rw,nosuid,nodev,size={limits.tmp_bytes}",  # /tmp the only writable place
            "--memory",
            memory,
            "--memory-swap",
            memory,  # no swap beyond the memory limit
            "--pids-limit",
            str(limits.processes),  # the cgroup's PID limit (RLIMIT_NPROC would count host-wide)
            "--cpus",
            "1",  # one CPU per sample, as under bubblewrap
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--security-opt",
            f"seccomp={profile}",
            "--user",
            f"{NOBODY}:{NOBODY}",
            "--workdir",
            "/tmp",
            "--env",
            "HOME=/tmp",
            "--ulimit",
            f"cpu={cpu}:{cpu + 1}",
            "--ulimit",
            f"fsize={limits.file_bytes}",
            "--ulimit",
            "core=0",
            "--ipc",
            "none",
            "--pull",
            "never",
            self.image,
            self.python,
            "-I",
            "-S",
            "-c",
            harness(limits, 1, processes=False),
        ]

    def run(self, program: Program | str, limits: Limits, cancel: Cancel | None = None) -> Outcome:
        program = _program(program)
        start = time.monotonic()
        name = f"sftdoctor-eval-{uuid.uuid4().hex[:12]}"
        token = secrets.token_hex(16)
        with tempfile.TemporaryFile() as job, tempfile.NamedTemporaryFile("w", suffix=".json") as profile:
            json.dump(seccomp.docker_profile(), profile)
            profile.flush()
            job.write(program.job(token))
            job.flush()
            job.seek(0)
            try:
                proc = subprocess.Popen(
                    self.command(limits, name, profile.name),
                    stdin=job,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as exc:
                return _error(f"cannot start docker: {exc}", start)
            outcome = _Execution(proc, limits, start, token.encode(), _DockerReaper(proc, name), None, cancel).finish(
                None, None
            )
        if outcome.exit_code == 125 and outcome.status == "failed":  # docker's own failure (no image, bad flag)
            outcome.status, outcome.error = "error", f"docker run failed: {outcome.error}"
        return outcome


class _DockerReaper:
    """Killing the CLI would leave the container running: it is removed by name (`docker rm -f`)."""

    def __init__(self, proc: subprocess.Popen, name: str):
        self.proc, self.name = proc, name

    def saw_child(self, pid: int) -> None:
        pass

    def kill(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [shutil.which("docker") or "docker", "rm", "-f", self.name],
                capture_output=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        _killpg(self.proc)

    def close(self) -> None:
        pass


def interpreter() -> str | None:
    """The Python the sandbox runs: the system's (under /usr), else this one's base interpreter (its prefix
    is then bound read-only)."""
    for path in SYSTEM_PYTHONS:
        if os.access(path, os.X_OK):
            return path
    base = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return base if os.access(base, os.X_OK) else None


def _lib_links() -> list[str]:
    """/bin, /lib, /lib64, /sbin as on the host: symlinks into /usr (merged /usr), or read-only binds."""
    args = []
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    return args


def _prefix_bind(python: str) -> list[str]:
    """An interpreter outside /usr needs its installation prefix (and only that) bound read-only."""
    if python.startswith("/usr/"):
        return []
    prefix = os.path.dirname(os.path.dirname(python))
    return ["--ro-bind", prefix, prefix]


def _unprivileged() -> dict:
    """As root, start bwrap as nobody: uid 0 is exempt from RLIMIT_NPROC even inside a user namespace."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    return {}


@lru_cache(maxsize=8)
def _bwrap_probe(bwrap: str, python: str) -> str | None:
    """One trivial run: bwrap can be on PATH and still unable to create namespaces here."""
    outcome = Bubblewrap(python).run("pass", Limits(wall_s=30))
    if outcome.passed:
        return None
    why = outcome.error or outcome.status
    if why.startswith("cannot make the sample's cgroup"):
        return f"bubblewrap cannot run here: {why}"
    return (
        f"bubblewrap cannot create a sandbox here ({why}): it needs unprivileged user namespaces "
        "(sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0)"
    )


def _killpg(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class _Tail:
    """The last `cap` bytes of a stream; what falls off the front is only counted."""

    def __init__(self, cap: int):
        self.cap, self.data, self.dropped = cap, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * self.cap:  # trim in batches: amortised O(1) per byte
            self.dropped += len(self.data) - self.cap
            del self.data[: -self.cap]

    def text(self) -> str:
        if len(self.data) > self.cap:
            self.dropped += len(self.data) - self.cap
            del self.data[: -self.cap]
        return self.data.decode("utf-8", errors="replace")


class _Token:
    """Whether the token went by in a stream, however it was cut into reads (a rolling window of its length)."""

    def __init__(self, token: bytes):
        self.token, self.window, self.seen = token, b"", False

    def add(self, chunk: bytes) -> None:
        if not self.seen:
            data = self.window + chunk
            self.seen = self.token in data
            self.window = data[-(len(self.token) - 1) :]


class _Execution:
    """One sandboxed run, from start to its outcome: read the streams until the sandbox's first process ends
    or a limit is reached, kill everything left, read what was written before the kill, classify."""

    def __init__(
        self,
        proc: subprocess.Popen,
        limits: Limits,
        start: float,
        token: bytes,
        reaper,
        group: cgroup.SampleCgroup | None,
        cancel: Cancel | None,
    ):
        self.proc, self.limits, self.start, self.reaper, self.group = proc, limits, start, reaper, group
        self.cancel = cancel
        self.out, self.err = _Tail(limits.output_bytes), _Tail(limits.output_bytes)
        self.token = _Token(token)
        self.status = bytearray()
        self.reason: str | None = None  # "timeout", "cpu" or "cancelled": the evaluator's own kill
        # how fast its CPU time can grow: one CPU under the cgroup's quota, else every CPU of the machine
        self.cpus = 1 if group is None or group.layout.cpu else (os.cpu_count() or 1)

    def finish(self, token_fd: int | None, status_fd: int | None) -> Outcome:
        selector = selectors.DefaultSelector()
        sinks = {self.proc.stdout.fileno(): self._stdout, self.proc.stderr.fileno(): self.err.add}
        if token_fd is not None:
            sinks[token_fd] = self.token.add
        if status_fd is not None:
            sinks[status_fd] = self._status
        for fd in sinks:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        exited = os.pidfd_open(self.proc.pid)  # readable when the sandbox's launcher (bwrap, docker) exits
        selector.register(exited, selectors.EVENT_READ)
        if self.cancel is not None:
            selector.register(self.cancel.read_fd, selectors.EVENT_READ)
        try:
            try:
                self._watch(selector, sinks, exited)
            finally:
                self.reaper.kill()  # whatever is left, however the wait ended: daemons included
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _killpg(self.proc)
                self.proc.wait()
            _drain_all(selector, sinks)
        finally:
            selector.close()
            os.close(exited)
            self.reaper.close()
            self.proc.stdout.close()
            self.proc.stderr.close()
            for fd in (token_fd, status_fd):
                if fd is not None:
                    os.close(fd)
        return self._outcome(status_fd is not None)

    def _stdout(self, chunk: bytes) -> None:
        self.token.add(chunk)  # Docker's token comes on stdout (under bwrap it never does)
        self.out.add(chunk)

    def _status(self, chunk: bytes) -> None:
        if len(self.status) < STATUS_CAP:
            self.status.extend(chunk)
            pid = _child_pid(self.status)
            if pid is not None:
                self.reaper.saw_child(pid)

    def _watch(self, selector, sinks, exited: int) -> None:
        deadline = self.start + self.limits.wall_s
        cpu_check = (
            self.start + self.limits.cpu_s / self.cpus
            if self.group is not None and self.group.cpu_seconds() is not None
            else None
        )
        while True:
            now = time.monotonic()
            if now >= deadline:
                self.reason = "timeout"
                return
            if cpu_check is not None and now >= cpu_check:
                used = self.group.cpu_seconds() or 0.0
                if used >= self.limits.cpu_s:
                    self.reason = "cpu"
                    return
                cpu_check = now + max(0.02, (self.limits.cpu_s - used) / self.cpus)  # not sooner than that
            wake = min(deadline, cpu_check) if cpu_check is not None else deadline
            for key, _ in selector.select(timeout=max(0.0, wake - now)):
                if key.fd == exited:
                    return
                if self.cancel is not None and key.fd == self.cancel.read_fd:
                    self.reason = "cancelled"
                    return
                _drain(key.fd, sinks[key.fd], selector)

    def _outcome(self, bwrap: bool) -> Outcome:
        wall = round(time.monotonic() - self.start, 3)
        exit_code = _exit_code(self.status) if bwrap else self.proc.returncode
        cpu_s = self.group.cpu_seconds() if self.group else None
        peak = self.group.memory_peak() if self.group else None
        stdout = self.out.text().replace(self.token.token.decode(), "")
        stderr = self.err.text()
        status, signal_, error = self._classify(exit_code, cpu_s, stderr)
        return Outcome(
            status,
            exit_code,
            signal_,
            stdout,
            stderr,
            wall,
            error,
            self.out.dropped + self.err.dropped,
            None if cpu_s is None else round(cpu_s, 3),
            peak,
        )

    def _classify(self, exit_code: int | None, cpu_s: float | None, stderr: str):
        """(status, signal, error line): passed only on the token; killed only on the evaluator's evidence."""
        limits, returncode = self.limits, self.proc.returncode
        if self.token.seen:
            return "passed", None, None
        if self.reason == "cancelled":
            return "error", int(signal.SIGKILL), "cancelled: the evaluation was interrupted, the sandbox killed"
        if self.reason == "timeout":
            return (
                "timeout",
                int(signal.SIGKILL),
                f"wall-clock limit of {limits.wall_s:g} s reached: the sandbox was killed",
            )
        if self.group is not None and self.group.oom_kills():
            limit = f"{limits.memory_bytes / (1 << 20):g} MiB"
            return "killed", int(signal.SIGKILL), f"out of memory: its processes together reached the limit of {limit}"
        if self.reason == "cpu" or (cpu_s is not None and cpu_s >= limits.cpu_s):
            return (
                "killed",
                int(signal.SIGKILL) if self.reason == "cpu" else None,
                f"CPU-time limit of {limits.cpu_s} s reached (all its processes together): the sandbox was killed",
            )
        if returncode is not None and returncode < 0:  # the launcher killed by someone else
            return "killed", -returncode, f"the sandbox was killed by {_signal_name(-returncode)} from outside"
        if exit_code is None:
            return "error", None, _last_line(stderr) or f"the sandbox failed (exit code {returncode})"
        return "failed", None, _failure(exit_code, stderr)


def _failure(exit_code: int, stderr: str) -> str:
    """Why a program that ended on its own did not pass, in one line."""
    if exit_code == 0:
        return "exited with code 0 before the test ran to its end (an exit is not a pass)"
    line = _last_line(stderr)
    if 128 < exit_code < 128 + signal.NSIG:
        number = exit_code - 128
        why = {signal.SIGXCPU: ", the CPU-time limit", signal.SIGXFSZ: ", the file-size limit"}.get(number, "")
        guess = (
            f"exit code {exit_code}: killed by {_signal_name(number)}{why}, or an exit code of its own "
            "(the sandbox cannot tell which)"
        )
        return f"{line} ({guess})" if line else guess
    return line or f"exit code {exit_code}"


def _drain(fd: int, sink, selector, final: bool = False) -> None:
    """Read what is there without blocking; unregister at end of file (or, when final, when nothing is left)."""
    for _ in range(64):  # bounded, so one busy stream cannot starve the deadline check
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            if final:
                selector.unregister(fd)
            return
        if not chunk:
            selector.unregister(fd)
            return
        sink(chunk)
    if final:
        selector.unregister(fd)


def _drain_all(selector, sinks, wait_s: float = 2.0) -> None:
    """After the kill: what was written before it, until every stream closes (its writers are dead) or wait_s."""
    for key in list(selector.get_map().values()):
        if key.fd not in sinks:  # the launcher's pidfd, the cancel pipe
            selector.unregister(key.fd)
    deadline = time.monotonic() + wait_s
    while selector.get_map() and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
            _drain(key.fd, sinks[key.fd], selector)


def _status_docs(status: bytearray) -> list[dict]:
    docs = []
    for line in bytes(status).decode("utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def _child_pid(status: bytearray) -> int | None:
    return next((d["child-pid"] for d in _status_docs(status) if isinstance(d.get("child-pid"), int)), None)


def _exit_code(status: bytearray) -> int | None:
    """The program's exit code as bwrap reports it; None when bwrap never ran it (a failed setup)."""
    return next((d["exit-code"] for d in _status_docs(status) if isinstance(d.get("exit-code"), int)), None)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_line(text: str) -> str | None:
    """The exception line of a traceback (its last unindented line), else the last line."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    exception = [line for line in lines if not line[0].isspace() and not line.startswith("Traceback (")]
    chosen = (exception or lines or [None])[-1]
    return chosen.strip()[:500] if chosen else None


def _error(message: str, start: float) -> Outcome:
    return Outcome("error", None, None, "", "", round(time.monotonic() - start, 3), message)
