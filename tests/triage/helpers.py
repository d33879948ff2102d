"""What several triage test modules share: the cited real-log corpus (tests/fixtures/logs/index.json)
and how to diagnose one of its files."""

import io
import textwrap
import traceback

from conftest import FIXTURES, index

from sftdoctor.findings import Severity
from sftdoctor.triage import diagnose

LOGS = index("logs")
POSITIVE = [entry for entry in LOGS if entry["expect"]]


def by_file(entries):
    """pytest ids for parametrizing over corpus entries."""
    return [entry["file"] for entry in entries]


def log_bytes(name: str) -> bytes:
    return (FIXTURES / "logs" / name).read_bytes()


def diagnosis_of(name: str, chunk: int = 1 << 20):
    with open(FIXTURES / "logs" / name, "rb") as handle:
        return diagnose(handle, name, chunk=chunk)


def problems(diagnosis) -> dict[str, dict]:
    """topic -> the evidence of its first warning/error finding."""
    found = {}
    for loc in diagnosis.findings:
        if loc.finding.severity.rank >= Severity.WARNING.rank:
            found.setdefault(loc.finding.id, loc.finding.evidence)
    return found


def topics(data: bytes, chunk: int = 1 << 20) -> list[str]:
    return [loc.finding.id for loc in diagnose(io.BytesIO(data), chunk=chunk).findings if loc.role != "context"]


def everything(diagnosis):
    """All a report or --json shows: counts, findings with their roles, cascade, benign, signatures."""
    return (
        diagnosis.lines,
        diagnosis.bytes,
        [(loc.line, loc.role, loc.finding) for loc in diagnosis.findings],
        diagnosis.root and diagnosis.root.line,
        dict(diagnosis.cascade),
        diagnosis.benign,
        dict(diagnosis.matched),
    )


def located(diagnosis) -> list:
    """(line, finding) of every finding, in the order the report shows them."""
    return [(loc.line, loc.finding) for loc in diagnosis.findings]


def oom_then_cascade() -> bytes:
    """Slurm-style interleaving: a Trainer dict, rank 7 runs out of memory, the others time out in NCCL,
    then torchrun's teardown repeats ChildFailedError 100 times."""
    oom = log_bytes("gpu-oom-new-format-llamafactory-multirank-rank7.log")
    timeouts = log_bytes("dist-nccl-timeout-allreduce-linenumbered-llamafactory.log")
    cascade = b"".join(
        b"[rank0]: torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" for _ in range(100)
    )
    return b"{'loss': 1.25, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}\n" + oom + timeouts + cascade


def line_of(log: bytes, needle: bytes) -> int:
    """The 1-based line number of the first line holding `needle`, counted independently of the scanner."""
    return log[: log.index(needle)].count(b"\n") + 1


def quoted(text: str) -> str:
    """As pasted into a GitHub comment as a quote: `> ` before every line, a blank quoted line between."""
    return "".join(f"> {line}\n>\n" for line in text.splitlines())


def wrapped(text: str, width: int = 80) -> str:
    """As an editor or a narrow terminal wraps it: every line broken at a space before `width` columns."""
    return "".join(
        (textwrap.fill(line, width, break_on_hyphens=False) if line.strip() else "") + "\n"
        for line in text.splitlines()
    )


# How users paste a log into an issue: the forms every real log of the corpus is triaged alike in.
PASTES = {
    "plain": str,
    "markdown quote": quoted,
    "wrapped at 80": wrapped,
    "quoted and wrapped": lambda text: quoted(wrapped(text)),
}


# The opening of a child process with a one-rank gloo device mesh (`mesh`), where torch's DTensor raises as it does
# in an FSDP2 run; the test appends what it makes torch raise.
ONE_RANK_MESH = (
    "import os, torch, torch.distributed as dist\n"
    "from torch.distributed.device_mesh import init_device_mesh\n"
    "from torch.distributed.tensor import distribute_tensor, Shard\n"
    "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='0', RANK='0', WORLD_SIZE='1')\n"
    "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
    "mesh = init_device_mesh('cpu', (1,))\n"
)


def raised(func) -> str:
    """The traceback `func` raises, as a log would print it (the message is what the caller tests)."""
    try:
        func()
    except Exception:  # noqa: BLE001 - the message is what is under test
        return traceback.format_exc()
    raise AssertionError("expected an exception")
