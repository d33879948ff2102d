"""[fsdp] in the run config: what the plan decides (FSDP2's settings, once), what transformers and accelerate make
of them, and the configs refused before anything starts."""

import dataclasses

import pytest
from conftest import make_run, plan_of

from sftdoctor.errors import InputError, InputErrors


def plugin_of(plan, tmp_path):
    """accelerate's FullyShardedDataParallelPlugin as transformers builds it from the plan's SFTConfig."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    from sftdoctor.facts.trainer_inputs import sft_config

    args = sft_config(dataclasses.replace(plan, output_dir=str(tmp_path / "out")), has_eval=False)
    return args, FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)


def test_an_empty_fsdp_section_turns_on_fsdp2_with_sharded_checkpoints_and_the_models_own_layer_class(tmp_path):
    from torch.distributed.fsdp import OffloadPolicy

    plan = plan_of(make_run(tmp_path, fsdp={}, launch={"nproc_per_node": 2}))
    assert plan.fsdp_source == "generated for [fsdp]" and plan.fsdp_replicate == 1
    assert plan.ddp_find_unused_parameters is False and plan.deepspeed is None
    args, plugin = plugin_of(plan, tmp_path)
    assert args.fsdp is True and plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True and type(plugin.cpu_offload) is OffloadPolicy
    assert "SHARDED_STATE_DICT" in str(plugin.state_dict_type)
    assert plugin.auto_wrap_policy is not None and not plugin.transformer_cls_names_to_wrap  # the model's own
    assert plan.load_dtype == "float32"  # fp32 master weights, 16-bit compute through FSDP's mixed precision


def test_the_sections_keys_reach_accelerates_plugin(tmp_path):
    from torch.distributed.fsdp import CPUOffloadPolicy

    run = make_run(tmp_path, fsdp={"reshard_after_forward": False, "offload": True}, launch={"nproc_per_node": 2})
    _, plugin = plugin_of(plan_of(run), tmp_path)
    assert plugin.reshard_after_forward is False and isinstance(plugin.cpu_offload, CPUOffloadPolicy)


def test_activation_checkpointing_is_fsdps_and_never_the_trainers_too(tmp_path):
    """transformers 5.x refuses both at once (Trainer.create_accelerator_and_postprocess)."""
    run = make_run(tmp_path, fsdp={}, training={"gradient_checkpointing": True}, launch={"nproc_per_node": 2})
    plan = plan_of(run)
    assert plan.checkpointing and plan.fsdp["activation_checkpointing"] is True
    args, plugin = plugin_of(plan, tmp_path)
    assert plugin.activation_checkpointing is True
    assert not getattr(args, plan.checkpointing_arg)


@pytest.mark.parametrize(
    "weights, nproc, on", [("pretrained", 8, True), ("random", 8, False), ("pretrained", 1, False)]
)
def test_only_rank_0_reads_pretrained_weights_when_a_node_has_several_ranks(tmp_path, weights, nproc, on):
    run = make_run(tmp_path, fsdp={}, model={"weights": weights}, launch={"nproc_per_node": nproc})
    plan = plan_of(run)
    assert plan.fsdp["cpu_ram_efficient_loading"] is on
    assert plan.reasons["fsdp_cpu_ram_efficient_loading"].startswith("on" if on else "off")


def test_hybrid_sharding_replicates_over_nodes_and_is_full_sharding_on_one(tmp_path):
    one = plan_of(make_run(tmp_path, fsdp={"sharding": "hybrid"}, launch={"nproc_per_node": 4}))
    assert one.fsdp_replicate == 1 and "hybrid on one node is full sharding" in one.reasons["fsdp_sharding"]
    run = make_run(
        tmp_path,
        fsdp={"sharding": "hybrid"},
        launch={"nproc_per_node": 4, "nnodes": 2, "master_addr": "10.0.0.1", "master_port": 29500},
    )
    two = plan_of(run)
    assert two.fsdp_replicate == 2 and "replicated over 2 nodes" in two.reasons["fsdp_sharding"]
    args, _ = plugin_of(two, tmp_path)
    assert (args.parallelism_config.dp_replicate_size, args.parallelism_config.dp_shard_size) == (2, 4)


def test_qlora_under_fsdp_stores_its_4bit_weights_in_the_compute_dtype(tmp_path):
    run = make_run(tmp_path, fsdp={}, lora={"quantize": "4bit"}, model={"precision": "bf16"})
    assert plan_of(run).lora["quant_storage"] == "bfloat16"


def test_the_plan_without_fsdp_is_unchanged(tmp_path):
    plan = plan_of(make_run(tmp_path, launch={"nproc_per_node": 2}))
    assert (plan.fsdp, plan.fsdp_source, plan.fsdp_replicate) == (None, None, 1)


@pytest.mark.parametrize(
    "sections, words",
    [
        ({"fsdp": {}, "deepspeed": {"zero_stage": 3}}, "[fsdp]: [fsdp] and [deepspeed] both shard the model"),
        ({"fsdp": {"sharding": "zero3"}}, "[fsdp].sharding"),
        ({"fsdp": {"reshard_after_forward": "FULL_SHARD"}}, "[fsdp].reshard_after_forward"),
        ({"fsdp": {"config": "fsdp.yaml", "offload": True}}, "offload go with the settings sftdoctor decides"),
        ({"fsdp": {"sharding_strategy": "FULL_SHARD"}}, "sharding_strategy"),
        ({"fsdp": {}, "eval": {"tasks": ["x"], "every_n_checkpoints": 2}}, "[eval].every_n_checkpoints: FSDP's"),
    ],
)
def test_a_config_that_cannot_run_is_refused_naming_the_key(tmp_path, sections, words):
    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\n")
    with pytest.raises((InputError, InputErrors)) as refused:
        make_run(tmp_path, **sections)
    assert words in str(refused.value), refused.value


def test_a_given_accelerate_config_is_the_plans_with_the_version_accelerate_reads(tmp_path):
    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\n")
    run = make_run(tmp_path, fsdp={"config": "fsdp.yaml"}, launch={"nproc_per_node": 2})
    given = {"path": str(tmp_path / "fsdp.yaml"), "version": 1, "fsdp": {"sharding_strategy": "FULL_SHARD"}}
    plan = plan_of(run, fsdp_config=given)
    assert plan.fsdp["version"] == 1 and plan.fsdp["reshard_after_forward"] == "FULL_SHARD"  # FSDP1's strategy
    assert plan.fsdp["cpu_ram_efficient_loading"] is True  # the launcher's default, not transformers' false
    assert plan.fsdp_source == str(tmp_path / "fsdp.yaml")


def test_a_run_that_chose_fsdp2_is_recommended_an_fsdp2_setting_with_zero_beside_it(tmp_path):
    import json
    from pathlib import Path

    from sftdoctor.run.resolve import memory_fit
    from sftdoctor.run.shape import closed_form

    config = json.loads((Path(__file__).parents[1] / "fixtures" / "model_config" / "Meta-Llama-3-8B.json").read_text())
    run = make_run(
        tmp_path,
        fsdp={},
        data={"max_length": 4096},
        training={"global_batch_size": 64, "per_device_batch_size": 8, "gradient_checkpointing": False},
        launch={"nproc_per_node": 8},
    )
    found = memory_fit(plan_of(run), closed_form(config), 80 * 2**30)
    assert found.current.setting.fsdp and not found.current.fits  # micro-batch 8 of 4,096 tokens: no
    assert found.recommended.setting.fsdp and found.recommended.fits
    engines = {c.setting.fsdp for c in found.candidates if c.fits}
    assert engines == {True, False}  # ZeRO's rows stand beside FSDP2's in the table
