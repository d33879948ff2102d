"""run/fsdp.py: an accelerate FSDP config read as `accelerate launch` reads it, and handed to transformers so that
the plugin the Trainer builds is the one the launcher would have built, for every real config of the corpus
(tests/fixtures/fsdp/index.json cites each)."""

import json
import os
import socket
from pathlib import Path

import pytest

from sftdoctor.facts.configs import read_yaml_mapping, summarize_fsdp_config
from sftdoctor.run.fsdp import flag, state_dict_type, trainer_config, wrap_policy

FSDP = Path(__file__).parents[1] / "fixtures" / "fsdp"
CONFIGS = [entry["file"] for entry in json.loads((FSDP / "index.json").read_text())]
# accelerate launch itself refuses these (the fsdp-config check names the same keys: unknown-top-key)
REFUSED_BY_THE_LAUNCHER = {
    "fms-hf-tuning_docs_training_cp_fsdp2.yaml": "had unknown keys (['parallelism_config_cp_size'"
}
FIELDS = (
    "fsdp_version",
    "sharding_strategy",
    "reshard_after_forward",
    "backward_prefetch",
    "forward_prefetch",
    "use_orig_params",
    "sync_module_states",
    "state_dict_type",
    "transformer_cls_names_to_wrap",
    "min_num_params",
    "activation_checkpointing",
    "cpu_ram_efficient_loading",
)


def summary(name: str) -> dict:
    path = FSDP / name
    return summarize_fsdp_config(path, read_yaml_mapping(path, "accelerate FSDP config"))


def plugin_fields(plugin) -> dict:
    said = {name: str(getattr(plugin, name, None)) for name in FIELDS}
    said["cpu_offload"] = type(plugin.cpu_offload).__name__
    said["auto_wrap_policy"] = getattr(plugin.auto_wrap_policy, "__name__", str(plugin.auto_wrap_policy))
    if plugin.fsdp_version == 1:  # FSDP1's reshard_after_forward only carries the strategy in (sharding_strategy)
        said.pop("reshard_after_forward")
    return said


def launched(path: Path, monkeypatch) -> dict | str:
    """The plugin `accelerate launch --config_file PATH` builds in each rank: its arguments merged with the YAML,
    exported as FSDP_* variables, read by FullyShardedDataParallelPlugin (accelerate's own code, run here)."""
    import accelerate.utils.dataclasses as plugin_module
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    monkeypatch.setattr(plugin_module, "get_torch_accelerator_backend", lambda: ("cuda", None))  # FSDP1 refuses CPU
    with socket.socket() as free:  # the launcher refuses a port in use (another test's rendezvous)
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    argv = ["--config_file", str(path), "--num_processes", "2", "--main_process_port", port, "x.py"]
    args = launch_command_parser().parse_args(argv)
    try:
        args, *_ = _validate_launch_command(args)
        env = prepare_multi_gpu_env(args)
    except Exception as exc:  # the launcher refuses the file: no plugin to compare
        return f"launcher: {type(exc).__name__}: {exc}"
    for name, value in env.items():
        if name.startswith("FSDP_"):
            monkeypatch.setenv(name, value)
    try:
        return plugin_fields(FullyShardedDataParallelPlugin())
    except Exception as exc:  # the plugin refuses a value: the Trainer must refuse it in the same words
        return f"{type(exc).__name__}: {exc}"
    finally:
        for name in [n for n in os.environ if n.startswith("FSDP_")]:
            monkeypatch.delenv(name)


def trained(fact: dict, tmp_path: Path, monkeypatch) -> dict | str:
    """The plugin transformers builds from the plan's fsdp_config (TrainingArguments, then the Trainer)."""
    import accelerate.utils.dataclasses as plugin_module
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    monkeypatch.setattr(plugin_module, "get_torch_accelerator_backend", lambda: ("cuda", None))
    for name in [n for n in os.environ if n.startswith(("FSDP_", "ACCELERATE_"))]:
        monkeypatch.delenv(name)
    config = trainer_config(fact["version"], fact["fsdp"])
    try:
        args = TrainingArguments(output_dir=str(tmp_path), fsdp=True, fsdp_config=config, use_cpu=True)
        return plugin_fields(FullyShardedDataParallelPlugin(**args.fsdp_plugin_args))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("name", CONFIGS)
def test_the_trainer_builds_the_plugin_accelerate_launch_builds_from_every_real_config(name, tmp_path, monkeypatch):
    by_launcher = launched(FSDP / name, monkeypatch)
    if isinstance(by_launcher, str) and by_launcher.startswith("launcher: "):  # no plugin: the check refuses it too
        assert name in REFUSED_BY_THE_LAUNCHER and REFUSED_BY_THE_LAUNCHER[name] in by_launcher, by_launcher
        return
    by_trainer = trained(summary(name), tmp_path, monkeypatch)
    if isinstance(by_launcher, str):  # refused by both (transformers validates the wrap policy in its own words)
        assert isinstance(by_trainer, str) and by_trainer.split(":")[0] == by_launcher.split(":")[0], by_trainer
    else:
        assert by_trainer == by_launcher


def test_absent_keys_take_the_launchers_defaults_not_transformers():
    config = trainer_config(2, {})
    assert config["cpu_ram_efficient_loading"] is True and config["auto_wrap_policy"] == "NO_WRAP"
    assert config["state_dict_type"] == "SHARDED_STATE_DICT" and config["reshard_after_forward"] is True
    assert trainer_config(1, {"sharding_strategy": "SHARD_GRAD_OP"})["reshard_after_forward"] == "SHARD_GRAD_OP"
    assert trainer_config(2, {"offload_params": True})["cpu_offload"] is True


def test_flags_states_and_policies_read_as_accelerate_reads_them():
    assert (
        flag({"x": "True"}, "x") is True and flag({"x": "off"}, "x") is False and flag({"x": "FULL_SHARD"}, "x") is None
    )
    assert flag({}, "x", True) is True
    assert (
        state_dict_type(1, {}) == "FULL_STATE_DICT"
        and state_dict_type(2, {"state_dict_type": 3}) == "SHARDED_STATE_DICT"
    )
    assert wrap_policy({"auto_wrap_policy": " transformer_based_wrap"}) == "TRANSFORMER_BASED_WRAP"
