"""Which trainable parameters a training step of this run leaves without a gradient, proven on the installed
stack rather than guessed from the architecture's name.

Under DDP, torch's reducer waits for a gradient of every trainable parameter; one that a step never reaches
(a multimodal model's vision tower on text-only rows, MoE experts no token was routed to, multi-token
prediction layers the loss does not use, an adapter or a `modules_to_save` copy of a module the forward skips)
leaves the reduction unfinished, and the next step fails with "Expected to have finished reduction in the prior
iteration" unless find_unused_parameters is on. The probe builds the run's architecture as the recipe does
(`AutoModelForCausalLM.from_config`, config.json shrunk to two small layers as the rehearsal shrinks it, every
sub-config too, random weights, float32 on the CPU), wraps it with the run's [lora] as peft does, runs one
forward and backward on a text-only batch with labels, as SFTTrainer's loss does, and lists the trainable
parameters whose `.grad` is still None: exactly those DDP's reducer would wait for. In a child process (the
caller imports no torch), cached.

Only asked where the run is a DDP one (several processes, no DeepSpeed: DeepSpeed's engine reduces gradients
itself). Routing on random weights is not the trained router's: for MoE models the plan turns
find_unused_parameters on whatever the probe saw.

    python -m sftdoctor.facts.unused_params '{"config": "DIR/config.json", "trust": false, "lora": null}'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import MODEL, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.facts.lora_modules import build_request
from sftdoctor.facts.probe_cache import cached, folder_files
from sftdoctor.run.unused_params import grouped, kinds

TIMEOUT_S = 300
ROWS, TOKENS = 2, 16
MAX_LISTED = 64  # name patterns kept: a stack of layers is one pattern, so real models need a handful


@fact(
    "unused_parameters",
    "the trainable parameters one text-only training step on the shrunk model leaves without a gradient (what DDP's "
    "reducer would wait for)",
    inputs=MODEL,
    why_missing="not a DDP run (one process, or DeepSpeed), or no model config.json to build the model from",
    needs=("run", "model_config"),
)
def probe_unused_parameters(facts, run, model) -> dict[str, Any] | None:
    if not isinstance(model.get("config"), dict) or not ddp_run(run, facts):
        return None
    request, folder = build_request(run, model)
    return cached("unused-parameters", {**request, "config": None}, folder_files(folder), lambda: _child(request))


def ddp_run(run, facts) -> bool:
    """Whether the run trains under torch's DDP: several processes and no DeepSpeed (resolve's own decisions)."""
    from sftdoctor.run.resolve import world

    nproc, nnodes = world(run, facts.get("gpus"), facts.get("slurm"))
    return nproc * nnodes > 1 and run.deepspeed.config is None and run.deepspeed.zero_stage is None and run.fsdp is None


def _child(request: dict[str, Any]) -> dict[str, Any]:
    return in_child("sftdoctor.facts.unused_params", request, "one training step on the shrunk model", TIMEOUT_S)


def shrink_all(config, vocab_size: int | None = 512) -> None:
    """The rehearsal's shrink (two small layers), applied to the config and to each of its sub-configs (a
    multimodal model's text, vision and audio parts): a composite config (Gemma 3's) has no top-level widths, so
    shrinking the top level alone would build the full model. `vocab_size=None` keeps the vocabularies."""
    from sftdoctor.facts.packing_probe import shrink

    shrink(config, vocab_size=vocab_size if hasattr(config, "vocab_size") else None)
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            shrink(sub, vocab_size=vocab_size if hasattr(sub, "vocab_size") else None)


def measure(request: dict[str, Any]) -> dict[str, Any]:
    import warnings

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(request["config"])
    config = AutoConfig.from_pretrained(str(path.parent), trust_remote_code=request.get("trust", False))
    shrink_all(config)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecations and init notices: not the user's
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="eager", trust_remote_code=request.get("trust", False)
        )
        built = type(model).__name__
        if request.get("lora"):
            model = _with_adapters(model, request["lora"])
    model.train()
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(3, max(4, vocab - 1), (ROWS, TOKENS))
    model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, use_cache=False).loss.backward()
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    unused = [name for name, p in trainable if p.grad is None]
    return {
        "model_class": built,
        "trainable_tensors": len(trainable),
        "unused_tensors": len(unused),
        "unused": grouped(unused)[:MAX_LISTED],
        "kinds": kinds(unused),
        "roots": roots(model, set(unused)),
        "lora": bool(request.get("lora")),
    }


def _with_adapters(model, lora: dict[str, Any]):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model,
        LoraConfig(
            r=lora["r"],
            target_modules=lora["target_modules"],
            modules_to_save=lora["modules_to_save"] or None,
            use_dora=lora["use_dora"],
            task_type="CAUSAL_LM",
        ),
    )


def roots(model, unused: set[str]) -> list[str]:
    """The outermost modules all of whose trainable parameters went without a gradient (`model.vision_tower`),
    so a finding can name what to freeze."""
    whole = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(r + ".") for r in whole):
            continue
        mine = [f"{name}.{n}" for n, p in module.named_parameters() if p.requires_grad]
        if mine and all(n in unused for n in mine):
            whole.append(name)
    return whole[:MAX_LISTED]


if __name__ == "__main__":
    serve(measure)
