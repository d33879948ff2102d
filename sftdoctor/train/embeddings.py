"""`[model] repair_untrained_tokens`: the embedding rows the plan names (sftdoctor.run.embeddings) set to the mean
of the trained rows, at load, in the input embedding and in an untied output head."""

from __future__ import annotations

import contextlib

from sftdoctor.run.embeddings import ZERO


def repair(model, ids: tuple[int, ...], partitioned: bool) -> None:
    import torch

    weights = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight is not weights[0]:  # untied: its rows were never trained either
        weights.append(head.weight)
    for weight in weights:
        with _whole(weight, partitioned), torch.no_grad():
            rows = list(ids)
            # other never-trained rows (reserved tokens) and broken ones (NaN/inf) stay out of the mean
            trained = (weight.abs().amax(dim=1) > ZERO) & torch.isfinite(weight).all(dim=1)
            trained[rows] = False
            weight[rows] = weight[trained].float().mean(dim=0).to(weight.dtype)


def _whole(weight, partitioned: bool):
    """ZeRO-3 partitioned the weight at load: gathered whole for the change, which rank 0's copy makes."""
    if not partitioned:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([weight], modifier_rank=0)
