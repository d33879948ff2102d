"""sftdoctor.triage.summaries: matches turned into findings with the specifics a reader needs (which rank,
which collective, how much memory), checked against what each public report says."""

import io
import itertools
import re
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from triage.helpers import LOGS, by_file, diagnosis_of, log_bytes, problems

from sftdoctor.findings import Severity
from sftdoctor.triage import diagnose
from sftdoctor.triage.summaries import ranks_text

WITH_EVIDENCE = [entry for entry in LOGS if entry.get("evidence")]


@pytest.mark.parametrize("entry", WITH_EVIDENCE, ids=by_file(WITH_EVIDENCE))
def test_each_real_logs_finding_carries_the_specifics_its_report_shows(entry):
    found = problems(diagnosis_of(entry["file"]))
    for topic, expected in entry["evidence"].items():
        got = found[topic]
        assert {k: got.get(k) for k in expected} == expected, (topic, got)


@pytest.mark.parametrize(
    "ranks, text",
    [
        ([7], "rank 7"),
        ([0], "rank 0"),
        ([0, 1, 2, 5], "ranks 0-2, 5"),
        ([5, 3, 4, 0], "ranks 0, 3-5"),
        ([0, 1], "ranks 0-1"),
        ([1, 3, 5], "ranks 1, 3, 5"),
        ([], ""),
    ],
)
def test_ranks_are_named_in_runs_as_titles_show_them(ranks, text):
    assert ranks_text(ranks) == text


def test_a_cuda_oom_with_memory_reserved_but_unallocated_is_called_fragmentation():
    line = (
        b"[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity "
        b"of 79.15 GiB of which 1.23 GiB is free. Of the allocated memory 60.00 GiB is allocated by PyTorch, and "
        b"12.50 GiB is reserved by PyTorch but unallocated.\n"
    )
    root = diagnose(io.BytesIO(line)).root.finding
    assert root.title == "CUDA out of memory on rank 2: asked 2.00 GiB, 1.23 GiB free of 79.15 GiB (GPU 2)"
    assert root.detail.startswith("12.50 GiB is reserved by PyTorch but unallocated: fragmentation")
    assert "expandable_segments:True" in root.detail


def test_a_cuda_oom_with_little_memory_unallocated_is_not_called_fragmentation():
    """6.23 MiB reserved but unallocated (the report's own numbers): the model simply does not fit."""
    root = diagnosis_of("gpu-oom-new-format-llamafactory-multirank-rank7.log").root.finding
    assert root.evidence["unallocated"] == "6.23 MiB"
    assert "fragmentation" not in root.detail


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                b"\n",
                b"\r",
                b"\r\n",
                b"\x00",
                b"\xff\xfe",
                b"\x1b[31m",
                b"[rank3]:",
                b"9: ",
                b"Watchdog caught collective operation timeout",
                b"CUDA out of memory",
                b"{'loss': ",
                b"exitcode",
                b"Attempted loss scale: ",
                b"NCCL error",
                b"NCCL WARN",
                b"Error: ",
                b"\xe2\x96\x88",
                b"\xc3",
                b"nan",
                b"1e309",
                b"99999999999999999999",
                b"(",
                b")",
                b"'",
                b"> ",
                b" loss",
                b"loss=",
                b": NAN",
                b"nan.0",
                b"grad_norm: ",
                b" iteration 5/ 10 |",
                b"consumed samples:",
                b" number of skipped iterations:   3 |",
                b"number of nan iterations: ",
                b"found NaN in local",
                b"returned nan",
                b"values in its",
                b"xFormers was built for:",
                b"Detected that PyTorch and",
                b"Library not found: ",
                b"libbitsandbytes_cuda",
                b"is only supported on CUDA",
                b"Cuda compilation tools, release ",
                b"/pip-build-env-",
                b"compiled with a version of Cuda",
                b"step:",
                b"[00:15<",
                b"|",
            ]
        ),
        max_size=200,
    ),
    st.integers(min_value=1, max_value=64),
)
def test_fragments_of_signatures_in_any_order_never_raise(parts, chunk):
    """Half-matched messages feed the summaries odd specifics (huge numbers, nan, a missing field)."""
    diagnose(io.BytesIO(b"".join(parts)), chunk=chunk)


# The NaN corpus (tests/fixtures/logs/nan-*.log): real logs of other trainers, each citing its report.
NAN_LOGS = [entry for entry in LOGS if entry["file"].startswith("nan-")]


def _quoted(text):
    """As pasted into a GitHub comment as a quote: `> ` before every line, a blank quoted line between."""
    return "".join(f"> {line}\n>\n" for line in text.splitlines())


def _wrapped(width):
    def wrap(text):
        return "".join(
            (textwrap.fill(line, width, break_on_hyphens=False) if line.strip() else "") + "\n"
            for line in text.splitlines()
        )

    return wrap


def _cut(width):
    """A terminal's hard wrap: every `width` columns, mid-word."""

    def cut(text):
        return "".join(
            "".join(line[i : i + width] + "\n" for i in range(0, max(len(line), 1), width))
            for line in text.splitlines()
        )

    return cut


