"""One rank of a real FSDP2 training step on the CPU (gloo), for tests/run/test_memory_fsdp.py: the model is wrapped
by accelerate 1.16's own fsdp2_prepare_model (a stand-in for the Accelerator: the plugin, the rank, the device), and
each rank's peak is read from the c10 CPU allocator's profiler events, as tests/run/test_memory.py's peak_bytes does.

What a rank holds at its peak = what was live before the step (its weight shards and AdamW's moments, counted from
the tensors themselves, and whatever the step frees that was allocated before it) + the step's own allocations at
their peak. The profiler also sees the allocations made on gloo's worker threads while a collective runs: buffers of
a whole unit's size (world x its shard, allocated and freed inside the collective), which NCCL on a GPU does not make
(it reads and writes FSDP2's own buffers; its workspace is the plan's fixed "CUDA context and NCCL" allowance), so
they are kept apart: reported beside the peak ("with_gloo"), not in it.
"""

from __future__ import annotations

import json
import types
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

TOKEN_TILE, VOCAB_TILE = 64, 128  # TRL's tiles shrunk, as tests/run/test_memory.py's small_tiles fixture does


def allocations(prof) -> list[tuple[int, int, int, int]]:
    """(time, thread, pointer, bytes) of every CPU allocation (+) and free (-) the profiler saw, in time order."""

    def walk(nodes):
        for n in nodes:
            yield n
            yield from walk(n.children)

    out = []
    for e in walk(prof.profiler.kineto_results.experimental_event_tree()):
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            out.append((e.start_time_ns, e.start_tid, e.extra_fields.ptr, e.extra_fields.alloc_size))
    return sorted(out)


def peaks(events: list[tuple[int, int, int, int]]) -> dict[str, int]:
    """The step's peak (allocations of the thread that runs the step), what it freed of what lived before it, the
    peak of the gloo threads' scratch, and the step's peak with that scratch counted."""
    main = Counter(tid for _, tid, _, _ in events).most_common(1)[0][0]
    owner: dict[int, int] = {}  # pointer -> thread that allocated it
    live = peak = freed_before = scratch = scratch_peak = both = 0
    for _, tid, ptr, size in events:
        if size > 0:
            owner[ptr] = tid
        who = owner.pop(ptr, None) if size < 0 else tid
        if who is None:  # allocated before the step
            freed_before -= size
            live += size
        elif who == main:
            live += size
        else:
            scratch += size
            scratch_peak = max(scratch_peak, scratch)
        peak, both = max(peak, live), max(both, live + scratch)
    return {"step_peak": peak, "freed_before": freed_before, "gloo_scratch_peak": scratch_peak, "with_gloo": both}


def storage_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    seen = {}
    for t in tensors:
        t = t._local_tensor if isinstance(t, DTensor) else t
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def build(spec: dict):
    config_class = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[spec["arch"]]
    cfg = config_class(
        hidden_size=spec["h"],
        intermediate_size=spec["inter"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv"],
        num_hidden_layers=spec["layers"],
        vocab_size=spec["vocab"],
        max_position_embeddings=1024,
        head_dim=spec["h"] // spec["heads"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    if spec["checkpointing"]:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def shard(model, rank: int, reshard: bool):
    """accelerate 1.16's fsdp2_prepare_model on `model`, with what it reads of the Accelerator (fp32: no mixed
    precision; the transformer-layer auto-wrap of an FSDP config's `transformer_based_wrap`)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=reshard
    )
    accelerator = types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=plugin),
        is_main_process=rank == 0,
        mixed_precision="no",
        device=torch.device("cpu"),
    )
    return fsdp2_prepare_model(accelerator, model)


def run(rank: int, world: int, init_file: str, out: str, spec: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    import trl.kernels.chunked_logprob as chunked
    import trl.trainer.utils as trl_utils
    from trl.trainer.utils import add_fused_lm_head

    chunked.TOKEN_CHUNK_SIZE, trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = TOKEN_TILE, VOCAB_TILE
    model = build(spec)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # what SFTTrainer.__init__ does
    model = shard(model, rank, spec["reshard"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # the Trainer's adamw_torch_fused
    ids = torch.randint(0, spec["vocab"], (spec["micro"], spec["seq"]), generator=torch.Generator().manual_seed(rank))

    def loss():  # TRL 1.16's SFTTrainer.compute_loss with the fused LM head
        out_ = model(input_ids=ids, labels=ids, fused_lm_head=True)
        return -out_.log_probs.sum() / out_.label_mask.sum()

    def step():
        """The Trainer's step: every micro-batch but the last under accelerate's no_sync, which for FSDP2 is
        set_requires_gradient_sync(False) (accelerate/accelerator.py:1126-1131), then AdamW."""
        for i in range(spec["accumulation"]):
            model.set_requires_gradient_sync(i == spec["accumulation"] - 1)
            loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW's moments exist from the first step on, as in a real run
    states = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    before = {"weights": storage_bytes(model.parameters()), "optimizer": storage_bytes(states)}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    measured = {**before, **peaks(allocations(prof))}
    lived = before["weights"] + before["optimizer"] + measured["freed_before"]
    measured["peak"], measured["with_gloo"] = lived + measured["step_peak"], lived + measured["with_gloo"]
    Path(out, f"rank{rank}.json").write_text(json.dumps(measured))
    dist.destroy_process_group()
