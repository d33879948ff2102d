"""Run a generated program in a sandbox, never in this process: bubblewrap by default (Linux), or Docker.

There is no unsandboxed mode. `available(kind)` says why a sandbox cannot be used here (None when it can),
and `sandbox(kind).run(program, limits)` runs one program to an `Outcome`:

    passed   exit code 0
    failed   another exit code (an AssertionError, a SyntaxError, a MemoryError from the address-space limit)
    timeout  the wall-clock limit was reached: the whole sandbox was killed
    killed   ended by a signal (the CPU-time limit's SIGXCPU, a SIGKILL it sent itself)
    error    the sandbox itself could not run it (bwrap failed to set up, docker failed): not the program's fault

Limits. The resource limits (CPU time, address space, processes, file size, no core dumps) are set by the
sandboxed interpreter itself, by the first lines it runs (PROLOGUE) before it compiles the program, with
soft = hard so that the program cannot raise them. Setting them there, after bwrap has created the user
namespace, matters for RLIMIT_NPROC: since Linux 5.14 it is counted per user namespace, so the limit
counts this sandbox's processes, not every process of the user (which a prlimit around bwrap would do,
and which parallel workers would then share). RLIMIT_NPROC does not bind uid 0 at all, so when the
evaluator runs as root, bwrap is started as nobody (65534). The wall clock, the output caps and the size
of the private /tmp are enforced from outside.
"""

from __future__ import annotations

import json
import os
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
from typing import Protocol

STATUSES = ("passed", "failed", "timeout", "killed", "error")
KINDS = ("bubblewrap", "docker")
NOBODY = 65534
INSTALL_BUBBLEWRAP = "apt-get install bubblewrap (dnf install bubblewrap; pacman -S bubblewrap)"
# The first interpreter that lives under /usr is used: /usr is bound read-only anyway, and an interpreter
# under a home directory (pyenv, conda) would need part of the home bound into the sandbox.
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
MARK = "# sftdoctor sandbox"  # in the argv of every sandboxed interpreter: `ps` shows what is ours


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # wall clock, from outside: the whole sandbox is killed past it
    cpu_s: int = 10  # RLIMIT_CPU of each process: SIGXCPU, then SIGKILL a second later
    memory_bytes: int = 1 << 30  # RLIMIT_AS: a large allocation raises MemoryError
    processes: int = 32  # RLIMIT_NPROC, counted in the sandbox's own user namespace (threads count too)
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE: no single file written larger
    tmp_bytes: int = 64 << 20  # size of the private /tmp, the only writable place
    output_bytes: int = 64 << 10  # kept of stdout and of stderr each (the last bytes); the rest read and dropped

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")

    def rlimits(self, processes: bool = True) -> list[tuple[str, int, int]]:
        """(RLIMIT name, soft, hard) as the prologue sets them."""
        cpu = max(1, int(self.cpu_s))
        limits = [("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", self.memory_bytes, self.memory_bytes),
                  ("RLIMIT_FSIZE", self.file_bytes, self.file_bytes), ("RLIMIT_CORE", 0, 0),
                  ("RLIMIT_NOFILE", 256, 256)]
        if processes:
            limits.append(("RLIMIT_NPROC", self.processes, self.processes))
        return limits


@dataclass
class Outcome:
    status: str  # one of STATUSES
    exit_code: int | None
    signal: int | None
    stdout: str  # the last Limits.output_bytes of each stream
    stderr: str
    wall_s: float
    error: str | None = None  # one line: the exception, the signal or limit, why the sandbox failed
    dropped_bytes: int = 0  # output read beyond the caps and discarded (both streams)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> dict:
        return asdict(self)


class Sandbox(Protocol):
    name: str

    def available(self) -> str | None:
        """Why this sandbox cannot run here, or None."""

    def run(self, program: str, limits: Limits) -> Outcome:
        """Run a Python program to its outcome; never raises for anything the program does."""


