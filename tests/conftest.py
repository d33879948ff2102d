import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sftdoctor.checks import load_checks, run_check
from sftdoctor.facts import Facts
from sftdoctor.facts.gpus import parse_nvidia_smi
from sftdoctor.facts.topology import parse_topology

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).parents[1] / "examples"
# the memory terms `sftdoctor plan` lists for a full fine-tune, per GPU then per node, in its order
PLAN_TERMS = (
    "weights",
    "gradients",
    "optimizer states",
    "activations",
    "logits and loss",
    "fragmentation",
    "CUDA context and NCCL",
    "host RAM per node",
)


def pytest_configure(config):
    """Each xdist worker's torch (and the runs it starts) gets one thread unless told otherwise: with torch's
    default of a thread per core, two workers oversubscribe the cores, and OpenMP's spinning threads made a test
    of in-process training steps take 305 s instead of 24."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    _bytecode_kept(compile_package=not os.environ.get("PYTEST_XDIST_WORKER"))
    _session_cache(config)
    _bounded_memory()


def _bytecode_kept(compile_package: bool):
    """Under PYTHONDONTWRITEBYTECODE (set where this suite runs in CI) no bytecode is ever written: each of the
    session's Python processes (`sftdoctor` itself, its probe children, the training ranks: hundreds) compiled
    sftdoctor's sources again, and every run rewrote each test module's asserts (a third of collecting). The
    package is compiled once, before the xdist workers start, and each process reads that bytecode (Python
    checks it against the source's size and mtime: an edited file is compiled again); pytest keeps the
    rewritten test modules for the next run. Both go to the __pycache__ folders git ignores."""
    sys.dont_write_bytecode = False
    if compile_package:
        import compileall

        compileall.compile_dir(Path(__file__).parents[1] / "sftdoctor", quiet=2)


def _bounded_memory():
    """A read that never ends (/dev/zero where a file goes: tests/hostile.py) fails the test with a MemoryError
    instead of taking the machine's memory and the OOM killer's pick of a process: the test process and its
    children get RLIMIT_DATA (heap and private mappings; not address space, which torch reserves in bulk).
    The suite's largest honest need, a 2-rank DeepSpeed run, stays under 2 GiB per process."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = 6 * 2**30
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def _session_cache(config):
    """The model-building probes' cache (facts.probe_cache) lives for one test session: a run starts cold,
    never reads ~/.cache, and tests sharing the tiny example's files share its probe results."""
    if "SFTDOCTOR_CACHE" not in os.environ:
        os.environ["SFTDOCTOR_CACHE"] = tempfile.mkdtemp(prefix="sftdoctor-test-cache-")
        config._sftdoctor_cache = os.environ["SFTDOCTOR_CACHE"]


def pytest_collection_modifyitems(config, items):
    """On xdist workers, the slow tests first (in their own order): each worker takes the next test as it
    finishes one, so the minute-long runs overlap at the start and the short tests even out the end, instead
    of one worker finishing a long run alone."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def under_ci() -> bool:
    """CI sets CI=true (GitHub, GitLab and .ci/run do); there every part the tests use is installed."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a skip is a failure: a test skips only when a part is missing (Slurm, ip netns, Chromium,
    iptables, bubblewrap), and CI installs every part, so a skip there means the part broke, not that it is absent."""
    report = (yield).get_result()
    if report.skipped and under_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every part is installed: {reason}"


class NetworkReached(AssertionError):
    """A unit test tried to reach another host: the tests run where nothing but loopback may be reached."""


def _remote(address) -> bool:
    if not isinstance(address, tuple) or not address or not isinstance(address[0], str):
        return False  # AF_UNIX paths and the like stay on this machine
    host = address[0]
    if host in ("localhost", ""):
        return False
    try:
        return not ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return True  # a name to resolve: somewhere else


@pytest.fixture(autouse=True)
def environment_restored():
    """Each test starts from the worker's environment: transformers' TrainingArguments(fsdp=...) exports
    ACCELERATE_USE_FSDP and FSDP_* into os.environ, and a later test's accelerate plugin read them (xdist's order
    decides which test follows which)."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(autouse=True)