PASTES = {
    "plain": str,
    "markdown quote": _quoted,
    "wrapped at 80": _wrapped(80),
    "wrapped at 60": _wrapped(60),
    "cut at 80 columns": _cut(80),
    "quoted and wrapped": lambda text: _quoted(_wrapped(80)(text)),
}


def test_the_nan_corpus_holds_real_logs_of_at_least_six_other_trainers_and_negative_controls():
    positive = {entry["project"] for entry in NAN_LOGS if entry["expect"]}
    assert len(positive - {"HF Trainer"}) >= 6, positive
    assert all(entry["source"].startswith("https://github.com/") for entry in NAN_LOGS)
    assert sum(not entry["expect"] for entry in NAN_LOGS) >= 3


@pytest.mark.parametrize("form", PASTES)
@pytest.mark.parametrize("entry", NAN_LOGS, ids=by_file(NAN_LOGS))
def test_a_non_finite_loss_is_found_at_its_step_however_the_log_was_pasted(entry, form):
    text = PASTES[form](log_bytes(entry["file"]).decode("utf-8", "replace"))
    found = problems(diagnose(io.BytesIO(text.encode())))
    if not entry["expect"]:
        assert found == {}, (form, found)
        return
    assert "nan-loss" in found, (form, found)
    if "step" in entry["evidence"]["nan-loss"]:
        assert found["nan-loss"].get("step") == entry["evidence"]["nan-loss"]["step"], form


MEGATRON = log_bytes("nan-negative-megatron-llm-healthy-nan-iterations-zero.log").decode().splitlines()


def _megatron(counters):
    """The real healthy Megatron lines, with the interval counters set per line (skipped, nan)."""
    lines = []
    for line, (skipped, nans) in zip(itertools.cycle(MEGATRON), counters):
        line = re.sub(r"number of skipped iterations:\s+\d+", f"number of skipped iterations: {skipped:3d}", line)
        lines.append(re.sub(r"number of nan iterations:\s+\d+", f"number of nan iterations: {nans:3d}", line))
    return "\n".join(lines).encode() + b"\n"


def test_megatron_skipping_every_interval_after_it_had_advanced_is_a_warning():
    found = diagnose(io.BytesIO(_megatron([(0, 0), (0, 0), (1, 0), (1, 0), (1, 0), (1, 0)]))).findings
    [skipping] = [loc.finding for loc in found]
    assert skipping.severity is Severity.WARNING and skipping.id == "nan-loss"
    assert skipping.title == "skipped iterations in 4 logged intervals in a row (4 iterations), from line 3"


def test_megatron_skips_at_the_start_are_the_loss_scale_settling_and_a_run_that_recovers_is_fine():
    assert diagnose(io.BytesIO(_megatron([(1, 0), (1, 0), (1, 0), (0, 0), (0, 0)]))).findings == []
    assert diagnose(io.BytesIO(_megatron([(0, 0), (1, 0), (1, 0), (0, 0), (0, 0)]))).findings == []
    assert diagnose(io.BytesIO(_megatron([(1, 0), (1, 0), (1, 0), (1, 0)]))).findings == []  # a paste of the start


def test_megatrons_nan_iterations_counter_is_a_non_finite_loss_at_that_iteration():
    root = diagnose(io.BytesIO(_megatron([(0, 0), (1, 1)]))).root.finding
    assert root.title == "lm loss went nan at iteration 123"
    assert "Megatron counted 1 iteration with a non-finite loss" in root.detail


def test_a_megatron_loss_field_that_vanishes_with_nothing_skipped_is_a_nan_loss():
    """training_log prints a loss only `if avg > 0.0`: a NaN average drops the field from the line."""
    lines = _megatron([(0, 0), (0, 0)]).decode().splitlines()
    lines[1] = re.sub(r" lm loss: \S+ \|", "", lines[1])
    root = diagnose(io.BytesIO("\n".join(lines).encode())).root.finding
    assert root.title == "lm loss went nan at iteration 123"
    assert "lm loss vanished from the iteration line with 0 skipped iterations" in root.detail
    assert "the entries before it: loss 2.504220E+00 grad_norm 0.231" in root.detail


@pytest.mark.parametrize(
    "line, title",
    [
        (
            b"[rank3]: AssertionError: Rank 3: found NaN in local grad norm in backward pass before data-parallel "
            b"communication collective. Device: 3, node: n1\n",
            "Megatron's NaN check failed on the local grad norm",
        ),
        (
            b"RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.\n",
            "autograd anomaly mode: MulBackward0 returned NaN in its 0th output",
        ),
    ],
)
def test_a_nan_assertion_inside_the_step_is_the_root_cause(line, title):
    root = diagnose(io.BytesIO(line)).root.finding
    assert root.id == "nan-loss" and root.title == title


def test_a_mismatch_printed_from_pips_isolated_build_says_whose_torch_it_is():
    """vllm#602: the "PyTorch (11.7)" of torch's message is pip's build-isolation copy; the user's torch is 12.1."""
    found = [
        loc.finding
        for loc in diagnosis_of("gpu-cuda-mismatch-vllm-build-isolation-torch-cu117-vs-env-cu121.log").findings
    ]
    assert [f.id for f in found] == ["torch-cuda-match", "torch-cuda-match"]
    assert found[1].title.startswith("the build used pip's isolated copy of torch")
    assert found[1].fix.startswith("pip install --no-build-isolation")