# The first lines the sandboxed interpreter runs. The program comes from a file (bubblewrap) or stdin
# (docker) and is compiled under its own name so tracebacks show its lines; it runs in fresh globals.
PROLOGUE = MARK + """
import resource, sys
for _name, _soft, _hard in {limits!r}:
    resource.setrlimit(getattr(resource, _name), (_soft, _hard))
_path = {path!r}
_source = sys.stdin.read() if _path == "-" else open(_path, encoding="utf-8", errors="replace").read()
sys.argv = [_path]
import builtins
builtins.exit = builtins.quit = sys.exit  # what site would have added (-S skips site)
del resource, builtins, _name, _soft, _hard
exec(compile(_source, "<stdin>" if _path == "-" else _path, "exec"), {{"__name__": "__main__"}})
"""


def prologue(limits: Limits, path: str, processes: bool = True) -> str:
    return PROLOGUE.format(limits=limits.rlimits(processes), path=path)


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


class Bubblewrap:
    """bwrap: namespaces and bind mounts, no daemon, no root needed. The program is copied into the sandbox
    (--ro-bind-data), not bound from the host."""

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
        return _bwrap_probe(bwrap, self.python)

    def command(self, limits: Limits, program_fd: int, status_fd: int) -> list[str]:
        python = os.path.realpath(self.python)
        argv = [
            shutil.which("bwrap") or "bwrap",
            # A user namespace: the program is an unprivileged uid inside, with no capabilities on the host,
            # and RLIMIT_NPROC counts the processes of this sandbox only.
            "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
            "--disable-userns",  # no nested user namespace, where it would hold all capabilities (attack surface)
            "--unshare-pid",  # its own PID namespace: it sees no host process, and all of it dies with its init
            "--unshare-net",  # no network: a namespace with only its own loopback (not the host's 127.0.0.1)
            "--unshare-ipc",  # no host SysV IPC or POSIX message queues
            "--unshare-uts", "--hostname", "sandbox",
            "--unshare-cgroup-try",  # its cgroup path is not the host's
            "--die-with-parent",  # SIGKILL to the sandbox if bwrap (or this evaluator) dies
            "--new-session",  # setsid: no controlling terminal, so no TIOCSTI keystrokes into the user's shell
            "--cap-drop", "ALL",  # when bwrap itself runs with privileges: none for the program
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            # The system read-only: /usr (with the interpreter and its standard library) and the usual
            # symlinks or directories; nothing of /etc but the linker's cache, no home, no /root, no /work.
            "--ro-bind", "/usr", "/usr",
            *_lib_links(),
            "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            *_prefix_bind(python),
            "--proc", "/proc",  # a procfs of its own PID namespace (the host's processes are not in it)
            "--dev", "/dev", "--remount-ro", "/dev",  # null, zero, urandom, ...; /dev/shm is not writable
            # The only writable place: a fresh tmpfs of bounded size (RLIMIT_FSIZE bounds each file in it).
            "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
            "--perms", "0444", "--ro-bind-data", str(program_fd), "/sandbox/main.py",
            "--remount-ro", "/",  # bwrap's own root tmpfs, where the mount points live: read-only too
            "--chdir", "/tmp",
            "--json-status-fd", str(status_fd),  # the program's exit code, told apart from a failed setup
            "--",
            # -I: isolated (no PYTHON* variables, no user site, no script dir on sys.path); -S: no site-packages.
            python, "-I", "-S", "-c", prologue(limits, "/sandbox/main.py"),
        ]
        return argv

    def run(self, program: str, limits: Limits) -> Outcome:
        start = time.monotonic()
        with tempfile.TemporaryFile() as source:
            source.write(program.encode("utf-8", errors="replace"))
            source.flush()
            source.seek(0)
            status_r, status_w = os.pipe()
            try:
                proc = subprocess.Popen(
                    self.command(limits, source.fileno(), status_w), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(source.fileno(), status_w),
                    start_new_session=True,  # its own process group, killed as one on timeout
                    env={}, cwd="/", **_unprivileged())
            except OSError as exc:
                os.close(status_r)
                return _error(f"cannot start bwrap: {exc}", start)
            finally:
                os.close(status_w)
            return _finish(proc, limits, start, status_r, kill=_bwrap_killer(proc))


