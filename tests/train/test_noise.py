"""The stack's harmless messages: silenced in the worker, without hiding a real one."""

import logging

from sftdoctor.train.noise import quiet_worker, tied_names, worker_env


def tiny_qwen2(tied: bool):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    return AutoModelForCausalLM.from_config(config)


class Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_missing_tied_lm_head_on_resume_is_silenced_and_a_real_missing_key_is_not():
    model = tiny_qwen2(tied=True)
    assert tied_names(model) == {"lm_head.weight"} and tied_names(tiny_qwen2(tied=False)) == set()
    quiet_worker(model)
    log, kept = logging.getLogger("transformers.trainer"), Kept()  # transformers' loggers do not propagate
    log.addHandler(kept)
    try:
        log.warning("There were missing keys in the checkpoint model loaded: ['lm_head.weight'].")
        log.warning("There were missing keys in the checkpoint model loaded: ['lm_head.weight', 'model.norm.weight'].")
    finally:
        log.removeHandler(kept)
    assert kept.messages == [
        "There were missing keys in the checkpoint model loaded: ['lm_head.weight', 'model.norm.weight']."
    ]


def test_cpu_runs_name_their_accelerator_and_several_processes_their_threads():
    assert worker_env(cuda=False, world_size=1) == {"DS_ACCELERATOR": "cpu"}
    assert worker_env(cuda=True, world_size=8) == {"OMP_NUM_THREADS": "1"}
