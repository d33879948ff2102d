"""The verdict on every log: its root cause, "failed: cause not recognised" for a failure no signature explains
(never "nothing recognised" with exit 0 on a log that failed), or nothing for a log that shows no failure; the
findings known before held identical (tests/fixtures/logs/pinned.json)."""

import io
import json

import pytest
from conftest import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st
from triage.helpers import LOGS, PASTES, diagnosis_of, problems

from sftdoctor.findings import Severity
from sftdoctor.triage import diagnose

PINNED = json.loads((FIXTURES / "logs" / "pinned.json").read_text())["findings"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_finding_known_before_is_found_again_identical(name):
    found = [
        {
            "line": loc.line,
            "role": loc.role,
            "id": loc.finding.id,
            "severity": loc.finding.severity.value,
            "title": loc.finding.title,
        }
        for loc in diagnosis_of(name).findings
    ]
    assert [f for f in found if f["id"] != "crash-log"] == PINNED[name]


def verdict(log: bytes):
    diagnosis = diagnose(io.BytesIO(log))
    return diagnosis.verdict, diagnosis.problems, diagnosis.findings[0].finding if diagnosis.findings else None


@pytest.mark.parametrize(
    "log, sign",
    [
        (
            b'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    main()\n',
            "a Python traceback with no exception line (the paste or the log was cut before it)",
        ),
        (
            b"[rank1]: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n",
            "the launcher tore the job down and the log holds no traceback",
        ),
        (b"srun: error: gpu-node-3: task 5: Exited with exit code 1\n", "a process exited with status 1"),
        (
            b"train.sh: line 12: 41234 Segmentation fault      (core dumped) python train.py\n",
            "a process died of Segmentation fault",
        ),
        (b"step 12\nKilled\n", "a process died of Killed"),
        (
            b"slurmstepd: error: *** JOB 81234 ON node-7 CANCELLED AT 2025-03-02T10:11:12 DUE TO TIME LIMIT ***\n",
            "Slurm cancelled the job (time limit)",
        ),
        (
            b"[E ProcessGroupGloo.cpp:138] Rank 1 successfully reached monitoredBarrier, but received errors\n",
            "torch's C++ side logged an error",
        ),
    ],
)
def test_a_failure_without_a_python_exception_is_failed_not_recognised_and_a_problem(log, sign):
    said, problem, finding = verdict(log)
    assert (said, problem) == ("failed-unrecognised", True)
    assert finding.severity is Severity.ERROR and finding.title == f"the run failed: {sign}; cause not recognised"


@pytest.mark.parametrize(
    "log",
    [
        b"{'train_runtime': 100.0, 'train_loss': 1.1, 'epoch': 3.0}\nProcess finished with exit code 0\n",
        b"srun: task 0: Exited with exit code 0\n",
        b"warning: the learning rate is high\n",
    ],
)
def test_a_log_that_shows_no_failure_is_nothing_recognised_and_exits_0(log):
    assert verdict(log) == ("nothing-recognised", False, None)


def test_the_innermost_exception_of_the_first_rank_to_fail_is_quoted_through_chains_and_interleaving():
    """Rank 3 fails first (torchrun says so); its original KeyError is quoted, not the RuntimeError raised while
    handling it, nor rank 0's later error, nor the launcher's own exception."""
    log = b"""[rank0]: Traceback (most recent call last):
[rank3]: Traceback (most recent call last):
[rank0]:   File "train.py", line 80, in <module>
[rank3]:   File "data.py", line 12, in __getitem__
[rank3]: KeyError: 'messages'
[rank3]: 
[rank3]: During handling of the above exception, another exception occurred:
[rank3]: 
[rank3]: Traceback (most recent call last):
[rank3]: RuntimeError: DataLoader worker (pid 4242) raised an error
[rank0]: ValueError: the batch is empty
subprocess.CalledProcessError: Command '['/usr/bin/python', 'train.py']' returned non-zero exit status 1.
Root Cause (first observed failure):
[0]:
  rank      : 3 (local_rank: 3)
  exitcode  : 1 (pid: 4242)
"""  # noqa: W291 - torchrun's "[rankN]: " prefix keeps its space on an empty line
    said, problem, finding = verdict(log)
    assert (said, problem) == ("failed-unrecognised", True)
    assert finding.title == "the run failed: KeyError: 'messages' (rank 3, line 5; cause not recognised)"
    assert finding.evidence["failed_rank"] == 3 and "; 2 ranks raised one" in finding.detail  # not the launcher


def test_without_the_launchers_word_the_rank_whose_exception_comes_first_is_quoted():
    log = (
        b"[rank2]: Traceback (most recent call last):\n[rank2]: OSError: data/train.jsonl not found\n"
        b"[rank0]: Traceback (most recent call last):\n[rank0]: OSError: data/train.jsonl not found\n"
    )
    assert (
        verdict(log)[2].title
        == "the run failed: OSError: data/train.jsonl not found (rank 2, line 2; cause not recognised)"
    )


@pytest.mark.parametrize("prefix", ["[rankx]: ", "[rankN]: ", "[rank?]: "])
def test_a_placeholder_rank_prefix_is_read_as_a_prefix_with_no_rank(prefix):
    log = "".join(prefix + line + "\n" for line in ["Traceback (most recent call last):", "ValueError: boom"]).encode()
    assert verdict(log)[2].title == "the run failed: ValueError: boom (line 2; cause not recognised)"


def test_a_recognised_cause_is_the_root_and_no_crash_finding_is_added():
    log = (
        b"[rank0]: Traceback (most recent call last):\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. "
        b"Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.2 GiB is free.\n"
    )
    said, _, finding = verdict(log)
    assert said == "root-cause" and finding.id == "cuda-oom"
    assert [loc.finding.id for loc in diagnose(io.BytesIO(log)).findings] == ["cuda-oom"]


def test_an_advisory_is_never_the_root_cause_of_a_run_that_failed_for_another_reason():
    log = (
        b"UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly.\n"
        b"[rank0]: Traceback (most recent call last):\n[rank0]: ZeroDivisionError: division by zero\n"
    )
    diagnosis = diagnose(io.BytesIO(log))
    assert diagnosis.verdict == "failed-unrecognised"
    assert [(loc.finding.id, loc.finding.severity) for loc in diagnosis.findings] == [
        ("crash-log", Severity.ERROR),
        ("gradient-checkpointing", Severity.INFO),
    ]


# The logs added from issue 39 on are read alike in every form; the ones before it were written for the plain
# and quoted forms (the NaN corpus, test_summaries.py, also for wrapped and cut ones).
FORMS = [
    (entry, form)
    for entry in LOGS
    for form in PASTES
    if entry["file"] not in PINNED or form in ("plain", "markdown quote")
]


@pytest.mark.parametrize("entry, form", FORMS, ids=[f"{entry['file']}-{form}" for entry, form in FORMS])
def test_every_real_log_is_triaged_alike_however_it_was_pasted(entry, form):
    text = PASTES[form]((FIXTURES / "logs" / entry["file"]).read_bytes().decode("utf-8", "replace"))
    diagnosis = diagnose(io.BytesIO(text.encode()))
    assert sorted(problems(diagnosis)) == sorted(entry["expect"]), (form, entry["what"])
    assert diagnosis.problems is bool(entry["expect"]), form  # no failed log exits 0


def _vocabulary() -> list[bytes]:
    """Every signature's needles (the helpers' new ones too), with what makes their specifics odd."""
    from sftdoctor.triage.signatures import signatures

    needles = {n.encode() for s in signatures() for n in ([s.needle] if isinstance(s.needle, str) else s.needle)}
    return sorted(needles) + [
        b"\n",
        b"\r",
        b"\x00",
        b"\xff",
        b"[rank3]:",
        b"[rankx]:",
        b"7: ",
        b"> ",
        b"nan",
        b"-1",
        b"0",
        b"99999999999999999999",
        b"1e309",
        b" ",
        b":",
        b"'",
        b"=",
        b"(",
        b"|",
    ]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_vocabulary()), max_size=120), st.integers(min_value=1, max_value=64))
