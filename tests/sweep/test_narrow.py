"""The space narrowed by the memory plan before anything is sampled."""

from sweeprun import base, sweep_file, tiny_gpu_facts

from sftdoctor.sweep.config import load_sweep
from sftdoctor.sweep.narrow import narrow

BATCH = {"training.per_device_batch_size": {"choices": [4, 2048]}, "training.learning_rate": {"choices": [1e-3, 3e-3]}}


def test_a_choice_that_fits_the_gpus_with_no_setting_of_the_others_is_dropped(tmp_path, tiny_data):
    sweep = load_sweep(sweep_file(tmp_path, base(tmp_path, tiny_data["messages"]), BATCH))
    narrowed = narrow(sweep, tiny_gpu_facts(tmp_path))
    assert narrowed.fits
    assert [d.choices for d in narrowed.space] == [(4,), (1e-3, 3e-3)]
    assert narrowed.note.startswith(
        "narrowed for 1x NVIDIA Tiny (compute capability 8.0), 1.5 GiB: dropped "
        "training.per_device_batch_size = 2048 (at least 1.9 GiB per GPU)"
    )
    assert list(narrowed.dropped) == ["training.per_device_batch_size"]


def test_nothing_that_fits_is_said_and_a_machine_without_gpus_narrows_nothing(tmp_path, tiny_data):
    path = base(tmp_path, tiny_data["messages"])
    sweep = load_sweep(sweep_file(tmp_path, path, {"training.per_device_batch_size": {"choices": [2048, 4096]}}))
    nothing = narrow(sweep, tiny_gpu_facts(tmp_path))
    assert not nothing.fits and nothing.note.startswith("nothing in the space fits 1x NVIDIA Tiny")
    here = narrow(load_sweep(sweep_file(tmp_path, path, BATCH)))  # this CPU machine
    assert here.fits and here.space == load_sweep(sweep_file(tmp_path, path, BATCH)).space
    assert here.note == "not narrowed: no GPU of known memory here (--facts FILE judges another machine's)"


def test_narrowing_can_be_turned_off_and_skips_a_space_that_changes_the_model(tmp_path, tiny_data):
    path = base(tmp_path, tiny_data["messages"])
    off = load_sweep(sweep_file(tmp_path, path, BATCH, narrow=False))
    assert narrow(off, tiny_gpu_facts(tmp_path)).note == "not narrowed: narrow = false"
    models = load_sweep(sweep_file(tmp_path, path, {**BATCH, "model.weights": {"choices": ["random"]}}))
    assert narrow(models, tiny_gpu_facts(tmp_path)).note == "not narrowed: the space changes the model (model.weights)"
