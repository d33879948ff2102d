"""What `sftdoctor train` needs of a run beyond its config's keys, decided once before anything runs: the run
directory can be made, the `[report] to` backend is installed, a hub model is in the local cache or can be
fetched. `require` asks for these and for every other fact whose probe refuses bad input (the config, the data,
the plan), in one order, for train's gate and for `check --config` alike: both refuse the same inputs with the
same words.

Measured where the command runs, as the disk is (a replay of another machine's facts judges this machine's run
directory, packages and cache: the ones a run launched from here would use).
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, InputErrors
from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.checkpoint_files import checkpoint_problem
from sftdoctor.facts.configs import hub_cache_dir, hub_unreachable
from sftdoctor.files import folder_problem

HUB_TIMEOUT_S = 5.0  # one metadata request to the hub when a model is not cached: bounded, then refused
# [report] to -> the modules transformers' integration accepts (integrations/integration_utils.py: is_wandb_available,
# is_tensorboard_available: tensorboard or tensorboardX) and what to install
REPORTERS = {
    "wandb": (("wandb",), "pip install wandb"),
    "tensorboard": (("tensorboard", "tensorboardX"), "pip install tensorboard"),
}
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's constants.ENV_VARS_TRUE_VALUES


def require(facts) -> None:
    """Every refusal of bad input that `train` makes before it launches (InputError(s)), or nothing: the run
    config, the run directory, the reporting backend, the hub models, every data row and the eval split, the
    plan. A no-op without a run config."""
    if facts.inputs.config is None or facts.get("run") is None:
        return
    facts.get("launch_inputs")
    facts.get("data")
    if facts.get("plan") is None:  # a probe of the run's inputs failed: nothing to launch
        raise InputError(
            facts.inputs.config, f"the run cannot be planned: {facts.why_missing('plan') or facts.why_missing('run')}"
        )


@fact(
    "launch_inputs",
    "what `train` needs beyond the config's keys, refused before anything runs: the run directory can be made, the "
    "[report] backend is installed, hub models are cached or reachable",
    inputs=RUN_CONFIG,
    why_missing="no run config given (--config)",
    needs=("run",),
)
def probe_launch_inputs(facts, run) -> dict[str, Any] | None:
    errors, models = problems(run, facts.inputs.config or run.path)
    if errors:
        raise InputErrors(errors)
    return {"output_dir": run.training.output_dir, "report_to": run.report.to, "hub_models": models}


def problems(run, config) -> tuple[list[InputError], dict[str, str]]:
    """(what stops `run` from launching, each as the InputError that names its key in `config`; what each hub model
    is)."""
    errors = []
    problem = folder_problem(Path(run.training.output_dir))
    if problem:
        errors.append(InputError(config, problem, key="[training].output_dir"))
    problem = reporter_problem(run.report.to)
    if problem:
        errors.append(InputError(config, problem, key="[report].to"))
    problem = weights_problem(run)
    if problem:
        errors.append(InputError(config, problem, key="[model].path"))
    models = {}
    for model_id, key, filename in hub_models(run):
        models[model_id], problem = hub_model(model_id, filename)
        if problem:
            errors.append(InputError(config, problem, key=key))
    return errors, models


def weights_problem(run) -> str | None:
    """A local folder to fine-tune from (weights = "pretrained") with no weights transformers' from_pretrained
    reads (utils/__init__.py: SAFE_WEIGHTS_NAME, WEIGHTS_NAME and their index files), or safetensors it cannot
    load (facts.checkpoint_files): every rank would stop at load, after the checks and the rehearsal's start."""
    folder = Path(run.model.path)
    if run.model.weights != "pretrained" or not folder.is_dir():
        return None
    if any(os.path.lexists(folder / name) for name in (*WEIGHTS, "adapter_config.json")):  # peft loads those
        return checkpoint_problem(folder)
    return (
        f'{folder} holds no weights ({", ".join(WEIGHTS)}) for [model] weights = "pretrained": give the folder '
        'with the checkpoint, or weights = "random" to start from config.json alone'
    )


def reporter_problem(to: str) -> str | None:
    """Why transformers could not report to `to` here (its callback raises at trainer build, on every rank)."""
    modules, install = REPORTERS.get(to, ((), ""))
    if not modules or any(_installed(m) for m in modules):
        return None
    return f"{to} is not installed ({install})"


def _installed(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def hub_models(run) -> list[tuple[str, str, str]]:
    """(hub id, its key, the file its loader reads first) of the model and the tokenizer that are not local folders
    (the config kept them as ids)."""
    found: list[tuple[str, str, str]] = []
    for value, key, filename in (
        (run.model.path, "[model].path", "config.json"),
        (run.model.tokenizer or run.model.path, "[model].tokenizer", "tokenizer_config.json"),
    ):
        if not Path(value).exists() and value not in (v for v, _, _ in found):
            found.append((value, key, filename))
    return found


def offline() -> str | None:
    """The variable that keeps huggingface_hub offline, as it reads it (HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        value = os.environ.get(name)
        if value:
            return f"{name}={value}" if value.upper() in TRUE else None
    return None


def in_hub_cache(model_id: str, filename: str = "config.json") -> bool | None:
    """Whether huggingface_hub's own lookup finds `filename` of `model_id` in the local cache (its main revision);
    None where the cache records that the hub has no such file."""
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.file_download import _CACHED_NO_EXIST
    except ImportError:  # a light install: the training stack (which brings huggingface_hub) is not here either
        from sftdoctor.facts.configs import hub_cache_config

        return hub_cache_config(model_id) is not None
    found = try_to_load_from_cache(model_id, filename, cache_dir=hub_cache_dir())
    return None if found is _CACHED_NO_EXIST else isinstance(found, str)


def hub_model(model_id: str, filename: str = "config.json") -> tuple[str, str | None]:
    """("cached" or "reachable", None), or (what it is, why the ranks could not load it): not cached and offline
    (no network call), not cached and the hub unreachable, or not on the hub."""
    try:
        cached = in_hub_cache(model_id, filename)
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's HFValidationError: not a repository id at all
        return "invalid", f"not a local folder, nor a hub id ({str(exc).splitlines()[0][:160]})"
    if cached:
        return "cached", None
    if cached is None:
        return "missing", f"{model_id} has no {filename} on the hub (the local Hugging Face cache records it as absent)"
    if said := offline():
        return "offline", f"{model_id} is not in the local Hugging Face cache and {said}"
    why = hub_unreachable(model_id, timeout_s=HUB_TIMEOUT_S)
    if why:
        return "unreachable", f"{model_id} is not in the local Hugging Face cache, and {why}"
    return "reachable", None
