"""lora-targets, qlora and learning-rate: adapters that wrap the layers they name, a quantized base the GPUs
and DeepSpeed can run, and a learning rate in the range of the kind of fine-tune the run is."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.errors import did_you_mean
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.gpus import capability, describe_gpus, devices, lacking, version_tuple
from sftdoctor.run.lora import targeted, unmatched

# peft's LoraConfig gained use_rslora in 0.7.0 and use_dora in 0.9.0 (its release notes).
PEFT_SINCE = {"use_rslora": (0, 7), "use_dora": (0, 9)}
# bitsandbytes 0.50 installation guide: NF4/FP4 on compute capability 6.0+, LLM.int8() on 7.5+.
BNB_MIN_CC = {"4bit": (6, 0), "8bit": (7, 5)}
# Usual learning rates, with where they come from.
LORA_RATES = (
    "1e-4 to 3e-4: QLoRA (Dettmers et al., 2023) used 2e-4 for 7B-13B and 1e-4 for 33B-65B; peft's and "
    "TRL's LoRA examples use 1e-4 to 2e-4"
)
FULL_RATES = (
    "1e-5 to 5e-5: Stanford Alpaca and Zephyr's SFT (alignment-handbook) use 2e-5, Tulu 2 (Ivison et al., 2023) 2e-5"
)


def _groups(entries: list[dict[str, Any]]) -> str:
    return ", ".join(f"{e['pattern'].rsplit('.', 1)[-1]} x{e['count']}" for e in entries)


@check(
    "lora-targets",
    "LoRA's target_modules and modules_to_save exist in the model; what the adapters train",
    messages={
        "no-peft": "[lora] is set but peft is not installed",
        "peft-too-old": "a [lora] option needs a newer peft",
        "layers-unlisted": "the model's layers could not be listed",
        "missing-targets": "target_modules names layers the model does not have",
        "unknown-modules-to-save": "modules_to_save names modules the model does not have",
    },
)
def lora_targets(plan, lora_modules: dict[str, Any], packages: dict[str, Any] | None = None):
    lora = plan.lora
    if lora is None:
        raise NotApplicable("no [lora] in the run config: a full fine-tune")
    findings = _peft_findings(lora, packages)
    if "error" in lora_modules:
        findings.append(
            warning(
                f"the model's layers could not be listed ({lora_modules['error']})",
                fix="run `sftdoctor check --config RUN.toml --select lora-targets` where the model's "
                "code and config are installed",
                id="lora-targets/layers-unlisted",
            )
        )
        return findings
    layers = {e["pattern"].rsplit(".", 1)[-1] for e in lora_modules["linear"]}
    missing = unmatched(lora_modules, lora["target_modules"])
    evidence = {"target_modules": lora["target_modules"], "linear_layers": sorted(layers), "missing": missing}
    if missing:
        findings.append(_missing_targets(lora, lora_modules, layers, missing, evidence))
    unknown = _unknown_modules_to_save(lora, lora_modules.get("modules") or {})
    if unknown:
        findings.append(unknown)
    if any(f.severity.rank >= 3 for f in findings):
        return findings
    findings.insert(0, _adapters_trained(lora, lora_modules, evidence))
    return findings


def _peft_findings(lora: dict[str, Any], packages: dict[str, Any] | None) -> list:
    """peft missing, or too old for an option [lora] sets."""
    findings = []
    peft = (packages or {}).get("peft")
    if packages is not None and not peft:
        findings.append(
            error("[lora] is set but peft is not installed", fix="pip install 'peft>=0.13'", id="lora-targets/no-peft")
        )
    for key, since in PEFT_SINCE.items():
        if lora[key] and peft and (version_tuple(peft) or (0,)) < since:
            findings.append(
                error(
                    f"[lora] {key} = true needs peft {'.'.join(map(str, since))} or newer; peft {peft} is installed",
                    fix=f"pip install -U peft (or [lora] {key} = false)",
                    id="lora-targets/peft-too-old",
                )
            )
    return findings


def _missing_targets(lora, lora_modules, layers: set[str], missing: list[str], evidence: dict[str, Any]):
    wrapped = targeted(lora_modules, lora["target_modules"])
    hint = "; ".join(f"{name}{did_you_mean(name, layers)}" for name in missing)
    return error(
        f"[lora] target_modules names {len(missing)} layer{'s' if len(missing) > 1 else ''} this "
        f"{lora_modules.get('model_type') or 'model'} does not have: {hint}",
        detail=(
            'peft refuses a list that matches nothing ("Target modules ... not found in the base model").'
            if not wrapped
            else "peft silently skips names that match nothing when others match: those "
            f"layers would train no adapter. Wrapped: {_groups(wrapped)}."
        )
        + f" Its linear layers: {', '.join(sorted(layers))}.",
        fix='[lora] target_modules = "all-linear", or names from the list above',
        evidence=evidence,
        id="lora-targets/missing-targets",
    )


def _unknown_modules_to_save(lora, modules: dict[str, Any]):
    unknown = [name for name in lora["modules_to_save"] if name not in modules]
    if not unknown:
        return None
    return error(
        f"[lora] modules_to_save names {', '.join(unknown)}, not a module of this model"
        f"{did_you_mean(unknown[0], modules)}",
        fix="name modules of the model (e.g. embed_tokens, lm_head)",
        evidence={"modules_to_save": unknown},
        id="lora-targets/unknown-modules-to-save",
    )


def _adapters_trained(lora, lora_modules, evidence: dict[str, Any]):
    trainable, base = lora["trainable_params"], lora["base_params"]
    wrapped = targeted(lora_modules, lora["target_modules"])
    share = f" ({trainable / base:.2%} of {base:,})" if trainable and base else ""
    return ok(
        f"adapters of rank {lora['r']} on {sum(e['count'] for e in wrapped)} layers train {trainable:,} parameters"
        f"{share}",
        detail=f"Wrapped: {_groups(wrapped)}"
        + (f"; trained in full: {', '.join(lora['modules_to_save'])}" if lora["modules_to_save"] else "")
        + ".",
        evidence={**evidence, "trainable_params": trainable, "base_params": base},
    )


@check(
    "qlora",
    "QLoRA's quantized base: CUDA, bitsandbytes importable, a GPU it supports, ZeRO and precision that fit",
    messages={
        "no-gpu": "a quantized base needs a CUDA GPU, and none is visible",
        "no-bitsandbytes": "bitsandbytes is not installed",
        "bitsandbytes-import": "bitsandbytes does not import against this torch",
        "old-gpu": "GPUs below the compute capability bitsandbytes' layers need",
        "offload-params": "offload_params with a quantized base",
        "offload-optimizer": "offload_optimizer with QLoRA moves only the adapters' optimizer states",
        "fp16-on-bf16": "QLoRA computes in fp16 over a model saved in bf16",
    },
)
def qlora(
    plan,
    gpus: dict[str, Any] | None = None,
    bitsandbytes: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
):
    quantize = (plan.lora or {}).get("quantize", "none")
    if quantize == "none":
        raise NotApplicable("no [lora] quantize: the base is not quantized")
    found = devices(gpus)
    said = (
        _no_gpu(quantize, found),
        _bitsandbytes_broken(bitsandbytes),
        _old_gpus(quantize, found),
        _offload(plan),
        _fp16_on_bf16(plan, (model_config or {}).get("dtype")),
    )
    findings = [f for f in said if f is not None]
    if any(f.severity.rank >= 3 for f in findings):
        return findings
    findings.insert(0, _quantized_base(plan, quantize, found, bitsandbytes))
    return findings


def _no_gpu(quantize: str, found: list):
    if found:
        return None
    return error(
        f'[lora] quantize = "{quantize}" needs a CUDA GPU, and none is visible',
        detail="bitsandbytes' 4- and 8-bit layers run on GPUs; a CPU rehearsal of QLoRA cannot load the base.",
        fix='run on the GPU machine, or [lora] quantize = "none" to rehearse with LoRA in 16 bits',
        id="qlora/no-gpu",
    )


def _bitsandbytes_broken(bitsandbytes: dict[str, Any] | None):
    if bitsandbytes is not None and not bitsandbytes.get("installed"):
        return error(
            "[lora] quantize needs bitsandbytes, which is not installed",
            fix="pip install bitsandbytes",
            id="qlora/no-bitsandbytes",
        )
    if bitsandbytes is not None and not bitsandbytes.get("import_ok"):
        return error(
            f"bitsandbytes {bitsandbytes.get('version')} does not import against this torch: "
            f"{bitsandbytes.get('import_error')}",
            fix="pip install -U bitsandbytes (a build for this torch and CUDA)",
            evidence=bitsandbytes,
            id="qlora/bitsandbytes-import",
        )
    return None


def _old_gpus(quantize: str, found: list):
    old = lacking(found, BNB_MIN_CC[quantize])
    if not old:
        return None
    need = ".".join(map(str, BNB_MIN_CC[quantize]))
    return error(
        f"{describe_gpus(old)} are below compute capability {need}, which bitsandbytes' {quantize} layers need",
        detail="bitsandbytes 0.50: NF4/FP4 need 6.0+ (Pascal), LLM.int8() 7.5+ (Turing).",
        fix='[lora] quantize = "4bit"'
        if quantize == "8bit" and not lacking(found, BNB_MIN_CC["4bit"])
        else '[lora] quantize = "none" (LoRA in 16 bits)',
        id="qlora/old-gpu",
    )


def _offload(plan):
    """DeepSpeed offload with a quantized base: impossible for the parameters, of little use for the optimizer."""
    if plan.offload_params:
        return error(
            "[deepspeed] offload_params with a quantized base: DeepSpeed cannot offload bitsandbytes' packed 4-bit "
            "weights",
            fix="offload_params = false (the quantized base is already a quarter of its 16-bit size)",
            id="qlora/offload-params",
        )
    if plan.offload_optimizer:
        return info(
            "[deepspeed] offload_optimizer with QLoRA moves only the adapters' optimizer states to the CPU",
            detail=f"They are {16 * (plan.lora['trainable_params'] or 0) / 2**20:,.0f} MiB (AdamW's fp32 states and "
            "master copy); each step pays the CPU round trip for that.",
            fix="offload_optimizer = false unless memory-fit says it is needed",
            id="qlora/offload-optimizer",
        )
    return None


def _fp16_on_bf16(plan, saved: str | None):
    if plan.precision != "fp16" or saved != "bfloat16":
        return None
    return warning(
        "QLoRA computes in fp16 (bnb_4bit_compute_dtype) over a model saved in bf16",
        detail="Each 4-bit weight is dequantized to fp16 for its matmul: "
        "bf16-trained activations overflow fp16's "
        "65504 and the loss turns NaN.",
        fix='[model] precision = "bf16" on Ampere or newer; on older GPUs keep fp16 only with loss scaling',
        id="qlora/fp16-on-bf16",
    )


def _quantized_base(plan, quantize: str, found: list, bitsandbytes: dict[str, Any] | None):
    lora = plan.lora
    storage = lora["quant_storage"]
    where = f" on {describe_gpus(found)}" if found and all(capability(d) for d in found) else ""
    return ok(
        f"{'4-bit NF4 with double quantization' if quantize == '4bit' else 'LLM.int8()'} base computing in "
        f"{lora['compute_dtype']}{where}"
        + (f"; stored as {storage} so ZeRO-3 can partition it" if plan.zero_stage == 3 and quantize == "4bit" else ""),
        evidence={
            "quantize": quantize,
            "compute_dtype": lora["compute_dtype"],
            "quant_storage": storage,
            "bitsandbytes": (bitsandbytes or {}).get("version"),
        },
    )


@check(
    "learning-rate",
    "a learning rate in the usual range for the kind of fine-tune (LoRA or full)",
    messages={
        "lora-too-low": "a full fine-tune's learning rate with LoRA: the adapters learn slowly",
        "lora-too-high": "a LoRA learning rate above the usual range",
        "full-too-low": "a full fine-tune's learning rate below the usual range",
        "full-too-high": "a LoRA learning rate for a full fine-tune",
    },
)
def learning_rate(plan):
    if plan.weights == "random":
        raise NotApplicable('[model] weights = "random": trained from scratch, not fine-tuned')
    rate, lora = plan.learning_rate, plan.lora is not None
    evidence = {"learning_rate": rate, "lora": lora}
    if lora and rate < 5e-5:
        return info(
            f"learning rate {rate:g} with LoRA is a full fine-tune's rate: the adapters will learn slowly",
            detail=f"Usual LoRA rates are {LORA_RATES}. Adapters start at zero (B = 0) and train a small "
            "fraction of the weights, so they take larger steps.",
            fix="[training] learning_rate = 2e-4",
            evidence=evidence,
            id="learning-rate/lora-too-low",
        )
    if lora and rate > 1e-3:
        return info(
            f"learning rate {rate:g} with LoRA is above the usual range: expect loss spikes",
            detail=f"Usual LoRA rates are {LORA_RATES}.",
            fix="[training] learning_rate = 2e-4",
            evidence=evidence,
            id="learning-rate/lora-too-high",
        )
    if not lora and rate < 1e-6:
        return info(
            f"learning rate {rate:g} for a full fine-tune is below the usual range: the weights will barely move",
            detail=f"Usual full fine-tuning rates are {FULL_RATES}.",
            fix="[training] learning_rate = 2e-5",
            evidence=evidence,
            id="learning-rate/full-too-low",
        )
    if not lora and rate >= 1e-4:
        return info(
            f"learning rate {rate:g} for a full fine-tune is a LoRA rate: expect loss spikes and forgetting",
            detail=f"Usual full fine-tuning rates are {FULL_RATES}. Every weight moves at this rate.",
            fix="[training] learning_rate = 2e-5 (or add [lora] to train adapters)",
            evidence=evidence,
            id="learning-rate/full-too-high",
        )
    kind = "LoRA" if lora else "full fine-tune"
    return ok(
        f"learning rate {rate:g} is in the usual range for a {kind}",
        detail=f"Usual rates: {LORA_RATES if lora else FULL_RATES}.",
        evidence=evidence,
    )