def test_any_mix_of_signature_fragments_gets_one_of_the_three_verdicts_and_a_failure_is_never_called_healthy(
    parts, chunk
):
    log = b"".join(parts)
    diagnosis = diagnose(io.BytesIO(log), chunk=chunk)
    assert diagnosis.verdict in ("root-cause", "failed-unrecognised", "nothing-recognised")
    if diagnosis.verdict == "nothing-recognised":
        assert not diagnosis.problems and not diagnosis.failed
        assert not any(line.strip().startswith(b"Traceback (most recent call last)") for line in log.splitlines())
    else:
        assert diagnosis.problems  # exit 1


NEW = [entry for entry in LOGS if entry["file"] not in PINNED]
# Specifics a paste can change: a wrap moves a message off the line that carries the launcher's rank prefix, splits
# one message onto two lines that each hold a needle, cuts a long path (the file being saved), or breaks the
# traceback frame or the inner error a finding reads beside the message (the library it was raised in).
UNSTABLE = ("rank", "ranks", "count", "saving", "inner", "inside")
SPECIFIC = [(entry, form) for entry in NEW if entry.get("evidence") for form in PASTES]


@pytest.mark.parametrize("entry, form", SPECIFIC, ids=[f"{entry['file']}-{form}" for entry, form in SPECIFIC])
def test_each_new_log_carries_the_specifics_it_shows_however_it_was_pasted(entry, form):
    text = PASTES[form]((FIXTURES / "logs" / entry["file"]).read_bytes().decode("utf-8", "replace"))
    found = problems(diagnose(io.BytesIO(text.encode())))
    for topic, expected in entry["evidence"].items():
        expected = {k: v for k, v in expected.items() if form == "plain" or k not in UNSTABLE}
        assert {k: found[topic].get(k) for k in expected} == expected, form


def test_each_failure_class_has_real_logs_from_three_projects_and_the_corpus_from_twenty_five():
    topics = {topic for entry in NEW for topic in entry["expect"]}
    for topic in topics:
        assert len({entry["project"] for entry in NEW if topic in entry["expect"]}) >= 3, topic
    assert len({entry["project"] for entry in NEW}) >= 25
    assert not {entry["source"].split("#")[0] for entry in NEW} & {
        entry["source"].split("#")[0] for entry in LOGS if entry["file"] in PINNED
    }  # none of the earlier sources
