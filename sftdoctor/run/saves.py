"""What a run writes to its output_dir, in bytes: one checkpoint, how many exist at once, the final model.

Read from transformers 5.25 (trainer.py `_save_checkpoint`, `_save_optimizer_and_scheduler`, `rotate_checkpoints`)
and DeepSpeed 0.19.8 (engine.py `save_checkpoint`), for the settings sftdoctor runs with:
- without DeepSpeed: `model.safetensors` in the load dtype (fp32 for a full fine-tune: AMP over fp32 weights) and
  `optimizer.pt`, AdamW's two moments in the parameters' dtype: 4 + 8 = 12 bytes per parameter.
- ZeRO-1/2: `model.safetensors` in 16 bits (2), DeepSpeed's `mp_rank_00_model_states.pt` with the 16-bit module (2)
  and the `*zero_pp_rank_*_optim_states.pt` shards: fp32 master copy and two moments (12), 16 in all.
- ZeRO-3: the module states hold partitioned (empty) parameters; `model.safetensors` is gathered in 16 bits
  (stage3_gather_16bit_weights_on_model_save, set by sftdoctor): 2 + 12 = 14.
- LoRA: the same over the trainable parameters only (peft saves the adapters; DeepSpeed gets
  exclude_frozen_parameters=True).
The Trainer writes a checkpoint before it rotates the oldest away, so save_total_limit + 1 exist at the peak
(sftdoctor sets no load_best_model_at_end, which would keep one more). The final save (final/) holds the weights
only; [lora] merge adds a 16-bit merged model. Measured on the tiny example (123,456 parameters, fp32, no
DeepSpeed): model.safetensors + optimizer.pt = 1,505,985 bytes against 1,481,472 predicted (+1.7%: headers and
pickle framing), the whole checkpoint 1,550,231 bytes with the tokenizer, RNG state and trainer state.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
OTHER_FILES = 64 * 2**20  # tokenizer (up to ~35 MB for 256k vocabularies), RNG states, trainer state, args
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The rehearsal's shrunk model (facts.packing_probe.shrink): the real vocabulary, hidden 64, two layers.
SHRUNK_HIDDEN, SHRUNK_LAYER = 64, 4 * 64 * 64 + 3 * 64 * 128


@dataclass(frozen=True)
class SaveBudget:
    checkpoint: int  # bytes of one checkpoint-N folder
    per_param: int  # bytes per saved parameter in it
    saved_params: int  # the parameters it holds (all, or LoRA's trainable ones)
    kept: int  # checkpoints on disk at the peak: save_total_limit + 1
    final: int  # final/ (and final-merged/)
    rehearsal: int  # the rehearsal's run directory (output_dir/rehearsal)

    @property
    def total(self) -> int:
        return self.checkpoint * self.kept + self.final + self.rehearsal


def bytes_per_param(zero_stage: int, load_dtype: str, deepspeed: bool) -> tuple[int, int]:
    """(bytes per parameter in a checkpoint, of which the weights alone): see the module docstring."""
    if not deepspeed:
        weights = DTYPE_BYTES.get(load_dtype, 4)
        return weights + 2 * weights, weights
    if zero_stage == 3:
        return 2 + 12, 2
    return 2 + 2 + 12, 2


def budget(
    parameters: int,
    zero_stage: int,
    load_dtype: str,
    deepspeed: bool,
    save_total_limit: int,
    lora: dict | None = None,
    vocab: int = 0,
    tied: bool = True,
) -> SaveBudget:
    per, weights = bytes_per_param(zero_stage, load_dtype, deepspeed)
    saved = parameters
    final = weights * parameters
    if lora is not None:
        saved = int(lora.get("trainable_params") or 0)
        per, final = (per, 4 * saved) if not deepspeed else (per, 2 * saved)
        if lora.get("merge"):
            final += DTYPE_BYTES.get(lora.get("compute_dtype") or "bfloat16", 2) * parameters
    checkpoint = per * saved + OTHER_FILES
    shrunk = vocab * SHRUNK_HIDDEN * (1 if tied else 2) + 2 * SHRUNK_LAYER
    rehearsal = 3 * (per * shrunk + OTHER_FILES)  # two checkpoints (steps 2 and 4) and its final model
    return SaveBudget(checkpoint, per, saved, save_total_limit + 1, final + OTHER_FILES, rehearsal)
