"""liger-kernel: the installed liger-kernel against the triton, transformers and TRL it meets, and the GPUs.

Each pair is a known break, read from the projects' own sources (release tags, requirements, the fix that ended it).
Two kinds: a pair that breaks wherever liger's kernels run (sftdoctor's run included), and one that breaks only
through TRL's or transformers' own `use_liger_kernel` switch, whose fused loss returns no logits. sftdoctor's trainer
does not use that switch: it applies liger's RoPE/RMSNorm/SwiGLU kernels itself with `fused_linear_cross_entropy=False`
(train/compat.py `apply_liger_kernels`), so the logits stay and those pairs do not touch its runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, ok, warning
from sftdoctor.run.gpus import describe_gpus, devices, lacking, version_tuple
from sftdoctor.run.smem import TRITON_MIN_CC

Versions = dict[str, tuple[int, ...] | None]


@dataclass(frozen=True)
class Pair:
    id: str
    breaks: Callable[[Versions], bool]  # True when the installed versions are this broken pair
    switch_only: bool  # True: only TRL's/transformers' use_liger_kernel hits it, not sftdoctor's trainer
    title: str  # formatted with the installed versions
    detail: str
    fix: str
    sources: tuple[str, ...]


def _between(version, first=None, fixed=None) -> bool:
    return version is not None and (first is None or version >= first) and (fixed is None or version < fixed)


def _triton_floor(v: Versions) -> bool:
    """liger's pyproject/setup.py: triton>=2.3.0 (0.3.x), triton>=2.3.1 (0.4.0 on)."""
    floor = (2, 3, 1) if _between(v["liger-kernel"], (0, 4)) else (2, 3, 0)
    return v["triton"] is not None and v["triton"] < floor


PAIRS = (
    Pair(
        "liger-triton-floor",
        _triton_floor,
        False,
        "liger-kernel {liger-kernel} needs triton >= 2.3.1 (2.3.0 for 0.3.x); triton {triton} is installed",
        "liger-kernel declares the triton it compiles its kernels with (pyproject.toml / setup.py `triton>=2.3.1` from "
        "0.4.0); an older triton lacks the language features its kernels use, and they fail to compile on first use.",
        'pip install "triton>=2.3.1" (the triton your torch pins), or an older liger-kernel',
        ("https://github.com/linkedin/Liger-Kernel/blob/v0.4.0/pyproject.toml",),
    ),
    Pair(
        "liger-triton-cast",
        lambda v: (
            v["liger-kernel"] is not None and v["liger-kernel"][:3] == (0, 3, 1) and _between(v["triton"], None, (3, 0))
        ),
        False,
        "liger-kernel 0.3.1 with triton {triton}: its SwiGLU/GeGLU kernels call tl.program_id(0).cast(), which triton "
        "before 3.0 lacks",
        "liger 0.3.1 cast program ids with `.cast(tl.int64)` (PR #251); on triton 2.x the first step fails with "
        "`CompilationError: ... AttributeError(\"'tensor' object has no attribute 'cast'\")` (LLaMA-Factory #5784, "
        "torch 2.3 / triton 2.3.0). 0.4.0 uses `.to(tl.int64)` (PR #274).",
        'pip install "liger-kernel>=0.4.0"',
        (
            "https://github.com/linkedin/Liger-Kernel/pull/251",
            "https://github.com/linkedin/Liger-Kernel/pull/274",
            "https://github.com/hiyouga/LlamaFactory/issues/5784",
        ),
    ),
    Pair(
        "liger-transformers-floor",
        lambda v: _between(v["liger-kernel"], (0, 7)) and _between(v["transformers"], None, (4, 52)),
        False,
        "liger-kernel {liger-kernel} refuses transformers {transformers}: it needs transformers >= 4.52.0",
        "liger-kernel 0.7.0 and later raise at import: `ImportError: liger-kernel requires transformers >= 4.52.0, got "
        "X` (liger_kernel/transformers/monkey_patch.py MIN_SUPPORTED_TRANSFORMERS_VERSION).",
        'pip install -U "transformers>=4.52.0", or "liger-kernel<0.7"',
        ("https://github.com/linkedin/Liger-Kernel/blob/v0.7.0/src/liger_kernel/transformers/monkey_patch.py",),
    ),
    Pair(
        "liger-transformers-v5",
        lambda v: _between(v["liger-kernel"], None, (0, 7)) and _between(v["transformers"], (5,)),
        False,
        "liger-kernel {liger-kernel} predates transformers 5 support; transformers {transformers} is installed",
        "transformers 5 support arrived in liger-kernel 0.7.0 (PR #994); 0.6.5 capped transformers below 5 (#1044): "
        "its patched forwards and model classes follow transformers 4.x.",
        'pip install -U "liger-kernel>=0.7.0"',
        ("https://github.com/linkedin/Liger-Kernel/pull/994", "https://github.com/linkedin/Liger-Kernel/issues/1044"),
    ),
    Pair(
        "liger-token-accuracy-triton",
        lambda v: (
            v["liger-kernel"] is not None and v["liger-kernel"][:3] == (0, 6, 4) and _between(v["triton"], None, (3, 3))
        ),
        True,
        "liger-kernel 0.6.4 with triton {triton}: its cross-entropy kernel with token accuracy does not compile",
        "TRL >= 0.26 asks liger's loss for token accuracy (return_token_accuracy); liger 0.6.4's kernel branches on a "
        "tensor there, which triton 3.2 refuses with a CompilationError (PR #991, fixed in 0.6.5).",
        'pip install -U "liger-kernel>=0.6.5"',
        ("https://github.com/linkedin/Liger-Kernel/pull/991",),
    ),
    Pair(
        "trl-liger-logits",
        lambda v: _between(v["trl"], (0, 15), (0, 16)),
        True,
        "TRL {trl} reads outputs.logits in SFTTrainer.compute_loss even with use_liger_kernel=True, whose fused loss "
        "returns none",
        "TRL 0.15.0-0.15.2 skipped its token accuracy only for its own `use_liger` flag; with transformers' "
        "`use_liger_kernel=True` the first step fails with `TypeError: 'NoneType' object is not subscriptable` at "
        "`shift_logits = outputs.logits[..., :-1, :]` (Liger-Kernel #568, open-r1 #404). TRL 0.16.0 tests "
        "use_liger_kernel.",
        'pip install -U "trl>=0.16.0", or use_liger_kernel=False',
        ("https://github.com/linkedin/Liger-Kernel/issues/568", "https://github.com/huggingface/open-r1/issues/404"),
    ),
    Pair(
        "trl-liger-token-accuracy",
        lambda v: _between(v["trl"], (0, 26), (0, 27)) and _between(v["liger-kernel"], None, (0, 6, 5)),
        True,
        "TRL {trl} reads outputs.token_accuracy from liger's loss, which liger-kernel {liger-kernel} can leave out",
        "TRL 0.26 calls `gather_for_metrics(outputs.token_accuracy).mean()` with use_liger_kernel=True; liger <= 0.6.4 "
        "returns no token_accuracy for some models (Gemma3, Liger PR #1010) and the step fails with `AttributeError: "
        "'NoneType' object has no attribute 'mean'`. TRL 0.27.0 checks for None (PR #4814).",
        'pip install -U "trl>=0.27.0" or "liger-kernel>=0.6.5"',
        ("https://github.com/huggingface/trl/pull/4814", "https://github.com/linkedin/Liger-Kernel/pull/1010"),
    ),
)

