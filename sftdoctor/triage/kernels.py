"""Triton kernels and torch.compile in a log: whose kernel failed (liger-kernel's, inductor's, another's) and why.

One summary for the signatures of three topics (liger-kernel, triton-shared-memory, torch-compile), because the
same lines mean different things together: a Triton `CompilationError` under a `liger_kernel/ops/*.py` frame is
liger's kernel against this triton; under `BackendCompilerFailed` it is inductor's; an `OutOfResources` wrapped in
`BackendCompilerFailed` is the GPU's shared memory, and torch.compile only carried it. The most specific cause is the
root; the compile failure that carried it is a symptom.
"""

from __future__ import annotations

import re
from typing import Any

from sftdoctor.findings import Finding, Severity
from sftdoctor.run.smem import gpu_class
from sftdoctor.triage.scan import Line
from sftdoctor.triage.signatures import Signature
from sftdoctor.triage.summaries import Context, Located, Summary, _evidence, clip, where

# Kernels that only liger-kernel defines (liger_kernel/ops/*.py, @triton.jit functions of 0.3.1-0.8.5), for a
# CompilationError pasted without its liger frames: its message starts with the kernel's source (`at 4:31:def NAME(`).
LIGER_KERNELS = frozenset(
    {
        "_swiglu_forward_kernel",
        "_swiglu_backward_kernel",
        "_geglu_tanh_forward_kernel",
        "_geglu_tanh_backward_kernel",
        "_rms_norm_forward_kernel",
        "_rms_norm_backward_kernel",
        "_fused_add_rms_norm_forward_kernel",
        "_fused_add_rms_norm_backward_kernel",
        "_triton_rope",
        "_triton_qwen2vl_mrope",
        "_llama4_rope_kernel",
        "liger_cross_entropy_kernel",
        "liger_cross_entropy_forward_kernel",
        "liger_cross_entropy_backward_kernel",
        "_jsd_kernel",
        "_kldiv_kernel_forward",
        "_kldiv_kernel_backward",
        "_tv_distance_kernel",
        "_grpo_loss_fwd_kernel",
        "_grpo_loss_bwd_kernel",
        "_dyt_fwd_kernel",
        "_dyt_bwd_kernel",
        "_poly_norm_forward_kernel",
        "_poly_norm_backward_kernel",
        "_sparsemax_forward_kernel",
        "_selective_log_softmax_kernel",
    }
)
_KERNEL_DEF = re.compile(r"\bdef (\w+)\(")
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Failure)\b[:(]")
_GLOG_WARNING = re.compile(r"\bW\d{4} \d\d:\d\d:\d\d")
_GLOG_TAIL = re.compile(r"^\S+\.py:\d+\]")  # the end of a glog prefix a paste wrapped onto the message's line


class Kernels(Summary):
    """The first of each kind of line, then one finding per cause, the compile failure demoted when it only
    carried a more specific one."""

    def __init__(self):
        self.first: dict[str, tuple[Signature, Line, dict[str, Any]]] = {}
        self.count: dict[str, int] = {}
        self.liger: dict[str, Any] | None = None  # the last liger_kernel/ops frame seen before a failure
        self.liger_at_failure: dict[str, Any] | None = None  # the liger frame before the CompilationError
        self.liger_line: Line | None = None

    def add(self, sig, line, groups):
        if sig.id == "liger-ops-frame":
            self.liger = {k: v for k, v in groups.items() if v is not None}
            self.liger_line = line
            return
        if sig.id == "triton-out-of-resources" and (_autotune_skipped(line) or _other_resource(line, groups)):
            return  # the autotuner dropped that config and benchmarks the others, or not shared memory
        self.count[sig.id] = self.count.get(sig.id, 0) + 1
        if sig.id not in self.first:
            self.first[sig.id] = (sig, line, groups)
            if sig.id == "triton-compilation-error" and self.liger_at_failure is None:
                self.liger_at_failure = self.liger

    def results(self, ctx: Context) -> list[Located]:
        found: list[Located] = []
        specific = self._shared_memory() or self._kernel_compile()
        if specific is not None:
            found.append(specific)
        elif not self.first and (cut := self._cut_in_liger()) is not None:
            found.append(cut)
        if (compile_failure := self._compile_failure(demoted=specific is not None)) is not None:
            found.append(compile_failure)
        if (limit := self._recompile_limit(failed=compile_failure is not None)) is not None:
            found.append(limit)
        return found

    # ---------------------------------------------------------------- causes

    def _shared_memory(self) -> Located | None:
        if "triton-out-of-resources" not in self.first:
            return None
        sig, line, groups = self.first["triton-out-of-resources"]
        required, limit = int(groups["required"]), int(groups["limit"])
        gpu = gpu_class(limit) or "a GPU whose limit sftdoctor does not know"
        whose = self._whose()
        title = (
            f"a Triton kernel{whose} needs {required} B of shared memory per block, this GPU allows {limit} B ({gpu})"
        )
        specifics = {
            "required": required,
            "limit": limit,
            "gpu_class": gpu_class(limit),
            "kernel": groups.get("what"),
            **self._liger_specifics(),
        }
        return self._located(sig, line, title, sig.fix, specifics)

    def _kernel_compile(self) -> Located | None:
        if "triton-compilation-error" not in self.first:
            return None
        sig, line, groups = self.first["triton-compilation-error"]
        message = _message_after(line)
        liger = self.liger_at_failure or _liger_kernel_in(line)
        if liger:
            where_ = f"{liger['op']}.py ({liger['func']})" if liger["op"] != "liger_kernel/ops" else liger["func"]
            title = (
                f"liger-kernel's Triton kernel {where_} failed to compile at "
                f"{groups['at']}: {message or 'see the lines after it'}"
            )
            return self._located(
                sig,
                line,
                title,
                sig.fix,
                {"at": groups["at"], "message": message, **self._liger_specifics(liger)},
                topic="liger-kernel",
            )
        if self._compiling():
            title = (
                f"a Triton kernel that torch.compile generated failed to compile at {groups['at']}: "
                f"{message or 'see the lines after it'}"
            )
            fix = next(s.fix for s, _, _ in self.first.values() if s.topic == "torch-compile")
            return self._located(sig, line, title, fix, {"at": groups["at"], "message": message}, topic="torch-compile")
        return None  # another library's kernel: the crash itself is what the log can say

    def _cut_in_liger(self) -> Located | None:
        """A traceback whose last frames are liger's op and whose error line the paste left out: what the log shows is
        that liger's kernel failed, not why."""
        line = self.liger_line
        if line is None or any(_ERROR_LINE.match(text) or "Error: " in text for text in line.after(60)):
            return None
        sig = next(s for s in _liger_signatures() if s.id == "liger-ops-frame")
        title = (
            f"the traceback ends inside liger-kernel's {self.liger['op']}.py ({self.liger['func']}) and its error "
            "line is not in the log: liger's kernel failed there"
        )
        fix = (
            "read the error after that frame in the full log; `sftdoctor check --select liger-kernel` names a broken "
            "liger/triton/transformers pair; or [training] liger_kernel = false"
        )
        return self._located(
            sig, line, title, fix, self._liger_specifics(self.liger), role="symptom", severity=Severity.WARNING
        )

    def _compile_failure(self, demoted: bool) -> Located | None:
        for sig_id in ("inductor-cpp-compile", "dynamo-backend-failed", "inductor-error", "dynamo-exception"):
            if sig_id in self.first:
                sig, line, groups = self.first[sig_id]
                break
        else:
            return None
        inner = (groups.get("inner") or "").strip() or None
        recompiles = self.first.get("dynamo-recompile-limit", (None, None, None))[2]
        if recompiles and groups.get("cls") in ("FailOnRecompileLimitHit", "Unsupported"):
            title = (
                f"torch.compile hit config.{recompiles['limit']} ({recompiles['value']} recompilations) on "
                f"{recompiles.get('function') or 'a function'}: a hard failure under fullgraph=True"
            )
        elif sig_id == "dynamo-backend-failed":
            title = f"torch.compile failed: backend '{groups['backend']}' raised {inner or 'an error'}"
        elif sig_id == "inductor-error":
            title = f"torch.compile failed: inductor raised {inner}"
        elif sig_id == "inductor-cpp-compile" and groups.get("nocxx"):
            title = "torch.compile failed: CPU inductor found no working C++ compiler"
        elif sig_id == "inductor-cpp-compile":
            title = "torch.compile failed: the C++ that inductor generated did not compile (CppCompileError)"
        else:
            title = f"torch.compile failed: {groups['cls']}: {clip(inner or '')}"
        fell_back = _logged_as_warning(line)
        if fell_back:
            title += " (logged as a warning: dynamo ran that frame eagerly)"
        role = "symptom" if demoted else "root"
        severity = Severity.WARNING if fell_back or demoted else Severity.ERROR
        backend = groups.get("backend") or self.first.get("dynamo-backend-failed", (None, None, {}))[2].get("backend")
        specifics = {
            "backend": backend,
            "inner": inner,
            "exception": groups.get("cls") or sig_id,
            "fell_back_to_eager": fell_back or None,
            **(
                {
                    "recompile_limit": recompiles["limit"],
                    "recompiles": int(recompiles["value"]),
                    "function": recompiles.get("function"),
                }
                if recompiles
                else {}
            ),
        }
        return self._located(sig, line, title, sig.fix, specifics, role=role, severity=severity)

    def _recompile_limit(self, failed: bool) -> Located | None:
        """Alone, the limit is dynamo giving up on one function (it runs eagerly from then on): info. With a failure
        (fullgraph's FailOnRecompileLimitHit) the failure's finding tells it."""
        if "dynamo-recompile-limit" not in self.first or failed:
            return None
        sig, line, groups = self.first["dynamo-recompile-limit"]
        title = (
            f"torch.compile recompiled {groups.get('function') or 'a function'} {groups['value']} times "
            f"(config.{groups['limit']}) and runs it eagerly from now on: slower, not wrong"
        )
        return self._located(
            sig,
            line,
            title,
            sig.fix,
            {"limit": groups["limit"], "value": int(groups["value"]), "function": groups.get("function")},
            role="symptom",
            severity=Severity.INFO,
        )

    # ---------------------------------------------------------------- helpers

    def _compiling(self) -> bool:
        return any(k in self.first for k in ("dynamo-backend-failed", "inductor-error"))

    def _whose(self) -> str:
        if self.liger:
            return f" of liger-kernel ({self.liger['op']}.py, {self.liger['func']})"
        return " that torch.compile generated" if self._compiling() else ""

    def _liger_specifics(self, liger: dict[str, Any] | None = None) -> dict[str, Any]:
        liger = liger or self.liger_at_failure or self.liger
        return {"liger_op": liger["op"], "liger_func": liger["func"]} if liger else {}

    def _located(
        self,
        sig: Signature,
        line: Line,
        title: str,
        fix: str,
        specifics: dict[str, Any],
        topic: str | None = None,
        role: str = "root",
        severity: Severity = Severity.ERROR,
    ) -> Located:
        count = self.count.get(sig.id, 1)
        seen = f"; {count} times" if count > 1 else ""
        evidence = _evidence(sig, line, count, set(), {k: v for k, v in specifics.items() if v is not None})
        topic = topic or sig.topic
        detail = f"first at {where(line)}{seen}: {clip(line.text)}"
        return Located(line.number, role, Finding(severity, title, detail, fix, topic, evidence, topic))


def _liger_signatures():
    from sftdoctor.triage.signatures import signatures

    return [s for s in signatures() if s.topic == "liger-kernel"]


def _logged_as_warning(line: Line) -> bool:
    """dynamo's convert_frame logging the failure at W level (suppress_errors: that frame runs eagerly), the glog
    prefix on the line or, wrapped, on the line before it."""
    return bool(_GLOG_WARNING.search(line.text)) or bool(
        _GLOG_TAIL.match(line.text) and any(_GLOG_WARNING.search(text) for text in line.earlier(1))
    )


def _autotune_skipped(line: Line) -> bool:
    """inductor's autotuner logging a config that does not fit ("Runtime error during autotuning: No valid triton
    configs. OutOfResources: ..." then "Ignoring this choice.")."""
    return any("Ignoring this choice" in text for text in line.after(4)) or any(
        "during autotuning" in text for text in [line.text, *line.earlier(2)]
    )


def _other_resource(line: Line, groups: dict[str, Any]) -> bool:
    """`out of resource: threads` / `tensor memory` (triton/compiler/compiler.py): not shared memory."""
    if groups.get("what") is not None:
        return groups["what"] in ("threads", "tensor memory")
    return any(
        re.search(r"out of resource: (?:threads|tensor memory)\b", text) for text in [line.text, *line.earlier(1)]
    )


def _liger_kernel_in(line: Line) -> dict[str, Any] | None:
    """The liger kernel whose source the CompilationError quotes, when no liger frame was seen."""
    for text in [line.text, *line.after(13)]:
        if (match := _KERNEL_DEF.search(text)) and match[1] in LIGER_KERNELS:
            return {"op": "liger_kernel/ops", "func": match[1]}
    return None


def _message_after(line: Line) -> str | None:
    """Triton's CompilationError prints the kernel's source up to the failing line, a caret, then the error
    (`AttributeError("'tensor' object has no attribute 'cast'")`): the first line after it that reads as one."""
    for text in line.after(16):
        if _ERROR_LINE.match(text):
            return clip(text)
    return None