class Docker:
    """The docker CLI: no network, a read-only root with a tmpfs /tmp, memory and PID limits, no capabilities,
    nobody's uid. The program goes in on stdin."""

    name = "docker"

    def __init__(self, image: str = "python:3.12-slim", python: str = "python3"):
        self.image, self.python = image, python

    def available(self) -> str | None:
        docker = shutil.which("docker")
        if docker is None:
            return ("docker not found on PATH: install Docker and start its daemon, or use the default "
                    f"--sandbox bubblewrap ({INSTALL_BUBBLEWRAP})")
        try:
            done = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                                  text=True, timeout=20, check=False, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
                return f"no Docker daemon reachable (docker info: {why})"
            # Runs never pull (a pull would eat the wall-clock limit): the image must be here already.
            image = subprocess.run([docker, "image", "inspect", self.image], capture_output=True, timeout=20,
                                   stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"no Docker daemon reachable ({exc})"
        if image.returncode != 0:
            return f"the image {self.image} is not on this Docker host: docker pull {self.image}"
        return None

    def command(self, limits: Limits, name: str) -> list[str]:
        memory = str(limits.memory_bytes + (256 << 20))  # the cgroup bounds all processes; RLIMIT_AS each one
        cpu = max(1, int(limits.cpu_s))
        return [
            shutil.which("docker") or "docker", "run", "--rm", "-i", "--name", name,
            "--network", "none",  # no network at all
            "--read-only", "--tmpfs", f"/tmp:rw,nosuid,nodev,size={limits.tmp_bytes}",  # /tmp the only writable place
            "--memory", memory, "--memory-swap", memory,  # no swap beyond the memory limit
            "--pids-limit", str(limits.processes),  # the cgroup's PID limit (RLIMIT_NPROC would count host-wide)
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--user", f"{NOBODY}:{NOBODY}", "--workdir", "/tmp", "--env", "HOME=/tmp",
            "--ulimit", f"cpu={cpu}:{cpu + 1}", "--ulimit", f"fsize={limits.file_bytes}", "--ulimit", "core=0",
            "--ipc", "none", "--pull", "never",
            self.image, self.python, "-I", "-S", "-c", prologue(limits, "-", processes=False),
        ]

    def run(self, program: str, limits: Limits) -> Outcome:
        start = time.monotonic()
        name = f"sftdoctor-eval-{uuid.uuid4().hex[:12]}"
        with tempfile.TemporaryFile() as source:
            source.write(program.encode("utf-8", errors="replace"))
            source.flush()
            source.seek(0)
            try:
                proc = subprocess.Popen(self.command(limits, name), stdin=source, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
            except OSError as exc:
                return _error(f"cannot start docker: {exc}", start)

            def kill(child_pid: int | None) -> None:
                # Killing the CLI would leave the container running: kill the container by name.
                try:
                    subprocess.run([shutil.which("docker") or "docker", "kill", name], capture_output=True,
                                   timeout=30, stdin=subprocess.DEVNULL, check=False)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                _killpg(proc)

            outcome = _finish(proc, limits, start, None, kill=kill)
        if outcome.exit_code == 125 and outcome.status == "failed":  # docker's own failure (no image, bad flag)
            outcome.status, outcome.error = "error", f"docker run failed: {outcome.error}"
        return outcome


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
    return (f"bubblewrap cannot create a sandbox here ({outcome.error or outcome.status}): it needs unprivileged "
            "user namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
            "kernel.apparmor_restrict_unprivileged_userns=0)")


def _bwrap_killer(proc: subprocess.Popen):
    """SIGKILL to the sandbox's init (bwrap's child, PID 1 of its namespace): the kernel then kills every
    process in it before bwrap, which waits for it, exits. Then bwrap's process group for good measure."""
    def kill(child_pid: int | None = None) -> None:
        if child_pid and proc.poll() is None:
            try:
                fd = os.pidfd_open(child_pid)
            except OSError:
                fd = None
            if fd is not None:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except OSError:
                    pass
                finally:
                    os.close(fd)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        _killpg(proc)
    return kill


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Tail:
    """The last `cap` bytes of a stream; what falls off the front is only counted."""

    def __init__(self, cap: int):
        self.cap, self.data, self.dropped = cap, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * self.cap:  # trim in batches: amortised O(1) per byte
            self.dropped += len(self.data) - self.cap
            del self.data[:-self.cap]

    def text(self) -> str:
        if len(self.data) > self.cap:
            self.dropped += len(self.data) - self.cap
            del self.data[:-self.cap]
        return self.data.decode("utf-8", errors="replace")


def _finish(proc: subprocess.Popen, limits: Limits, start: float, status_fd: int | None, kill) -> Outcome:
    """Read stdout, stderr (and bwrap's status) until they close or the wall clock runs out; then the outcome."""
    out, err = _Tail(limits.output_bytes), _Tail(limits.output_bytes)
    status = bytearray()
    selector = selectors.DefaultSelector()
    sinks = {proc.stdout.fileno(): out.add, proc.stderr.fileno(): err.add}
    if status_fd is not None:
        sinks[status_fd] = status.extend
    for fd in sinks:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    deadline = start + limits.wall_s
    timed_out = False
    try:
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in selector.select(timeout=min(left, 1.0)):
                _drain(key.fd, sinks[key.fd], selector)
        if timed_out:
            kill(_child_pid(status))
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 0.5)
        except subprocess.TimeoutExpired:  # streams closed but still running (it closed its own stdout)
            timed_out = True
            kill(_child_pid(status))
            proc.wait()
        for key in list(selector.get_map().values()):  # what was written before the kill
            _drain(key.fd, sinks[key.fd], selector, final=True)
    finally:
        selector.close()
        proc.stdout.close()
        proc.stderr.close()
        if status_fd is not None:
            os.close(status_fd)
    wall = time.monotonic() - start
    exit_code = _exit_code(status) if status_fd is not None else proc.returncode
    outcome = _classify(proc.returncode, exit_code, timed_out, err.text(), limits)
    return Outcome(outcome[0], outcome[1], outcome[2], out.text(), err.text(), round(wall, 3), outcome[3],
                   out.dropped + err.dropped)


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


def _classify(returncode: int | None, exit_code: int | None, timed_out: bool, stderr: str,
              limits: Limits) -> tuple[str, int | None, int | None, str | None]:
    """(status, exit code, signal, error line). A signal death is reported by bwrap and docker as 128 + N."""
    if timed_out:
        return "timeout", None, None, f"wall-clock limit of {limits.wall_s:g} s reached: the sandbox was killed"
    if returncode is not None and returncode < 0:  # bwrap (or docker) itself killed, by someone else
        return "killed", None, -returncode, f"the sandbox was killed by {_signal_name(-returncode)}"
    if exit_code is None:
        return "error", returncode, None, _last_line(stderr) or f"the sandbox failed (exit code {returncode})"
    if exit_code == 0:
        return "passed", 0, None, None
    if 128 < exit_code < 128 + signal.NSIG:
        number = exit_code - 128
        why = {signal.SIGXCPU: " (the CPU-time limit)", signal.SIGXFSZ: " (the file-size limit)"}.get(number, "")
        return "killed", exit_code, number, f"killed by {_signal_name(number)}{why}"
    return "failed", exit_code, None, _last_line(stderr) or f"exit code {exit_code}"


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
