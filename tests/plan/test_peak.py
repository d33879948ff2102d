"""The predicted peak of a whole training step against the measured one, on CPU.

Measured with torch.profiler's memory events (every allocation and free of the c10 CPU allocator) over
a steady-state step (forward, backward, AdamW step) of tiny fp32 models built from configs. The
prediction is the sum of model states (stage 0: 16 B per parameter), activations and the logits term;
the GPU-only allowances (fragmentation, CUDA context) are left out here.
"""

from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from sftdoctor.plan.memory import Run, Setting, activations, logits, model_states
from test_activations import tiny


def peak_bytes(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("arch, h, inter, heads, kv, layers, vocab, checkpointing", [
    ("qwen2", 128, 352, 8, 2, 4, 512, False), ("llama", 256, 704, 8, 8, 4, 512, True),
    ("qwen2", 256, 704, 8, 2, 8, 4096, False)])
def test_predicted_peak_is_never_below_the_measured_one_and_at_most_15_percent_above(
        arch, h, inter, heads, kv, layers, vocab, checkpointing):
    model, shape = tiny(arch, h, inter, heads, kv, layers, torch.float32, checkpointing)
    if vocab != 512:
        model.resize_token_embeddings(vocab, mean_resizing=False)
    sizes = [p.numel() for p in model.parameters()]
    shape = replace(shape, layers=layers, vocab=vocab, parameters=sum(sizes), largest_layer=max(sizes))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 512, (2, 256))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW's states exist from the first step on, as in a real run
    measured = peak_bytes(step) + 12 * sum(sizes)  # the weights and AdamW's moments were alive before it
    run, setting = Run(shape, 1, 1, 256, "sdpa", "fp32"), Setting(0, False, checkpointing, 2, False)
    predicted = sum(t.bytes for t in model_states(shape, setting, 1) + activations(run, setting) + logits(run, setting))
    assert 1.0 <= predicted / measured <= 1.15, (predicted, measured)
