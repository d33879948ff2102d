"""A sweep refuses, before its first trial and in --dry-run too, what every trial's gate would refuse of the sweep's
own folder and of its base: a [sweep] output_dir that cannot be made, a [report] backend that is not installed
(issue 40: `sweep --dry-run` passed a sweep whose output_dir is a file, and the sweep then died in mkdir)."""

from importlib.util import find_spec

import pytest
from cli_contract import ENV, sftdoctor
from hostile import SPECIAL, special_file

MISSING_BACKEND = next((b for b in ("wandb", "tensorboard") if find_spec(b) is None), None)
BASE = (
    '[model]\npath = "org/model"\n[data]\ntrain = "d.jsonl"\neval = "d.jsonl"\n[training]\nmax_steps = 20\n'
    'eval_steps = 5\n[report]\nto = "{to}"\n'
)


@pytest.fixture(autouse=True)
def _offline_without_plugins(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def sweep(tmp_path, output_dir: str = "sweeps/s", to: str = "none"):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "base.toml").write_text(BASE.format(to=to))
    (tmp_path / "s.toml").write_text(
        f'[sweep]\nbase = "base.toml"\noutput_dir = "{output_dir}"\n'
        "[space]\ntraining.learning_rate = {choices = [1e-4, 3e-4]}\n"
    )
    return tmp_path / "s.toml"


@pytest.mark.parametrize("kind", [k for k in SPECIAL if k != "folder"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_sweep_output_dir_that_is_not_a_folder_is_refused(tmp_path, kind, dry_run):
    path = sweep(tmp_path, "out")
    special_file(tmp_path / "out", kind)
    result = sftdoctor(["sweep", path, *(["--dry-run"] if dry_run else [])], tmp_path, [path])
    assert (result.exit_code, result.stderr) == (
        2,
        f"sftdoctor: error: {path}: [sweep].output_dir: {tmp_path / 'out'} exists and is not a folder\n",
    )


def test_a_sweep_output_dir_under_a_file_is_refused(tmp_path):
    path = sweep(tmp_path, "notes.txt/sweep")
    (tmp_path / "notes.txt").write_text("x")
    result = sftdoctor(["sweep", path, "--dry-run"], tmp_path, [path])
    assert result.exit_code == 2 and "is not a folder, so" in result.stderr


@pytest.mark.skipif(MISSING_BACKEND is None, reason="wandb and tensorboard are both installed here")
def test_a_base_whose_report_backend_is_not_installed_is_refused_in_its_own_name(tmp_path):
    path = sweep(tmp_path, to=MISSING_BACKEND)
    result = sftdoctor(["sweep", path, "--dry-run"], tmp_path, [tmp_path / "base.toml"])
    said = f"{MISSING_BACKEND} is not installed (pip install {MISSING_BACKEND})"
    assert (result.exit_code, result.stderr) == (
        2,
        f"sftdoctor: error: {tmp_path / 'base.toml'}: [report].to: {said}\n",
    )
