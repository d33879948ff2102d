"""Triton kernels and torch.compile in real logs (liger-kernel, triton-shared-memory, torch-compile): the topic, the
root cause and its specifics, however the log was pasted; the most specific cause is the root, the compile failure
that carried it a symptom (tests/fixtures/logs/index.json cites each log)."""

import io

import pytest
from triage.helpers import LOGS, PASTES, by_file, diagnosis_of, log_bytes, problems

from sftdoctor.findings import Severity
from sftdoctor.triage import diagnose

KERNEL_LOGS = [e for e in LOGS if e["file"].startswith(("liger-", "triton-smem-", "torch-compile-"))]
POSITIVE = [e for e in KERNEL_LOGS if e["expect"]]


def test_each_class_has_three_real_logs_from_three_projects_and_a_control():
    for prefix, topic in (
        ("liger-", "liger-kernel"),
        ("triton-smem-", "triton-shared-memory"),
        ("torch-compile-", "torch-compile"),
    ):
        mine = [e for e in POSITIVE if e["file"].startswith(prefix)]
        assert len({e["project"] for e in mine}) >= 3 and all(topic in e["expect"] for e in mine), topic
    assert any(not e["expect"] for e in KERNEL_LOGS)


@pytest.mark.parametrize("form", PASTES)
@pytest.mark.parametrize("entry", KERNEL_LOGS, ids=by_file(KERNEL_LOGS))
def test_each_log_names_its_topics_and_root_however_it_was_pasted(entry, form):
    text = PASTES[form](log_bytes(entry["file"]).decode("utf-8"))
    diagnosis = diagnose(io.BytesIO(text.encode()))
    assert sorted(problems(diagnosis)) == sorted(entry["expect"]), entry["what"]
    if entry["expect"]:
        assert diagnosis.root.finding.id == entry["expect"][0]


def test_a_liger_frame_before_a_compilation_error_names_liger_op_and_the_triton_message():
    log = (
        b'  File "/x/site-packages/liger_kernel/ops/geglu.py", line 84, in geglu_forward\n'
        b"    _geglu_tanh_forward_kernel[(n_rows,)](\n"
        b"triton.compiler.errors.CompilationError: at 12:27:\n"
        b"    tanh_result = tanh(tanh_arg)\n                           ^\n"
        b"AttributeError(\"module 'triton.language.math' has no attribute 'tanh'\")\n"
    )
    [finding] = [loc.finding for loc in diagnose(io.BytesIO(log)).findings]
    assert finding.id == "liger-kernel" and finding.severity is Severity.ERROR
    assert finding.evidence["liger_op"] == "geglu" and finding.evidence["liger_func"] == "geglu_forward"
    assert finding.title.endswith(
        """at 12:27: AttributeError("module 'triton.language.math' has no attribute 'tanh'")"""
    )


def test_a_compilation_error_of_an_unknown_kernel_outside_torch_compile_is_not_blamed_on_liger():
    log = (
        b"Traceback (most recent call last):\n"
        b"triton.compiler.errors.CompilationError: at 3:14:\ndef simple_kernel(in_ptr, out_ptr):\n"
        b"AttributeError(\"'triton._C.libtriton.ir.value' object has no attribute 'dtype'\")\n"
    )
    assert {loc.finding.id for loc in diagnose(io.BytesIO(log)).findings} & {"liger-kernel", "torch-compile"} == set()


def test_shared_memory_inside_a_compile_failure_is_the_root_and_the_compile_failure_a_warning():
    diagnosis = diagnosis_of("triton-smem-inductor-tem-kernel-rank3-specforge.log")
    assert [(loc.role, loc.finding.id, loc.finding.severity) for loc in diagnosis.findings] == [
        ("root", "triton-shared-memory", Severity.ERROR),
        ("symptom", "torch-compile", Severity.WARNING),
    ]
    assert "RTX 30xx/40xx/50xx, A10" in diagnosis.root.finding.title


@pytest.mark.parametrize("limit, gpus", [("65536", "T4"), ("98304", "V100"), ("166912", "A100"), ("232448", "H100")])
def test_the_hardware_limit_names_its_gpu_class(limit, gpus):
    log = f"triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 262144, Hardware limit: {limit}. Reducing block sizes or `num_stages` may help.\n"  # noqa: E501 - a real Triton log line, kept whole
    [finding] = [loc.finding for loc in diagnose(io.BytesIO(log.encode())).findings]
    assert gpus in finding.title and finding.evidence["limit"] == int(limit)


def test_triton_1x_ran_the_fields_together_and_is_still_read():
    log = b"triton.code_gen.OutOfResources: out of resource: shared memoryRequired: 65536Hardware limit: 49152\n"
    [finding] = [loc.finding for loc in diagnose(io.BytesIO(log)).findings]
    assert (finding.evidence["required"], finding.evidence["limit"]) == (65536, 49152) and "P40" in finding.title


def test_other_resources_than_shared_memory_are_not_this_topic():
    log = b"triton.runtime.errors.OutOfResources: out of resource: threads, Required: 2048, Hardware limit: 1024.\n"
    assert "triton-shared-memory" not in problems(diagnose(io.BytesIO(log)))


def test_a_recompile_limit_alone_is_info_the_run_goes_on_eagerly():
    log = (
        b"W0110 12:27:06.332000 158 torch/_dynamo/convert_frame.py:1551] [2/8] torch._dynamo hit config.recompile_limit (8)\n"  # noqa: E501 - a real log line, kept whole
        b"W0110 12:27:06.332000 158 torch/_dynamo/convert_frame.py:1551] [2/8]    function: 'forward' (model.py:12)\n"
    )
    diagnosis = diagnose(io.BytesIO(log))
    [loc] = diagnosis.findings
    assert loc.finding.severity is Severity.INFO and not diagnosis.problems
    assert loc.finding.evidence["function"] == "'forward'" and loc.finding.evidence["value"] == 8


def test_a_recompile_limit_that_failed_the_run_is_one_finding_with_the_function_and_the_count():
    diagnosis = diagnosis_of("torch-compile-recompile-limit-fullgraph-dion.log")
    [loc] = diagnosis.findings
    assert loc.role == "root" and loc.finding.severity is Severity.ERROR
    assert loc.finding.title == (
        "torch.compile hit config.recompile_limit (8 recompilations) on "
        "'dion2_post_orthogonalize': a hard failure under fullgraph=True"
    )


def test_a_liger_frame_followed_by_another_error_is_not_called_a_liger_failure():
    """The cut-traceback finding is only for a paste that stops inside liger's op; an OOM raised there is cuda-oom's."""
    log = (
        b'  File "/x/liger_kernel/ops/fused_linear_cross_entropy.py", line 87, in fused_linear_cross_entropy_forward\n'
        b"    logits_chunk = _input_chunk @ weight.t()\n"
        b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        b"79.14 GiB of which 1.06 GiB is free.\n"
    )
    assert "liger-kernel" not in problems(diagnose(io.BytesIO(log)))
