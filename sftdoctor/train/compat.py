"""Every private or undocumented API of another library that sftdoctor's trainer touches, one small function
each. Each docstring says which versions it was verified against and what it does when the API is gone.
tests/train/test_compat.py pins each one against the installed stack, so an upgrade that renames or changes
one fails there, not in the middle of a run.

Verified stack: torch 2.13.0, transformers 5.24.0-5.25.0, TRL 1.16.0, accelerate 1.15.0-1.16.0, DeepSpeed 0.19.8,
liger-kernel 0.8.5.

The launcher imports this module, so it imports nothing heavy at module level: each function imports
what it wraps.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sftdoctor.facts.distributions import version
from sftdoctor.facts.packages import module_file


def _missing(package: str, api: str, verified: str, needed_for: str) -> RuntimeError:
    return RuntimeError(
        f"{package} {version(package) or '(version unknown)'} has no {api} "
        f"(verified with {package} {verified}); sftdoctor needs it for {needed_for}"
    )


# ---------------------------------------------------------------- accelerate


def fsdp_without_a_gpu(trainer) -> bool:
    """Turn on the FSDP plugin transformers built, where accelerate dropped it because there is no GPU; True when
    it did. accelerate 1.10-1.16 (`AcceleratorState.__init__`, state.py) sets `distributed_type = FSDP` and keeps
    the plugin only in its branch for accelerators (MULTI_GPU, MULTI_XPU, ...); on CPU ranks (MULTI_CPU) the
    plugin is dropped without a word and the run trains as plain DDP. `fully_shard` itself shards over gloo on
    CPU (torch 2.4+), so this sets what that branch sets: the state's type and plugin, the mixed precision, and
    the type PartialState keeps in its private shared dict (read by `Accelerator.is_fsdp2` for saving; without
    it the sharded weights reach save_pretrained as DTensors). On a GPU accelerate does this itself and this
    does nothing. Called right after `Trainer.create_accelerator_and_postprocess`, before anything is prepared."""
    if trainer.args.fsdp_plugin_args is None or getattr(trainer.accelerator.state, "fsdp_plugin", None) is not None:
        return False
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if state.distributed_type == DistributedType.NO:  # the fsdp-world check refuses this before any launch
        raise RuntimeError("FSDP in a process of its own: there is no other rank to shard over (fsdp-world)")
    if state.distributed_type != DistributedType.MULTI_CPU:
        raise _missing(
            "accelerate", "an FSDP plugin after Accelerator()", "1.16.0", f"FSDP on {state.distributed_type}"
        )
    if not isinstance(getattr(PartialState, "_shared_state", None), dict):
        raise _missing("accelerate", "PartialState._shared_state", "1.16.0", "FSDP on CPU ranks")
    plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True
    return True


# ---------------------------------------------------------------- transformers


def wrap_grad_norm(trainer, on_norm: Callable[[Any], None]) -> None:
    """Install a wrapper of `Trainer._get_grad_norm(model, grad_norm=None)` on this trainer instance: it calls
    `on_norm(value)` with whatever the original returns, then returns that value unchanged.

    Verified with transformers 5.24.0: the training loop calls `self._get_grad_norm(model, grad_norm=...)`
    once per optimizer step (not per micro-batch), after clipping and before `on_pre_optimizer_step`, and
    logs what it returns as `grad_norm`. The value is the pre-clipping norm: a 0-dim tensor, not yet read
    to the host (its docstring says "Python float", which holds only under DeepSpeed: accelerate 1.15.0 then
    returns the engine's `get_global_grad_norm()` as a float, or None before the engine has one).
    Fallback: none. Without the method the watcher cannot see the norm, so this raises RuntimeError."""
    original = getattr(trainer, "_get_grad_norm", None)
    if not callable(original):
        raise _missing("transformers", "Trainer._get_grad_norm", "5.24.0", "the gradient-norm watch")

    @functools.wraps(original)
    def capture(*args, **kwargs):  # forwards whatever the trainer passes: only the result matters here
        value = original(*args, **kwargs)
        on_norm(value)
        return value

    trainer._get_grad_norm = capture


def zero3_enabled() -> bool:
    """transformers' `is_deepspeed_zero3_enabled()`: True while a DeepSpeed config with ZeRO stage 3 is alive
    in this process (a module-level weakref set by `HfDeepSpeedConfig`, which `TrainingArguments(deepspeed=...)`
    creates and keeps).

    Verified with transformers 5.24.0 (`transformers.integrations.deepspeed`, also exported from
    `transformers.integrations`). Fallback: False when neither import path exists."""
    try:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    except ImportError:
        try:
            from transformers.integrations import is_deepspeed_zero3_enabled
        except ImportError:
            return False
    return bool(is_deepspeed_zero3_enabled())


@contextlib.contextmanager
def capture_pack_input(kept: list):
    """While building an SFTTrainer, append to `kept` each dataset TRL hands `pack_dataset` (tokenized, only
    input_ids and labels, in the order of the rows given to the trainer): sftdoctor.train.rows traces a packed
    batch's sequences back to their rows through it.

    Verified with TRL 1.16.0: `SFTTrainer._prepare_dataset` calls the module global
    `trl.trainer.sft_trainer.pack_dataset(dataset, args.max_length, args.packing_strategy, map_kwargs)` after
    `select_columns(["input_ids", "labels"])` (and a seeded shuffle only with `shuffle_dataset=True`, which
    sftdoctor leaves off), train first, then eval. Fallback: none; without the global this raises RuntimeError."""
    import trl.trainer.sft_trainer as sft_trainer

    original = getattr(sft_trainer, "pack_dataset", None)
    if not callable(original):
        raise _missing("trl", "trl.trainer.sft_trainer.pack_dataset", "1.16.0", "tracing a packed batch to its rows")

    @functools.wraps(original)
    def keep(dataset, *args, **kwargs):
        kept.append(dataset)
        return original(dataset, *args, **kwargs)

    sft_trainer.pack_dataset = keep
    try:
        yield kept
    finally:
        sft_trainer.pack_dataset = original


# ---------------------------------------------------------------- liger-kernel


def apply_liger_kernels(model) -> None:
    """liger-kernel's `_apply_liger_kernel_to_instance(model=..., fused_linear_cross_entropy=False,
    cross_entropy=False)`: rope, RMSNorm and SwiGLU kernels on this model; the loss stays with TRL.

    Verified with liger-kernel 0.8.5 (and transformers 5.24.0's Qwen2). Things to know:
    - it passes on only the keywords that the model type's `apply_liger_kernel_to_<type>` accepts and drops
      the rest silently, so `fused_linear_cross_entropy=False` holds only while that parameter keeps its name
      (its default is True, which would replace `model.forward`);
    - a model type it has no kernels for is a no-op (logged at INFO);
    - besides patching the instance it replaces module globals of `transformers.models.<type>.modeling_<type>`
      (`apply_rotary_pos_emb`, the RMSNorm and MLP classes): every model of that type built later in this
      process gets the kernels too;
    - the kernels are Triton: applying them works on a CPU-only machine, but the first forward raises
      RuntimeError ("0 active drivers").
    Fallback: none. If the function is gone, this raises RuntimeError."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError as error:
        raise _missing(
            "liger-kernel",
            "liger_kernel.transformers._apply_liger_kernel_to_instance",
            "0.8.5",
            "[training] liger_kernel",
        ) from error
    _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=False, cross_entropy=False)


# ---------------------------------------------------------------- torch.distributed


def default_store():
    """torch's `torch.distributed.distributed_c10d._get_default_store()`: the store (TCPStore, wrapped in a
    PrefixStore) of the default process group, which the watchers use to exchange hang reports.

    Verified with torch 2.13.0 (it raises ValueError when no group is initialised).
    Fallback: None when torch.distributed is unavailable, no process group is initialised, or the API is gone."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        return dist.distributed_c10d._get_default_store()
    except Exception:  # a hang report must not fail for want of a store
        return None


def rendezvous_key(run_id: str) -> str:
    """The key torchrun's c10d rendezvous keeps its state under in the rendezvous store (node 0's TCPStore at
    the endpoint): `torch.distributed.elastic.rendezvous.c10d_rendezvous_backend.C10dRendezvousBackend._key`.
    A node coming back finds by it that the run it left is still on (sftdoctor.distributed.gate.in_progress).

    Verified with torch 2.13.0: "torch.rendezvous." + run_id, unprefixed."""
    return "torch.rendezvous." + run_id


def dump_flight_recorder(backend: str) -> bytes | None:
    """The flight recorder's trace now, as the pickled bytes that torchfrtrace reads: for an NCCL group
    `torch._C._distributed_c10d._dump_nccl_trace()`, for any other (Gloo) `_dump_fr_trace()`.

    Verified with torch 2.13.0. The two are different recorders, not a rename: `_dump_nccl_trace` dumps
    ProcessGroupNCCL's own recorder and exists only in builds with NCCL; `_dump_fr_trace` dumps the generic
    recorder (Gloo's collectives) and exists in every build. On torch 2.13's CPU wheel only `_dump_fr_trace`
    exists; it records by default (2000 entries, TORCH_FR_BUFFER_SIZE) and returns a pickle even outside a group.
    Fallback: None when the function is missing or the dump fails."""
    try:
        import torch

        c10d = torch._C._distributed_c10d
        dump = getattr(c10d, "_dump_nccl_trace" if backend == "nccl" else "_dump_fr_trace", None)
        data = dump() if dump is not None else None
    except Exception:  # a diagnostic taken while a run is hung must never raise
        return None
    return bytes(data) if isinstance(data, (bytes, bytearray)) else None


def process_groups() -> dict[str, list[int]]:
    """Every process group of this process: its name (what the flight recorder's entries call it: "0" for the
    default group) -> its global ranks. `torch.distributed.distributed_c10d._world.pg_names` (private) with the
    public `get_process_group_ranks`.

    Verified with torch 2.13.0 (a dict ProcessGroup -> name, the default group "0", then "1", "2", ...).
    Fallback: {} when the registry is gone; the reader then infers each group's ranks from the dumps."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        return {str(name): list(dist.get_process_group_ranks(pg)) for pg, name in c10d._world.pg_names.items()}
    except Exception:  # a diagnostic taken while a run is hung must never raise
        return {}


FR_HEADER = ("include", "torch", "csrc", "distributed", "c10d", "FlightRecorder.hpp")


def flight_recorder_env(run_dir: Path) -> dict[str, str]:
    """PyTorch's NCCL flight recorder on, dumping into the run directory on a timeout, under the names the
    installed torch reads. Runs in the launcher: reads torch's installed c10d FlightRecorder.hpp, never
    imports torch.

    Verified with torch 2.13.0: its FlightRecorder.hpp reads `{"TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE"}` (the old name as a deprecated fallback); libtorch reads
    TORCH_FR_DUMP_TEMP_FILE (old: TORCH_NCCL_DEBUG_INFO_TEMP_FILE, named in no header);
    TORCH_NCCL_DUMP_ON_TIMEOUT kept its name (ProcessGroupNCCL.hpp). The dump file is the prefix plus the
    rank, torch's own naming, which torchfrtrace reads.
    Fallback: the old names (TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE) when the header
    is missing (torch before the recorder moved there) or does not name TORCH_FR_BUFFER_SIZE."""
    header = module_file("torch", *FR_HEADER)
    new = header is not None and "TORCH_FR_BUFFER_SIZE" in header.read_text(errors="replace")
    dump = str(Path(run_dir) / "nccl-trace-rank-")
    if new:
        return {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": dump}
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump,
    }


# ---------------------------------------------------------------- accelerate / DeepSpeed (fp16)


def optimizer_step_was_skipped(trainer) -> bool:
    """accelerate's `Accelerator.optimizer_step_was_skipped`: whether the last optimizer step was skipped for a
    gradient overflow (fp16: torch AMP's GradScaler, or DeepSpeed's `optimizer.overflow`).

    Verified with accelerate 1.15.0 (a property over each prepared optimizer's `step_was_skipped`;
    transformers 5.24.0 reads it to decide whether to step the LR scheduler).
    Fallback: False when the trainer has no accelerator or the property is gone."""
    accelerator = getattr(trainer, "accelerator", None)
    return bool(getattr(accelerator, "optimizer_step_was_skipped", False))


def loss_scale(trainer) -> float | None:
    """The current fp16 loss scale: `trainer.accelerator.scaler.get_scale()` under torch AMP, else the DeepSpeed
    engine's (`trainer.deepspeed`) optimizer's `loss_scale`, then `cur_scale`.

    Verified with accelerate 1.15.0 (`scaler` is a torch.amp.GradScaler for fp16 without DeepSpeed, None
    otherwise; torch 2.13.0), transformers 5.24.0 (`Trainer.deepspeed` is the engine) and DeepSpeed 0.19.8:
    the ZeRO-1/2 and ZeRO-3 optimizers expose both `loss_scale` and `cur_scale` as properties, ZeRO-0's
    FP16_Optimizer only `loss_scale` (None when it does no scaling), BF16_Optimizer neither.
    Fallback: None (no scaler and no scaled DeepSpeed optimizer: bf16, fp32, or an API gone)."""
    scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
    if scaler is not None:
        return float(scaler.get_scale())
    optimizer = getattr(getattr(trainer, "deepspeed", None), "optimizer", None)
    for name in ("loss_scale", "cur_scale"):
        scale = getattr(optimizer, name, None)
        if scale is not None and not callable(scale):  # a property's value, not a method
            return float(scale)
    return None
