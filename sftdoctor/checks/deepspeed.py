"""deepspeed-precision: the DeepSpeed JSON's precision, offload and clipping against the run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sftdoctor.checks import check
from sftdoctor.checks._common import BATCH_KEYS, ds_precision_flags, requested_precision, trainer_mismatches
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.gpus import bf16_capable

BF16_FIX = '{"fp16": {"enabled": false}, "bf16": {"enabled": true}}  (or both "auto" with [model] precision = "bf16")'


def _resolve(flag: Any, precision: str | None, name: str) -> Any:
    """transformers fills "auto" from TrainingArguments (integrations/deepspeed.py, 4.x-5.x)."""
    if flag == "auto" and precision is not None:
        return precision == name
    return flag


def _disagrees_with_run(flags: dict[str, Any], precision: str | None) -> list[str]:
    """Hard-coded flags that transformers will find in conflict with the run's precision."""
    if precision is None:
        return []
    out = []
    for name, key in (("fp16", "fp16"), ("bf16", flags["bf16_key"] or "bf16")):
        value = flags[name]
        if isinstance(value, bool) and value != (precision == name) and key != "bfloat16":
            out.append(f"{key}.enabled={str(value).lower()}")
    return out


def _offload_devices(zero: dict[str, Any]) -> dict[str, str]:
    found = {}
    for key in ("offload_optimizer", "offload_param"):
        block = zero.get(key)
        if isinstance(block, dict) and block.get("device") not in (None, "none"):
            found[key] = str(block["device"])
    if zero.get("cpu_offload") is True:  # DeepSpeed < 0.5 spelling of offload_optimizer
        found.setdefault("offload_optimizer", "cpu")
    if zero.get("cpu_offload_params") is True:
        found.setdefault("offload_param", "cpu")
    return found