def no_network(request, monkeypatch):
    """Unit tests (all but `slow`) reach no other host: a connect() to anything but loopback fails the test.
    Slow tests may (the two-host tests talk across their own network namespaces)."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded(real):
        def connect(self, address):
            if self.family in (socket.AF_INET, socket.AF_INET6) and _remote(address):
                raise NetworkReached(f"a unit test reached the network: connect({address!r})")
            return real(self, address)

        return connect

    monkeypatch.setattr(socket.socket, "connect", guarded(real_connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(real_connect_ex))
    yield


def pytest_unconfigure(config):
    if getattr(config, "_sftdoctor_cache", None):
        shutil.rmtree(config._sftdoctor_cache, ignore_errors=True)


def index(kind: str) -> list[dict]:
    """The fixture index of a folder: each entry names its file and the public source it came from."""
    return json.loads((FIXTURES / kind / "index.json").read_text())


def fixture_text(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_text(encoding="utf-8")


def recorded_gpus(name: str) -> dict:
    """GPU facts from a real `nvidia-smi` output recorded in a public report."""
    return parse_nvidia_smi(fixture_text("nvidia_smi", name))


def recorded_topology(name: str) -> dict:
    return {"source": name, **parse_topology(fixture_text("topology", name), name)}


NO_GPU = {
    "source": None,
    "driver_version": None,
    "cuda_version": None,
    "devices": [],
    "error": "NVML: NVML Shared Library Not Found",
}

# What transformers 5 offers a plan (facts/stack.py's transformers_features, the parts plans read).
TRANSFORMERS_5 = {
    "cosine_with_min_lr": True,
    "min_lr_rate": True,
    "min_lr": True,
    "checkpointing_arg": "activation_checkpointing",
    "warmup_ratio": False,
}


@pytest.fixture(scope="session")
def registry():
    return load_checks(plugins=False)


@pytest.fixture
def run(registry):
    """Run one check on recorded facts; returns its findings (or a Skipped)."""

    def runner(check_id: str, **facts):
        return run_check(registry.checks[check_id], Facts.replay(facts))

    return runner


def severities(findings) -> list[str]:
    return [f.severity.value for f in findings]


def make_run(tmp_path, **sections):
    """A validated run config (sftdoctor.run.RunConfig) over a one-row text dataset, with these sections' keys."""
    from sftdoctor.run import validate

    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    raw = {"model": {"path": "m"}, "data": {"train": "d.jsonl"}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return validate(raw, tmp_path / "run.toml")


def plan_of(run_config, **facts):
    """The Plan decide() makes of `run_config` on these recorded facts (anything not given is unknown)."""
    from sftdoctor.run import decide

    return decide(run_config, Facts.replay(facts))


def meta_shape(config: dict):
    """The shape with the parameter count of the model transformers builds on the meta device."""
    from sftdoctor.facts.model_shape import count_on_meta_device
    from sftdoctor.run.shape import from_counts

    return from_counts(config, *count_on_meta_device(config))


def run_of(**sections):
    """A RunConfig built directly (no files checked): `run_of(model={"precision": "bf16"}, launch={"nnodes": 2})`."""
    from sftdoctor.run.config import OPTIONAL, SECTIONS, RunConfig

    values = {"model": {"path": "m"}, "data": {"train": ("d.jsonl",)}}
    for name, given in sections.items():
        values[name] = {**values.get(name, {}), **given}
    return RunConfig(
        path="run.toml",
        **{
            name: kind(given=frozenset(values.get(name, {})), **values.get(name, {}))
            for name, kind in SECTIONS.items()
            if name not in OPTIONAL or name in values
        },
    )


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Data of each row shape, made by the example's own generator (and its tokenizer and model config)."""
    out = {}
    for shape in ("messages", "prompt_completion", "text"):
        folder = tmp_path_factory.mktemp(shape)
        subprocess.run(
            [sys.executable, str(EXAMPLES / "make_tiny.py"), "--out", str(folder), "--shape", shape, "--rows", "160"],
            check=True,
            capture_output=True,
        )
        out[shape] = folder
    return out


def install_plugin(tmp_path, module_source, entry="mysite_checks"):
    """A real installed distribution on sys.path: a module and a .dist-info with entry points."""
    (tmp_path / f"{entry}.py").write_text(module_source)
    info = tmp_path / f"{entry}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {entry}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[sftdoctor.checks]\nsite = {entry}\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}
