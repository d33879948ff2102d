"""known-bad-versions: installed releases with a known bug that this run's settings would hit.

Each advisory names the releases it holds for (from the upstream fix: the first tag that contains it), the
settings that trigger it, and its sources. It reads the facts only: package versions, torch's build, the
plan (or a DeepSpeed JSON given alone) and how flash-attn was installed. Where the settings are not known
(no run config), an affected release is reported as such, with what would make the run hit it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import info, ok, warning
from sftdoctor.run.gpus import version_tuple
from sftdoctor.run.versions import at_least, in_range, version_key


@dataclass(frozen=True)
class Stack:
    """What the advisories look at; None where neither the plan nor a JSON says."""

    packages: dict[str, Any]
    torch: tuple[int, ...] | None
    cuda: int | None  # torch's CUDA major
    zero: dict[str, Any] | None  # the effective DeepSpeed zero_optimization block; {} without DeepSpeed
    accumulation: int | None
    liger: bool | None
    flash_wheel: dict[str, Any] | None

    @property
    def stage(self) -> int | None:
        return None if self.zero is None else int(self.zero.get("stage", 0) or 0)


@dataclass(frozen=True)
class Advisory:
    id: str
    package: str
    affected: tuple[str | None, str | None]  # [first affected release, first fixed release); None: open end
    hits: Callable[[Stack], bool | None]  # True: this run's settings trigger it; None: cannot tell
    trigger: str  # the settings that trigger it, in words
    title: str
    detail: str
    fix: str
    sources: tuple[str, ...]


def _overlap_zero12(run: Stack) -> bool | None:
    """DeepSpeed's ZeRO-1/2 defaults (runtime/zero/config.py): overlap_comm off, contiguous_gradients on. ZeRO-1
    reads both only since 0.13.0 (PR #4887)."""
    if run.zero is None:
        return None
    stages = (1, 2) if at_least(run.packages.get("deepspeed"), "0.13") else (2,)
    return (
        run.stage in stages
        and run.zero.get("overlap_comm") is True
        and run.zero.get("contiguous_gradients", True) is not False
    )


def _overlap_zero3(run: Stack) -> bool | None:
    """ZeRO-3 overlaps by default (overlap_comm resolves to stage == 3); the race needs torch >= 2.10."""
    if run.torch is not None and run.torch[:2] < (2, 10):
        return False
    if run.zero is None:
        return None
    return run.stage == 3 and run.zero.get("overlap_comm", True) is not False


def _accumulates(run: Stack) -> bool | None:
    return None if run.accumulation is None else run.accumulation > 1


def _liger_accumulates(run: Stack) -> bool | None:
    if run.liger is False or run.accumulation == 1:
        return False
    if at_least(run.packages.get("transformers"), "4.46") is False:
        return False
    return None if run.liger is None or run.accumulation is None else True


def _flash_wheel_for_other_torch(run: Stack) -> bool | None:
    """Only with a wheel name to read: otherwise the flash-attn check's import test is the judge."""
    wheel = run.flash_wheel
    if not wheel:
        return False
    if run.torch is None:
        return None
    return wheel["torch"] != run.torch[:2] or (run.cuda is not None and wheel["cuda"] != run.cuda)


ADVISORIES = (
    Advisory(
        "deepspeed-overlap-comm-zero12",
        "deepspeed",
        (None, "0.19.0"),
        _overlap_zero12,
        'ZeRO-1/2 with "overlap_comm": true (and contiguous_gradients, on by default), more than one rank',
        "ZeRO-{stage} with overlap_comm can corrupt gradients: NaN or zero losses, wrong grad norms",
        "Races between the reduction stream and the gradient buckets, fixed one by one: the bucket rewritten while "
        "its reduction runs (fixed in 0.14.3, PR #5606), the ping-pong index reset of 0.17.2-0.17.4 (PR #7805), "
        "reduction buffers freed before their collective finished (fixed in 0.19.0, PR #7965). The usual report: "
        "the loss turns NaN or 0 after a few steps, or grad_norm stays at 1.0, and overlap_comm false cures it.",
        'pip install -U "deepspeed>=0.19.0"; or set "overlap_comm": false (slower: the reduction no longer overlaps '
        "the backward)",
        (
            "https://github.com/deepspeedai/DeepSpeed/pull/5606",
            "https://github.com/deepspeedai/DeepSpeed/pull/7805",
            "https://github.com/deepspeedai/DeepSpeed/pull/7965",
            "https://github.com/deepspeedai/DeepSpeed/issues/5242",
            "https://github.com/deepspeedai/DeepSpeed/issues/5347",
            "https://github.com/deepspeedai/DeepSpeed/issues/7188",
        ),
    ),
    Advisory(
        "deepspeed-zero3-overlap-torch210",
        "deepspeed",
        (None, "0.18.8"),
        _overlap_zero3,
        "ZeRO-3 (overlap_comm on by default) with torch 2.10 or newer",
        "ZeRO-3 with torch {torch}: the gradient reduce-scatter races the backward, NaN weights after the first step",
        "ZeRO-3 synchronised its reduce-scatter with the default stream instead of the current one; torch 2.10's "
        "autograd stream handling makes the race reliable (PR #7898: NaN in 55 weight layers after step 1 on a subset "
        "of ranks, grad_norm clipped to 1.0).",
        'pip install -U "deepspeed>=0.18.8"',
        (
            "https://github.com/deepspeedai/DeepSpeed/pull/7898",
            "https://github.com/deepspeedai/DeepSpeed/releases/tag/v0.18.8",
        ),
    ),
    Advisory(
        "deepspeed-accumulation-scaled-twice",
        "deepspeed",
        ("0.18.3", "0.18.4"),
        _accumulates,
        "gradient accumulation (> 1 step) under the Trainer",
        "gradients are divided by the accumulation steps twice",
        "0.18.3's new backward API scaled each gradient by 1/gradient_accumulation_steps even when the Trainer "
        "asked it not to (scale_wrt_gas=False, transformers PR #35808): grad_norm drops by the accumulation factor "
        "and the loss curves differ with the accumulation steps (PR #7665, fixed by PR #7724 in 0.18.4).",
        'pip install -U "deepspeed>=0.18.4"',
        (
            "https://github.com/deepspeedai/DeepSpeed/pull/7665",
            "https://github.com/deepspeedai/DeepSpeed/pull/7724",
            "https://github.com/huggingface/accelerate/issues/3877",
            "https://github.com/deepspeedai/DeepSpeed/issues/7749",
        ),
    ),
    Advisory(
        "transformers-accumulation-loss",
        "transformers",
        (None, "4.46.0"),
        _accumulates,
        "gradient accumulation (> 1 step)",
        "the loss is averaged per micro-batch, not over the step's tokens",
        "Before 4.46.0 the Trainer averaged each micro-batch's loss over its own tokens and then over the micro-"
        "batches: with padding or varied lengths, short sequences weigh more than under one large batch, and the "
        "logged loss is higher than it should be (the October 2024 gradient accumulation fix, PRs #34191, #34198, "
        "#34283).",
        'pip install -U "transformers>=4.48.1" (4.46.0-4.48.0 have follow-up bugs)',
        (
            "https://huggingface.co/blog/gradient_accumulation",
            "https://github.com/huggingface/transformers/pull/34191",
            "https://github.com/huggingface/transformers/pull/34198",
        ),
    ),
    Advisory(
        "transformers-accumulation-kwargs",
        "transformers",
        ("4.46.0", "4.48.1"),
        _accumulates,
        "gradient accumulation (> 1 step)",
        "the loss can be scaled by the accumulation steps (models without loss kwargs)",
        "The fix of 4.46.0 passed num_items_in_batch to every model: for models whose forward takes no loss "
        "kwargs the loss was no longer divided by the accumulation steps (4.47.0 doubled it at 2 steps; PRs #34511, "
        "#35438, #35651). LLaMA-Factory refuses 4.46.0-4.48.0 for this reason.",
        'pip install -U "transformers>=4.48.1"',
        (
            "https://github.com/huggingface/transformers/pull/34511",
            "https://github.com/huggingface/transformers/pull/35438",
            "https://github.com/huggingface/transformers/pull/35651",
            "https://github.com/huggingface/transformers/issues/35787",
            "https://github.com/hiyouga/LLaMA-Factory/commit/222423bcef9ba99be4f5a4bc2cb2ddffc2057de8",
        ),
    ),
    Advisory(
        "liger-kernel-accumulation",
        "liger-kernel",
        (None, "0.4.1"),
        _liger_accumulates,
        "liger-kernel on, gradient accumulation (> 1 step), transformers 4.46 or newer",
        "Liger's fused loss ignores num_items_in_batch: the loss is off by about the accumulation factor",
        "Liger's patched forward predates transformers 4.46's num_items_in_batch (PR #322: 'liger kernel losses "
        "seem to be off by an order of magnitude'); fixed for the fused path in 0.4.0 (#333, #354) and the plain "
        "cross-entropy in 0.4.1 (#375).",
        'pip install -U "liger-kernel>=0.4.1"',
        (
            "https://github.com/linkedin/Liger-Kernel/pull/322",
            "https://github.com/linkedin/Liger-Kernel/pull/333",
            "https://github.com/linkedin/Liger-Kernel/pull/375",
        ),
    ),
    Advisory(
        "flash-attn-wheel-torch",
        "flash-attn",
        (None, None),
        _flash_wheel_for_other_torch,
        "a prebuilt wheel whose name says another torch",
        "flash-attn's wheel was built for torch {wheel_torch} (CUDA {wheel_cuda}), this torch is {torch}",
        "A flash-attn wheel links libtorch's C++ symbols: it fits one torch major.minor, CUDA major and C++ ABI. "
        "Another torch fails at import with 'undefined symbol: _ZN3c10...' or, where the symbols happen to exist, "
        "misbehaves (Dao-AILab/flash-attention#919: 'may or may not be compatible'). Read from the wheel name pip "
        "recorded in direct_url.json.",
        "pip uninstall -y flash-attn && pip install flash-attn --no-build-isolation --no-cache-dir (with the final "
        "torch already installed), or the release wheel whose name matches this torch",
        (
            "https://github.com/Dao-AILab/flash-attention/issues/919",
            "https://github.com/Dao-AILab/flash-attention/issues/457",
            "https://github.com/Dao-AILab/flash-attention/issues/1444",
            "https://github.com/Dao-AILab/flash-attention/issues/821",
        ),
    ),
)


def affected(advisory: Advisory, version: str) -> bool | None:
    """Whether `version` is among the advisory's releases, as PEP 440 orders them (0.19.0rc1 comes before 0.19.0,
    2.13.0+cpu after 2.13.0); None: not a version PEP 440 reads, so not judged."""
    if advisory.affected == (None, None):  # every release: the version is never compared
        return True
    return in_range(version, *advisory.affected)


def releases(advisory: Advisory) -> str:
    first, fixed = advisory.affected
    if first and fixed:
        return f"{first} up to {fixed}"
    return f"before {fixed}" if fixed else "any release"


@check(
    "known-bad-versions",
    "installed releases with a known bug (upstream issue and fix) that this run would hit",
    messages={
        **{a.id: f"{a.package} {releases(a)} with {a.trigger}" for a in ADVISORIES},
        "unreadable-version": "a version string PEP 440 cannot read: no advisory judged",
    },
)
def known_bad_versions(
    packages: dict[str, Any],
    plan=None,
    deepspeed_config: dict[str, Any] | None = None,
    torch_build: dict[str, Any] | None = None,
    flash_attn: dict[str, Any] | None = None,
):
    run = _run(packages, plan, deepspeed_config, torch_build, flash_attn)
    findings, checked, unread = [], [], {}
    for advisory in ADVISORIES:
        version = packages.get(advisory.package)
        if version is None:
            continue
        if version_key(version) is None:  # never "no known-bad release" for a version that could not be compared
            unread[advisory.package] = version
        else:
            checked.append(f"{advisory.package} {version}")
        if not affected(advisory, version):  # None: not judged, said above
            continue
        hit = advisory.hits(run)
        if hit is False:
            continue
        findings.append(_finding(advisory, version, run, hit))
    findings += [_unjudged(name, version) for name, version in unread.items()]
    if not checked and not unread:
        raise NotApplicable("none of deepspeed, transformers, liger-kernel, flash-attn is installed")
    if not findings:
        return ok(
            f"no known-bad release among {', '.join(dict.fromkeys(checked))} for this run "
            f"({len(ADVISORIES)} advisories)",
            evidence={"checked": sorted(set(checked))},
        )
    return findings


def _unjudged(name: str, version: str):
    bugs = [a.id for a in ADVISORIES if a.package == name]
    return warning(
        f"cannot judge {name} {version!r}: not a version PEP 440 reads",
        detail=f"Its releases are compared with the known-bad ranges of {', '.join(bugs)}; this version "
        "string has no place among them, so none of them is ruled out.",
        fix=f"reinstall {name} from a release (`pip install --force-reinstall {name}==X.Y.Z`), or record "
        "its real version in the facts snapshot",
        evidence={"package": name, "version": version, "advisories": bugs},
        id="known-bad-versions/unreadable-version",
    )


def _finding(advisory: Advisory, version: str, run: Stack, hit: bool | None):
    names = {
        "stage": run.stage,
        "torch": ".".join(map(str, run.torch or ())) or "?",
        "wheel_torch": ".".join(map(str, (run.flash_wheel or {}).get("torch", ()))) or "?",
        "wheel_cuda": (run.flash_wheel or {}).get("cuda", "?"),
    }
    title = f"{advisory.package} {version}: " + advisory.title.format(**names)
    evidence = {
        "advisory": advisory.id,
        "package": advisory.package,
        "version": version,
        "releases": releases(advisory),
        "sources": list(advisory.sources),
        "trigger": advisory.trigger,
    }
    if hit:
        return warning(
            title,
            detail=f"{advisory.detail} This run has {advisory.trigger}. Sources: {', '.join(advisory.sources)}",
            fix=advisory.fix,
            evidence=evidence,
            id=f"known-bad-versions/{advisory.id}",
        )
    return info(
        f"{advisory.package} {version} has a known bug with {advisory.trigger}; cannot tell whether this run uses that",
        detail=f"{advisory.detail} Sources: {', '.join(advisory.sources)}",
        fix=f"give the run config (--config) to judge; or {advisory.fix}",
        evidence=evidence,
        id=f"known-bad-versions/{advisory.id}",
    )


def _run(packages, plan, deepspeed_config, torch_build, flash_attn) -> Stack:
    if plan is not None:
        zero = ((plan.deepspeed or {}).get("zero_optimization") or {}) if plan.deepspeed else {}
        accumulation, liger = plan.gradient_accumulation_steps, plan.liger_kernel
    else:
        config = (deepspeed_config or {}).get("config") if deepspeed_config else None
        zero = (config.get("zero_optimization") or {}) if isinstance(config, dict) else None
        accumulation, liger = _json_accumulation(config), None
    cuda = version_tuple((torch_build or {}).get("cuda"))
    return Stack(
        packages,
        version_tuple((torch_build or {}).get("version")),
        cuda[0] if cuda else None,
        zero if isinstance(zero, dict) else None,
        accumulation,
        liger,
        _wheel((flash_attn or {}).get("wheel")),
    )


def _json_accumulation(config: dict[str, Any] | None) -> int | None:
    value = (config or {}).get("gradient_accumulation_steps")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_WHEEL_TAG = re.compile(r"\+cu(\d+)torch(\d+)\.(\d+)")


def _wheel(url: str | None) -> dict[str, Any] | None:
    """flash_attn-2.7.4.post1+cu12torch2.6cxx11abiFALSE-cp311-...whl -> {"cuda": 12, "torch": (2, 6)}."""
    match = _WHEEL_TAG.search((url or "").replace("%2B", "+").replace("%2b", "+"))
    if not match:
        return None
    cuda = match[1] if len(match[1]) <= 2 else match[1][:-1]  # cu12 -> 12, cu118 -> 11, cu122 -> 12
    return {"cuda": int(cuda), "torch": (int(match[2]), int(match[3]))}
