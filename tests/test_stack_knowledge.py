"""What the checks assume about the installed stack, pinned against the stack itself (it runs on CPU).
When an upgrade changes one of these, the failing test names the rule to revisit."""

import importlib.metadata
import re

import pytest

from sftdoctor.checks.nccl_env import DEPRECATED
from sftdoctor.facts import Facts
from sftdoctor.facts.packages import module_file


def test_torch_build_is_read_without_importing_torch_and_matches_it():
    import torch

    build = Facts().get("torch_build")
    assert build["version"] == torch.__version__
    assert build["cuda"] == torch.version.cuda and build["hip"] == torch.version.hip


def test_package_versions_come_from_metadata():
    packages = Facts().get("packages")
    assert packages["transformers"] == importlib.metadata.version("transformers")
    assert packages["flash-attn"] is None  # cannot be built without CUDA


def test_deprecated_nccl_names_are_the_fallbacks_the_installed_torch_reads():
    header = module_file("torch", "include", "torch", "csrc", "distributed", "c10d", "ProcessGroupNCCL.hpp")
    if header is None:
        pytest.skip("this torch build ships no c10d headers")
    text = header.read_text()
    aliases = dict(
        re.findall(r'static std::vector<std::string> (TORCH_NCCL_\w+) = \{\s*"TORCH_NCCL_\w+",\s*"(NCCL_\w+)"\}', text)
    )
    assert {old: new for new, old in aliases.items()} == DEPRECATED


def test_deepspeed_refuses_fp16_with_bf16_in_the_words_the_check_quotes():
    from deepspeed.runtime.config import DeepSpeedConfig

    with pytest.raises(AssertionError, match="bfloat16 and fp16 modes cannot be simultaneously enabled"):
        DeepSpeedConfig({"train_batch_size": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}})


def test_deepspeed_still_reads_the_legacy_bfloat16_key():
    from deepspeed.runtime.config import DeepSpeedConfig

    assert DeepSpeedConfig({"train_batch_size": 1, "bfloat16": {"enabled": True}}).bfloat16_config.enabled


def test_the_gradient_clipping_default_is_read_from_the_installed_deepspeed():
    from deepspeed.runtime.config import DeepSpeedConfig

    assert (
        Facts().get("deepspeed_defaults")["gradient_clipping"]
        == DeepSpeedConfig({"train_batch_size": 1}).gradient_clipping
    )


def test_transformers_leaves_an_absent_gradient_clipping_to_deepspeed():
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = TrainingArguments(output_dir="/tmp/x", max_grad_norm=0.5, report_to=[])
    absent = HfTrainerDeepSpeedConfig({"train_batch_size": "auto"})
    absent.trainer_config_process(args)
    assert "gradient_clipping" not in absent.config
    auto = HfTrainerDeepSpeedConfig(
        {"gradient_clipping": "auto", "bfloat16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
    )
    auto.trainer_config_process(args)
    assert auto.config["gradient_clipping"] == 0.5
    assert auto.config["bfloat16"]["enabled"] == "auto"  # the legacy key is not filled
    assert auto.config["bf16"]["enabled"] is False


def test_transformers_5_writes_dtype_and_still_reads_torch_dtype(tmp_path):
    import json

    from transformers import Qwen2Config

    Qwen2Config(dtype="bfloat16").save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    if int(importlib.metadata.version("transformers").split(".")[0]) >= 5:
        assert saved["dtype"] == "bfloat16" and "torch_dtype" not in saved
    legacy = Qwen2Config.from_dict({"torch_dtype": "float16"})
    assert str(legacy.dtype).endswith("float16")


def test_a_leftover_auto_under_the_legacy_bfloat16_key_leaves_bf16_off():
    from deepspeed.runtime.config import DeepSpeedConfig

    assert DeepSpeedConfig({"train_batch_size": 1, "bfloat16": {"enabled": "auto"}}).bfloat16_config.enabled is False


def test_transformers_refuses_gradient_clipping_zero_against_the_default_max_grad_norm():
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    config = HfTrainerDeepSpeedConfig({"gradient_clipping": 0, "train_micro_batch_size_per_gpu": "auto"})
    config.trainer_config_process(TrainingArguments(output_dir="/tmp/x", report_to=[]))
    with pytest.raises(ValueError, match="ds gradient_clipping=0 vs hf max_grad_norm=1.0"):
        config.trainer_config_finalize(
            TrainingArguments(output_dir="/tmp/x", report_to=[]), model=None, num_training_steps=10
        )


def test_transformers_names_a_missing_flash_attn_as_the_check_quotes():
    import inspect

    import transformers.modeling_utils as mu

    assert "doesn't seem to be installed." in inspect.getsource(mu)


def test_an_absolute_min_lr_reads_optimizer_defaults_which_deepspeeds_zero_optimizer_lacks():
    """Why the plan passes the floor as min_lr_rate (transformers 5.24, DeepSpeed 0.19)."""
    import inspect

    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from transformers import optimization

    source = inspect.getsource(optimization.get_cosine_with_min_lr_schedule_with_warmup)
    assert 'min_lr_rate = min_lr / optimizer.defaults["lr"]' in source
    assert not any("defaults" in vars(cls) for cls in DeepSpeedZeroOptimizer.__mro__)