STACK = ("liger-kernel", "triton", "transformers", "trl")


def _said(pair: Pair) -> str:
    """The pair's title without its versions, to declare it as one of the check's messages."""
    return " ".join(pair.title.split(":")[0].format_map(dict.fromkeys(STACK, "")).split())


@check(
    "liger-kernel",
    "liger-kernel against the installed triton, transformers and TRL, and the GPUs it compiles for",
    messages={
        **{p.id: _said(p) for p in PAIRS},
        "triton-min-cc": "GPUs below compute capability 7.0, where Triton does not compile",
        "no-triton": "liger-kernel is installed but triton is not",
    },
)
def liger_kernel(packages: dict[str, Any], plan=None, gpus: dict[str, Any] | None = None):
    liger = packages.get("liger-kernel")
    if liger is None:
        raise NotApplicable("liger-kernel is not installed")
    if plan is not None and not plan.liger_kernel:
        raise NotApplicable("this run does not use liger-kernel ([training] liger_kernel resolved to off)")
    versions = {name: version_tuple(packages.get(name)) for name in STACK}
    installed = ", ".join(f"{name} {packages[name]}" for name in STACK if packages.get(name))
    evidence = {"versions": {name: packages.get(name) for name in STACK}, "run_uses_liger": bool(plan)}
    findings = [_finding(pair, packages, plan, evidence) for pair in PAIRS if pair.breaks(versions)]
    findings = [f for f in findings if f is not None]
    if old := lacking(devices(gpus), TRITON_MIN_CC):
        findings.append(
            (error if plan is not None else warning)(
                f"liger-kernel's Triton kernels do not run on {describe_gpus(old)}: "
                "Triton needs compute capability 7.0+",
                detail="Triton compiles only for compute capability 7.0 (Volta) and newer (torch/_inductor/exc.py "
                "GPUTooOldForTriton); liger's kernels fail on their first use on older GPUs.",
                fix="[training] liger_kernel = false on these GPUs",
                evidence={**evidence, "pair": "triton-min-cc"},
                id="liger-kernel/triton-min-cc",
            )
        )
    if versions["triton"] is None and not findings:
        return warning(
            f"liger-kernel {liger} is installed but triton is not: its kernels cannot compile",
            detail="liger-kernel imports triton for every kernel; pip installs it with liger on Linux x86-64.",
            fix="pip install triton (the release your torch pins)",
            evidence=evidence,
            id="liger-kernel/no-triton",
        )
    if findings:
        return findings
    skipped = [p.id for p in PAIRS if p.switch_only]
    note = (
        " (sftdoctor's trainer keeps the logits: the use_liger_kernel pairs do not apply)" if plan is not None else ""
    )
    return ok(
        f"{installed}: no known broken pair ({len(PAIRS)} checked){note}",
        evidence={**evidence, "pairs": [p.id for p in PAIRS], "switch_only": skipped},
    )


def _finding(pair: Pair, packages: dict[str, Any], plan, evidence: dict[str, Any]):
    title = pair.title.format_map({k: packages.get(k) or "?" for k in STACK})
    body = f"{pair.detail} Sources: {', '.join(pair.sources)}"
    found = {**evidence, "pair": pair.id, "sources": list(pair.sources)}
    if pair.switch_only:
        if plan is not None:
            return None  # sftdoctor's trainer: liger's kernels on the model, TRL's own switch off
        return warning(
            title,
            detail=body + " This holds when TRL's or transformers' use_liger_kernel=True is used.",
            fix=pair.fix,
            evidence=found,
            id=f"liger-kernel/{pair.id}",
        )
    return (error if plan is not None else warning)(
        title, detail=body, fix=pair.fix, evidence=found, id=f"liger-kernel/{pair.id}"
    )
