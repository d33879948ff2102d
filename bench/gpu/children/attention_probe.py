"""sftdoctor's packing probe under each attention implementation, in one process, as one JSON line.

    python bench/gpu/children/attention_probe.py MODEL_DIR IMPL[,IMPL...] [--cuda]

For each implementation: `sftdoctor.facts.packing_probe.run`, exactly what the `packing` check runs (it puts
flash attention on the GPU and the others on the CPU in float32). With --cuda, eager, sdpa and flex_attention
are probed on the GPU too, in bf16 with the probe's own model, samples, collator and comparison
(`max_packed_diff`): sdpa's CUDA kernels (flash, memory-efficient, cuDNN) are not the CPU's math kernel.
"""

import json
import sys
import time

BF16_TOLERANCE = 2e-2  # the probe's own tolerance for bf16 logits


def sftdoctor_probe(model_dir, impl):
    from sftdoctor.facts.packing_probe import measure

    began = time.perf_counter()
    try:
        out = measure({"config": model_dir, "attn_implementation": impl})
    except Exception as exc:
        out = {"isolated": None, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    return {**out, "seconds": round(time.perf_counter() - began, 2)}


def on_cuda(model_dir, impl):
    """The probe's comparison with the model on the GPU in bf16."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from sftdoctor.facts.packing_probe import max_packed_diff, shrink

    began = time.perf_counter()
    try:
        config = AutoConfig.from_pretrained(model_dir)
        shrink(config)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.bfloat16)
        model = model.to("cuda").eval()
        samples = [torch.randint(3, 500, (n,)).tolist() for n in (7, 5, 9)]
        batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([{"input_ids": s} for s in samples])
        batch.pop("labels")
        diff = max_packed_diff(model, samples, batch, "cuda")
        out = {
            "isolated": diff <= BF16_TOLERANCE,
            "max_abs_diff": diff,
            "tolerance": BF16_TOLERANCE,
            "attn_implementation": impl,
            "device": "cuda",
        }
    except Exception as exc:
        out = {
            "isolated": None,
            "attn_implementation": impl,
            "device": "cuda",
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
        }
    return {**out, "seconds": round(time.perf_counter() - began, 2)}


def main(model_dir, impls, cuda):
    results = {}
    for impl in impls:
        results[impl] = sftdoctor_probe(model_dir, impl)
        if cuda and not impl.startswith("flash"):
            results[f"{impl} on cuda"] = on_cuda(model_dir, impl)
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), "--cuda" in sys.argv[3:])