def _nodes(plan, env: dict[str, str] | None) -> int:
    if plan is not None:
        return plan.nnodes
    env = env or {}
    try:
        if "SLURM_JOB_NUM_NODES" in env:
            return int(env["SLURM_JOB_NUM_NODES"])
        if "WORLD_SIZE" in env and "LOCAL_WORLD_SIZE" in env:
            return max(1, int(env["WORLD_SIZE"]) // int(env["LOCAL_WORLD_SIZE"]))
    except ValueError:
        pass
    return 1


@check(
    "deepspeed-precision",
    "DeepSpeed fp16/bf16 flags, offload and gradient clipping vs GPUs, model and run",
    messages={
        "fp16-and-bf16": "fp16 and bf16 are both enabled",
        "precision-mismatch": "an fp16/bf16 value disagrees with the run's precision",
        "fp16-hard-coded": "fp16 is hard-coded where bf16 fits the GPUs or the model",
        "static-loss-scale": "fp16 with a static loss scale",
        "legacy-bfloat16-key": 'the legacy "bfloat16" key',
        "offload-one-node": "ZeRO-3 offload on a single node",
        "bf16-section-added": "a bf16 run with no bf16 section: accelerate adds one",
        "clipping-zero": "gradient_clipping is 0: gradients are never clipped",
        "clipping-default": "no gradient_clipping: DeepSpeed's default clips",
        "no-clipping": "no gradient_clipping: DeepSpeed's default never clips",
        "trainer-mismatch": "values transformers refuses because they differ from the run's",
    },
)
def deepspeed_precision(
    deepspeed_config: dict[str, Any],
    plan=None,
    model_config: dict[str, Any] | None = None,
    gpus: dict[str, Any] | None = None,
    deepspeed_defaults: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
):
    r = _read(deepspeed_config, plan)
    findings = [
        f
        for f in (
            _precision(r, model_config, gpus),
            _legacy_bfloat16_key(r),
            _offload_on_one_node(r, _nodes(plan, env)),
        )
        if f is not None
    ]
    findings += _gradient_clipping(r.path, r.cfg, deepspeed_defaults, plan is not None, r.evidence)
    if plan is not None:
        findings += _fixed_values(r.path, r.cfg, plan, r.evidence)
    if not findings or all(f.severity.rank <= 1 for f in findings):
        mode = (
            "bf16"
            if r.bf16 is True
            else "fp16"
            if r.fp16 is True
            else (f"fp16={json.dumps(r.flags['fp16'])}, bf16={json.dumps(r.flags['bf16'])}")
        )
        findings.insert(
            0,
            ok(
                f"{r.path}: ZeRO-{r.stage}, {mode}, gradient_clipping={r.evidence['gradient_clipping']}",
                evidence=r.evidence,
            ),
        )
    return findings


@dataclass(frozen=True)
class _Reading:
    """The DeepSpeed JSON's precision and ZeRO settings, with "auto" resolved against the run's precision."""

    path: str
    cfg: dict[str, Any]
    flags: dict[str, Any]
    precision: str | None
    why: str
    fp16: Any
    bf16: Any
    bf16_added: bool  # a bf16 run with no bf16 section: accelerate adds one
    zero: dict[str, Any]
    stage: Any
    evidence: dict[str, Any]


def _read(deepspeed_config: dict[str, Any], plan) -> _Reading:
    path, cfg = deepspeed_config["path"], deepspeed_config["config"]
    flags = ds_precision_flags(cfg)
    precision, why = requested_precision(plan, None)
    fp16, bf16 = _resolve(flags["fp16"], precision, "fp16"), _resolve(flags["bf16"], precision, "bf16")
    bf16_added = precision == "bf16" and flags["bf16_key"] is None and fp16 is not True
    bf16 = True if bf16_added else bf16
    zero = cfg.get("zero_optimization") if isinstance(cfg.get("zero_optimization"), dict) else {}
    stage = zero.get("stage", 0)
    evidence = {
        "path": path,
        "fp16": flags["fp16"],
        "bf16": flags["bf16"],
        "bf16_key": flags["bf16_key"],
        "resolved": {"fp16": fp16, "bf16": bf16},
        "zero_stage": stage,
        "gradient_clipping": cfg.get("gradient_clipping", "absent"),
    }
    return _Reading(path, cfg, flags, precision, why, fp16, bf16, bf16_added, zero, stage, evidence)


def _precision(r: _Reading, model_config: dict[str, Any] | None, gpus: dict[str, Any] | None):
    """fp16 and bf16 both on, a value that disagrees with the run, fp16 hard-coded, or a bf16 section added."""
    mismatched = _disagrees_with_run(r.flags, r.precision)
    if r.fp16 is True and r.bf16 is True:
        return error(
            f"{r.path}: fp16 and bf16 are both enabled",
            detail="DeepSpeed refuses the config at initialisation: "
            "'bfloat16 and fp16 modes cannot be simultaneously enabled'.",
            fix=BF16_FIX + " on Ampere or newer; else the reverse",
            evidence=r.evidence,
            id="deepspeed-precision/fp16-and-bf16",
            explain="deepspeed-precision#precision-mismatch",
        )
    if mismatched:
        return error(
            f"{r.path}: {', '.join(mismatched)} disagree(s) with the run's precision {r.precision} ({r.why})",
            detail='transformers compares every non-"auto" value with TrainingArguments and stops after the model '
            "has loaded: 'Please correct the following DeepSpeed config values that mismatch "
            "TrainingArguments values'.",
            fix='set "enabled": "auto" under "fp16" and "bf16" and choose the precision in the run config',
            evidence=r.evidence,
            id="deepspeed-precision/precision-mismatch",
            explain="deepspeed-precision#precision-mismatch",
        )
    if r.flags["fp16"] is True:  # hard-coded fp16 ("auto" follows the run's precision, judged by bf16-support)
        return _hard_coded_fp16(r, model_config, gpus)
    return _bf16_section_added(r.path, r.flags, r.evidence) if r.bf16_added else None


def _hard_coded_fp16(r: _Reading, model_config: dict[str, Any] | None, gpus: dict[str, Any] | None):
    reasons = []
    if bf16_capable(gpus):
        reasons.append("every GPU here supports bf16")
    if (model_config or {}).get("dtype") == "bfloat16":
        reasons.append(f"the model was saved in bfloat16 ({model_config.get('path')})")
    if reasons:
        return warning(
            f"{r.path}: fp16 is hard-coded although {' and '.join(reasons)}",
            detail="bf16-pretrained weights overflow fp16's range (max 65504): NaN losses and OVERFLOW-skipped "
            "steps are the usual result. bf16 needs no loss scaling.",
            fix=BF16_FIX,
            evidence=r.evidence,
            id="deepspeed-precision/fp16-hard-coded",
            explain="deepspeed-precision#fp16-hard-coded",
        )
    if (r.cfg.get("fp16") or {}).get("loss_scale", 0) not in (0, "auto"):
        return info(
            f"{r.path}: fp16 with a static loss scale of {r.cfg['fp16']['loss_scale']}",
            detail="A static scale never adapts: too high overflows every step, too low underflows small gradients.",
            fix='"loss_scale": 0 selects dynamic loss scaling',
            evidence=r.evidence,
            id="deepspeed-precision/static-loss-scale",
            explain="deepspeed-precision#static-loss-scale",
        )
    return None


def _legacy_bfloat16_key(r: _Reading):
    if r.flags["bf16_key"] != "bfloat16":
        return None
    auto = r.flags["bf16"] == "auto"
    return (warning if auto else info)(
        f'{r.path}: legacy key "bfloat16"',
        detail='DeepSpeed still reads it, but transformers fills "auto" only under "bf16": '
        '"bfloat16": {"enabled": "auto"} reaches DeepSpeed unresolved, which (0.19) drops the '
        'leftover "auto" and leaves bf16 off — the run silently trains in fp32.'
        if auto
        else 'DeepSpeed still reads it; transformers fills "auto" only under "bf16".',
        fix='rename "bfloat16" to "bf16"',
        evidence=r.evidence,
        id="deepspeed-precision/legacy-bfloat16-key",
        explain="deepspeed-precision#legacy-bfloat16-key",
    )


def _offload_on_one_node(r: _Reading, nodes: int):
    offload = _offload_devices(r.zero)
    if r.stage != 3 or not offload or nodes != 1:
        return None
    return warning(
        f"{r.path}: ZeRO-3 with {', '.join(f'{k} to {v}' for k, v in offload.items())} on a single node",
        detail="Every step moves parameters and optimizer states across PCIe and runs Adam on the CPU; "
        "throughput is typically several times lower than ZeRO-2 without offload. The usual order "
        "of speed is ZeRO-2 > ZeRO-2+offload > ZeRO-3 > ZeRO-3+offload (DeepSpeed #6695: offload is "
        "meant for models that do not fit otherwise).",
        fix="use ZeRO-2 (or ZeRO-3 without offload) if the model fits; offload only the optimizer if it "
        "almost does (`sftdoctor explain zero-stage`)",
        evidence=r.evidence,
        id="deepspeed-precision/offload-one-node",
        explain="deepspeed-precision#offload-one-node",
    )


def _bf16_section_added(path: str, flags: dict[str, Any], evidence):
    """A bf16 run whose JSON has no bf16 section. transformers fills only keys that are present, so "fp16":
    "auto" becomes false and nothing says bf16; accelerate then adds {"bf16": {"enabled": true}} because the
    run's mixed precision is bf16 (DeepSpeedPlugin.set_mixed_precision, accelerate 1.16, pinned by a test).
    The run trains in bf16, but only by that step: the JSON alone reads as fp32."""
    fp16 = f'"fp16": {{"enabled": {json.dumps(flags["fp16"])}}} and ' if flags["fp16"] is not None else ""
    return info(
        f"{path}: no bf16 section for a bf16 run; accelerate adds one, so it trains in bf16",
        detail=f'{fp16}no "bf16" section: transformers fills only the keys present ("auto" under fp16 '
        'becomes false), then accelerate adds {"bf16": {"enabled": true}} for the run\'s bf16. '
        "Given to deepspeed.initialize by a loop of your own, the same JSON trains in fp32.",
        fix='add "bf16": {"enabled": "auto"} so the JSON says what runs',
        evidence=evidence,
        id="deepspeed-precision/bf16-section-added",
        explain="deepspeed-precision#bf16-section-added",
    )


def _gradient_clipping(path: str, cfg: dict[str, Any], defaults: dict[str, Any] | None, with_trainer: bool, evidence):
    value = cfg.get("gradient_clipping")
    if value == 0:
        # transformers (4.x-5.x) compares a non-"auto" value with max_grad_norm (default 1.0) and refuses
        # a mismatch at start; DeepSpeed on its own runs and never clips.
        return [
            (error if with_trainer else warning)(
                f"{path}: gradient_clipping is 0: gradients are never clipped",
                detail="Under the transformers Trainer the run stops at start: 'Please correct the following DeepSpeed "
                "config values that mismatch TrainingArguments values: - ds gradient_clipping=0 vs hf "
                "max_grad_norm=1.0'. Run by DeepSpeed alone, one bad batch can blow the weights up.",
                fix='"gradient_clipping": "auto" (takes max_grad_norm, default 1.0)',
                evidence=evidence,
                id="deepspeed-precision/clipping-zero",
                explain="deepspeed-precision#no-clipping",
            )
        ]
    if value is not None:
        return []
    # transformers fills the key only when it is present and "auto": an absent key keeps DeepSpeed's
    # default, whatever max_grad_norm says. That default was 0 (off) until DeepSpeed PR #8068 (2026), 1.0 since.
    default = (defaults or {}).get("gradient_clipping")
    installed = (defaults or {}).get("version")
    fix = '"gradient_clipping": "auto" (takes max_grad_norm from the run, default 1.0)'
    if default is not None and float(default) > 0:
        return [
            info(
                f"{path}: no gradient_clipping; DeepSpeed {installed} clips at {default} by default",
                detail="max_grad_norm of the run is ignored while the key is absent; DeepSpeed releases "
                "before PR #8068 (2026) do not clip at all.",
                fix=fix,
                evidence=evidence,
                id="deepspeed-precision/clipping-default",
                explain="deepspeed-precision#no-clipping",
            )
        ]
    said = (
        f"DeepSpeed {installed} defaults to 0"
        if installed
        else "DeepSpeed releases before PR #8068 (2026) default to 0"
    )
    return [
        warning(
            f"{path}: no gradient_clipping: {said}, so gradients are never clipped",
            detail="transformers does not fill an absent key from max_grad_norm.",
            fix=fix,
            evidence=evidence,
            id="deepspeed-precision/no-clipping",
            explain="deepspeed-precision#no-clipping",
        )
    ]


def _fixed_values(path: str, cfg: dict[str, Any], plan, evidence) -> list:
    """Optimizer, scheduler and clipping values the JSON fixes that transformers will refuse (the batch keys are
    batch-size's; a clipping of 0 is judged above)."""
    fixed = {
        key: pair
        for key, pair in trainer_mismatches(cfg, plan).items()
        if key not in BATCH_KEYS and not (key == "gradient_clipping" and pair[0] == 0)
    }
    if not fixed:
        return []
    said = ", ".join(
        f"{key} = {json.dumps(value)} (the run: {json.dumps(expected)})" for key, (value, expected) in fixed.items()
    )
    return [
        error(
            f"{path}: {said}: transformers refuses values that differ from the run's",
            detail='transformers fills these keys where they are "auto" and compares any other value with '
            "TrainingArguments at trainer.train(), once the model has loaded: 'Please correct the "
            "following DeepSpeed config values that mismatch TrainingArguments values'.",
            fix=f'set {", ".join(fixed)} to "auto" and keep the values in the run config ([training])',
            evidence={**evidence, "mismatches": {k: v for k, (v, _) in fixed.items()}},
            id="deepspeed-precision/trainer-mismatch",
            explain="deepspeed-precision#precision-mismatch",
        )
    ]
