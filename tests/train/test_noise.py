"""The stack's harmless messages: silenced in the worker, without hiding a real one."""

import logging

from trainrun import tiny_qwen2

from sftdoctor.train.noise import quiet_worker, tied_names, worker_env


class Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_missing_tied_lm_head_on_resume_is_silenced_and_a_real_missing_key_is_not():
    model = tiny_qwen2(tie_word_embeddings=True)
    assert tied_names(model) == {"lm_head.weight"} and tied_names(tiny_qwen2(tie_word_embeddings=False)) == set()
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
