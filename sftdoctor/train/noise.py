"""The stack's harmless messages, silenced where they start, or else kept out of the terminal (never out of
train.log). Each entry says why it is harmless and which versions print it.

Light on purpose: the launcher imports it without the training stack.
"""

from __future__ import annotations

import logging
import re
import warnings


def worker_env(cuda: bool, world_size: int) -> dict[str, str]:
    """Set for the workers unless the user set them."""
    env = {}
    if not cuda:
        # DeepSpeed 0.19 warns "Setting accelerator to CPU. If you have GPU ..." in every process that imports
        # it (transformers does) when it finds no GPU; naming the accelerator is the documented override.
        env["DS_ACCELERATOR"] = "cpu"
    if world_size > 1:
        # torchrun sets 1 itself and prints a 3-line banner saying so in every launch.
        env["OMP_NUM_THREADS"] = "1"
    return env


# Lines the terminal does not show (train.log keeps them): (pattern, lines after it that belong to it).
QUIET_LINES = (
    # DeepSpeed 0.19 on CPU, each process: `print`ed from deepspeed/comm/torch.py once its shm op has compiled.
    (re.compile(r"^DeepSpeed deepspeed\.ops\.comm\.\w+ built successfully$"), 0),
    # DeepSpeed 0.19's ZeRO calls torch.distributed.all_gather_into_tensor, deprecated in torch 2.13: a
    # FutureWarning per rank, then the source line it points at. Also filtered in the worker (`quiet_worker`).
    (re.compile(r"FutureWarning: `torch\.distributed\.all_gather_into_tensor` is deprecated"), 1),
    # torch 2.13's TCPStore server (c10d socket.cpp) when the reverse lookup of a client on another host fails
    # (a cluster's /etc/hosts or DNS without reverse entries): it only names the peer in its own logging.
    (re.compile(r"\[c10d\] The hostname of the client socket cannot be retrieved\. err="), 0),
)


class _Drop(logging.Filter):
    def __init__(self, drop):
        super().__init__()
        self.drop = drop

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.drop(record.getMessage())


MISSING_KEYS = re.compile(r"There were missing keys in the checkpoint model loaded: \[(.*)\]\.")


def tied_names(model) -> set[str]:
    """Parameter names that are another parameter under a second name (lm_head.weight of a model with tied
    embeddings): named_parameters() lists them only once."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return every - {name for name, _ in model.named_parameters()}


def quiet_worker(model) -> None:
    """In each worker, once the model exists."""
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated", category=FutureWarning
    )
    # transformers 5.24 renamed it is_activation_checkpointing; peft 0.21 still reads the old name, twice a run.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    tied = tied_names(model)

    def only_tied(message: str) -> bool:
        # transformers 5.24 Trainer._issue_warnings_after_load, on every resume of a tied-embedding model: a
        # checkpoint stores a tied tensor once, and loading it fills both names.
        match = MISSING_KEYS.search(message)
        return bool(match) and {k.strip(" '\"") for k in match.group(1).split(",")} <= tied

    logging.getLogger("transformers.trainer").addFilter(_Drop(only_tied))
    # transformers 5.24 sort_checkpoints: checkpoints saved under a second apart (tiny runs) make it distrust
    # mtimes; it then orders them by step number, which is what sftdoctor's checkpoints mean anyway.
    logging.getLogger("transformers.trainer_utils").addFilter(
        _Drop(lambda m: m.startswith("mtime may not be reliable"))
    )
