"""decide(): every decision of the plan, from the run config and recorded facts."""

import pytest
from conftest import TRANSFORMERS_5, make_run, plan_of, recorded_gpus

from sftdoctor.run import Plan, decide, for_launch
from sftdoctor.run.resolve import accumulation, ddp_timeout, nearest_global_batches

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"
V100x4 = "v100_pcie_4x_driver470_cuda114_princeton.txt"


def test_global_batch_arithmetic_and_the_nearest_targets():
    assert accumulation(528, 2, 8) == 33
    assert accumulation(500, 2, 8) is None
    assert nearest_global_batches(500, 2, 8) == (496, 512)
    assert nearest_global_batches(10, 2, 8) == (16,)


def test_world_size_auto_counts_visible_gpus(tmp_path):
    run = make_run(tmp_path)
    assert (plan_of(run, gpus=recorded_gpus(H100x8)).world_size, plan_of(run, gpus={"devices": []}).world_size) == (
        8,
        1,
    )
    fixed = plan_of(make_run(tmp_path, launch={"nproc_per_node": 4, "nnodes": 2, "node_rank": 1}))
    assert (fixed.nproc_per_node, fixed.nnodes, fixed.world_size, fixed.node_rank) == (4, 2, 8, 1)


def test_the_same_config_on_every_node_finds_its_node_rank(tmp_path):
    """node_rank = "auto" (the default): 0 where master_addr is this host (it hosts the c10d store), another
    rank elsewhere; a rank the user gives is kept."""
    run = make_run(tmp_path, launch={"nnodes": 2, "master_addr": "node0"})
    here = {"master_addr": "node0", "master_port": 29500, "local": True, "free_port": 40000, "in_use": False}
    host, other = plan_of(run, rendezvous=here), plan_of(run, rendezvous={**here, "local": False})
    assert (host.node_rank, other.node_rank) == (0, 1)
    assert host.reasons["node_rank"] == "master_addr node0 is this host: it hosts the rendezvous"
    assert "is another host: this node joins its rendezvous" in other.reasons["node_rank"]
    given = plan_of(make_run(tmp_path, launch={"nnodes": 2, "node_rank": 0}), rendezvous={**here, "local": False})
    assert given.node_rank == 0 and given.reasons["node_rank"] == "[launch].node_rank in the run config"


def test_an_unreachable_global_batch_has_no_accumulation_and_says_the_nearest(tmp_path):
    plan = plan_of(make_run(tmp_path, training={"global_batch_size": 100}), gpus=recorded_gpus(H100x8))
    assert plan.gradient_accumulation_steps is None and plan.nearest_global_batch_sizes == (96, 104)


@pytest.mark.parametrize("asked", ["auto", "bf16", "fp16", "fp32"])
@pytest.mark.parametrize("gpus", [H100x8, V100x4, None])
def test_precision_and_load_dtype_for_every_machine_and_request(tmp_path, asked, gpus):
    facts = {"gpus": recorded_gpus(gpus) if gpus else {"devices": []}}
    plan = plan_of(make_run(tmp_path, model={"precision": asked}), **facts)
    auto = {H100x8: "bf16", V100x4: "fp16", None: "fp32"}[gpus]
    assert plan.precision == (auto if asked == "auto" else asked)
    assert plan.load_dtype == "float32"  # without DeepSpeed, AMP keeps fp32 weights
    with_ds = plan_of(make_run(tmp_path, model={"precision": asked}, deepspeed={"zero_stage": 2}), **facts)
    assert with_ds.load_dtype == {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[with_ds.precision]


def test_unknown_compute_capability_assumes_bf16_and_says_so(tmp_path):
    plan = plan_of(make_run(tmp_path), gpus={"devices": [{"memory_total_mib": 81920}]})
    assert plan.precision == "bf16" and "assumed" in plan.reasons["precision"]


def test_flash_attention_only_where_installed_and_ampere(tmp_path):
    run = make_run(tmp_path)
    assert (
        plan_of(run, gpus=recorded_gpus(H100x8), packages={"flash-attn": "2.8.3"}).attn_implementation
        == "flash_attention_2"
    )
    assert plan_of(run, gpus=recorded_gpus(V100x4), packages={"flash-attn": "2.8.3"}).attn_implementation == "sdpa"
    assert plan_of(run, gpus=recorded_gpus(H100x8), packages={}).attn_implementation == "sdpa"


def test_liger_kernel_auto_only_on_gpus_triton_supports(tmp_path):
    """Triton refuses compute capability below 7.0 (a P100 is 6.0): auto leaves liger off there, not a crash."""
    run, liger = make_run(tmp_path), {"liger-kernel": "0.8.5"}
    assert plan_of(run, gpus=recorded_gpus(H100x8), packages=liger).liger_kernel is True
    assert plan_of(run, gpus=recorded_gpus(V100x4), packages=liger).liger_kernel is True
    assert (
        plan_of(run, gpus=recorded_gpus("p100_pcie_4x_driver418_princeton_tiger.txt"), packages=liger).liger_kernel
        is False
    )
    assert plan_of(run, gpus=recorded_gpus(H100x8), packages={}).liger_kernel is False


def test_generated_deepspeed_json_is_accepted_by_deepspeed(tmp_path):
    from deepspeed.runtime.config import DeepSpeedConfig

    plan = plan_of(make_run(tmp_path, deepspeed={"zero_stage": 3, "offload_optimizer": True, "offload_params": True}))
    ds = plan.deepspeed
    assert (plan.zero_stage, plan.offload_optimizer, plan.offload_params) == (3, True, True)
    assert plan.deepspeed_source.startswith("generated")
    # What transformers does with the "auto" values, then DeepSpeed's own parser.
    filled = {
        **ds,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "train_batch_size": 8,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "fp16": {**ds["fp16"], "enabled": False},
        "zero_optimization": {
            **ds["zero_optimization"],
            "reduce_bucket_size": 1e6,
            "stage3_prefetch_bucket_size": 1e6,
            "stage3_param_persistence_threshold": 1e4,
        },
    }
    parsed = DeepSpeedConfig(filled)
    assert parsed.zero_optimization_stage == 3 and parsed.bfloat16_config.enabled


def test_a_given_deepspeed_json_is_the_plans_and_its_stage_is_read(tmp_path):
    (tmp_path / "ds.json").write_text("{}")
    run = make_run(tmp_path, deepspeed={"config": "ds.json"})
    given = {
        "path": str(tmp_path / "ds.json"),
        "config": {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
    }
    plan = plan_of(run, deepspeed_config=given)
    assert (plan.zero_stage, plan.offload_params, plan.deepspeed_source) == (3, True, str(tmp_path / "ds.json"))


def test_the_lr_floor_is_always_passed_as_a_rate_where_transformers_takes_one(tmp_path):
    """An absolute min_lr crashes under DeepSpeed ZeRO (transformers 5.24 reads optimizer.defaults)."""
    absolute = make_run(tmp_path, training={"min_lr": 2e-6, "learning_rate": 2e-5})
    assert plan_of(absolute, transformers_features=TRANSFORMERS_5).lr_scheduler_kwargs == {
        "min_lr_rate": pytest.approx(0.1)
    }
    old = {**TRANSFORMERS_5, "min_lr_rate": False}
    assert plan_of(make_run(tmp_path), transformers_features=old).lr_scheduler_kwargs == {"min_lr": pytest.approx(2e-6)}
    assert plan_of(make_run(tmp_path, training={"lr_scheduler": "cosine"})).lr_scheduler_kwargs == {}


def test_defaults_live_in_the_schema_and_provenance_is_kept(tmp_path):
    run = make_run(tmp_path)
    assert (run.training.warmup_ratio, run.training.min_lr_rate, run.launch.master_port) == (0.03, 0.1, 29500)
    assert not run.given("launch", "master_port") and not run.given("training", "output_dir")
    assert make_run(tmp_path, launch={"master_port": 29500}).given("launch", "master_port")


def test_a_busy_default_port_becomes_a_free_one_but_a_chosen_port_is_kept(tmp_path):
    busy = {"master_port": 29500, "in_use": True, "free_port": 41234}
    assert plan_of(make_run(tmp_path), rendezvous=busy).master_port == 41234
    assert plan_of(make_run(tmp_path, launch={"master_port": 29500}), rendezvous=busy).master_port == 29500
    multi = make_run(tmp_path, launch={"nnodes": 2})
    assert plan_of(multi, rendezvous=busy).master_port == 29500  # every node must agree on it
    assert plan_of(make_run(tmp_path, launch={"master_port": "auto"}), rendezvous=busy).master_port == 41234


def test_warmup_reaches_transformers_under_the_name_it_reads(tmp_path):
    from transformers import TrainingArguments

    from sftdoctor.facts import Facts

    run = make_run(tmp_path, training={"warmup_ratio": 0.05, "max_steps": 200})
    assert plan_of(run, transformers_features=TRANSFORMERS_5).warmup == {"warmup_steps": 0.05}
    assert plan_of(run, transformers_features={**TRANSFORMERS_5, "warmup_ratio": True}).warmup == {"warmup_ratio": 0.05}
    assert plan_of(make_run(tmp_path, training={"warmup_steps": 7}), transformers_features=TRANSFORMERS_5).warmup == {
        "warmup_steps": 7
    }
    plan = plan_of(run, transformers_features=Facts().get("transformers_features"))
    args = TrainingArguments(output_dir=str(tmp_path / "x"), report_to=[], **plan.warmup)
    assert args.get_warmup_steps(200) == 10 == plan.warmup_steps


def test_assistant_only_loss_needs_generation_markers_or_a_template_trl_patches(tmp_path):
    run = make_run(tmp_path)
    chat = {"train": {"shape": "messages", "rows": 10}}
    assert plan_of(run, data=chat, chat_template={"generation_markers": True}).assistant_only_loss
    assert plan_of(
        run, data=chat, chat_template={"generation_markers": False, "trl_patchable": True}
    ).assistant_only_loss
    assert not plan_of(
        run, data=chat, chat_template={"generation_markers": False, "trl_patchable": False}
    ).assistant_only_loss
    assert not plan_of(
        run, data={"train": {"shape": "text", "rows": 10}}, chat_template={"generation_markers": True}
    ).assistant_only_loss


def test_a_template_without_markers_trains_with_the_drop_in_that_renders_it_and_a_given_one_wins(tmp_path):
    chat = {"train": {"shape": "messages", "rows": 10}}
    drop_in = {
        "generation_markers": False,
        "trl_patchable": False,
        "marked_equivalent": {"name": "chatml", "source": "sftdoctor", "path": "/x/chatml.jinja"},
    }
    plan = plan_of(make_run(tmp_path), data=chat, chat_template=drop_in)
    assert plan.assistant_only_loss and plan.chat_template == "/x/chatml.jinja"
    assert plan.reasons["chat_template"].startswith("sftdoctor's chatml.jinja")
    text = plan_of(make_run(tmp_path), data={"train": {"shape": "text", "rows": 10}}, chat_template=drop_in)
    assert text.chat_template is None and "chat_template" not in text.reasons  # text rows have no template
    (tmp_path / "mine.jinja").write_text("{{ messages }}")
    given = plan_of(
        make_run(tmp_path, model={"chat_template": "mine.jinja"}),
        data=chat,
        chat_template={"generation_markers": False, "trl_patchable": False, "given": "mine.jinja"},
    )
    assert given.chat_template == str(tmp_path / "mine.jinja") and not given.assistant_only_loss


def test_the_plan_round_trips_through_json_and_refuses_another_version(tmp_path):
    import json

    plan = for_launch(
        plan_of(make_run(tmp_path), gpus=recorded_gpus(H100x8)), drill={"kind": "hang", "step": 3, "rank": 1}
    )
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    with pytest.raises(ValueError, match="version"):
        Plan.from_json({**plan.to_json(), "version": 99})


def test_the_rehearsal_is_short_saves_and_writes_elsewhere(tmp_path):
    plan = plan_of(make_run(tmp_path, training={"global_batch_size": 64}), gpus=recorded_gpus(H100x8))
    smoke = for_launch(plan, rehearsal=True)
    assert (smoke.max_steps, smoke.save_steps, smoke.gradient_accumulation_steps) == (4, 2, 1)
    assert smoke.global_batch_size == 8 and smoke.output_dir.endswith("smoke") and smoke.deepspeed == plan.deepspeed


def test_resolve_reads_any_object_with_get(tmp_path):
    class Recorded(dict):
        pass

    assert decide(make_run(tmp_path), Recorded(gpus=recorded_gpus(V100x4))).precision == "fp16"
    assert ddp_timeout(300) == 1320


def test_the_base_an_adapter_names_is_an_absolute_path_or_a_hub_id(tmp_path, monkeypatch):
    """adapter_config.json records it: a path relative to where `train` ran would not load from anywhere else."""
    import dataclasses

    from sftdoctor.run.resolve import base_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    plan = plan_of(make_run(tmp_path))
    random = dataclasses.replace(plan, weights="random", output_dir="runs/x")
    assert base_path(random) == str(tmp_path / "runs" / "x" / "base")
    assert base_path(dataclasses.replace(plan, weights="pretrained", model_path="model")) == str(tmp_path / "model")
    assert base_path(dataclasses.replace(plan, weights="pretrained", model_path="org/name")) == "org/name"


SLURM = {
    "job_id": "4711",
    "nnodes": 2,
    "node_id": 1,
    "nodelist": "gpu[07-08]",
    "hosts": ["gpu07", "gpu08"],
    "hosts_from": "scontrol show hostnames",
    "gpus_on_node": 4,
    "restart_count": 0,
}


def test_inside_a_slurm_allocation_the_launch_comes_from_slurm(tmp_path):
    """`srun sftdoctor train RUN.toml` is the whole launch: nodes, this node's rank, the first node's address,
    the GPUs per node and a port of the job's own come from the allocation."""
    plan = plan_of(make_run(tmp_path), slurm=SLURM, gpus=recorded_gpus(H100x8))
    assert (plan.nnodes, plan.node_rank, plan.master_addr, plan.nproc_per_node, plan.world_size) == (
        2,
        1,
        "gpu07",
        4,
        8,
    )
    assert plan.master_port == 20000 + 4711 % 10000
    assert plan.reasons["node_rank"] == "SLURM_NODEID of job 4711"
    assert plan.reasons["master_addr"] == "the first node of Slurm job 4711 (scontrol show hostnames)"


def test_what_the_run_config_says_wins_over_slurm(tmp_path):
    run = make_run(tmp_path, launch={"nnodes": 1, "master_addr": "10.0.0.5", "master_port": 29400, "nproc_per_node": 2})
    plan = plan_of(run, slurm=SLURM)
    assert (plan.nnodes, plan.node_rank, plan.master_addr, plan.master_port, plan.nproc_per_node) == (
        1,
        0,
        "10.0.0.5",
        29400,
        2,
    )


# ---------------------------------------------------------------- automatic packing and checkpointing


def llama8b_shape():
    import json
    from dataclasses import asdict

    from conftest import FIXTURES

    from sftdoctor.run.shape import closed_form

    return asdict(closed_form(json.loads((FIXTURES / "model_config" / "Meta-Llama-3-8B.json").read_text())))


@pytest.mark.parametrize(
    "gpus, max_length, micro, on", [(H100x8, 1024, 1, False), (V100x4, 4096, 4, True)], ids=["fits-without", "needs-it"]
)
def test_auto_checkpointing_is_off_exactly_where_the_memory_plan_fits_without_it(tmp_path, gpus, max_length, micro, on):
    from dataclasses import replace

    from sftdoctor.run.gpus import smallest_memory
    from sftdoctor.run.resolve import memory_fit
    from sftdoctor.run.shape import Shape

    cfg = make_run(
        tmp_path,
        data={"max_length": max_length},
        training={"per_device_batch_size": micro},
        deepspeed={"zero_stage": 3},
    )
    found = recorded_gpus(gpus)
    plan = plan_of(cfg, gpus=found, model_shape=llama8b_shape())
    without = memory_fit(replace(plan, checkpointing=False), Shape(**llama8b_shape()), smallest_memory(found)).current
    assert plan.checkpointing is on and without.fits is (not on)
    assert plan.reasons["checkpointing"].startswith(
        "auto: on, without it the plan needs" if on else "auto: off, the plan fits without it"
    )


def test_auto_checkpointing_without_gpus_is_off_and_an_explicit_choice_is_kept(tmp_path):
    plan = plan_of(make_run(tmp_path))
    assert not plan.checkpointing and plan.reasons["checkpointing"] == "auto: no GPU to size it for, off"
    kept = plan_of(make_run(tmp_path, training={"gradient_checkpointing": True}))
    assert kept.checkpointing and kept.reasons["checkpointing"] == "[training].gradient_checkpointing in the run config"
    unknown = plan_of(make_run(tmp_path), gpus=recorded_gpus(H100x8))  # no model shape to size it with
    assert unknown.checkpointing and "unknown" in unknown.reasons["checkpointing"]


def test_auto_packing_needs_a_varlen_kernel_and_otherwise_batches_rows_by_length(tmp_path):
    isolated = {"isolated": True, "max_abs_diff": 0.0, "tolerance": 1e-4, "attn_implementation": "sdpa"}
    sdpa = plan_of(make_run(tmp_path), packing_probe=isolated, transformers_features=TRANSFORMERS_5)
    assert not sdpa.packing and sdpa.length_grouping == {"train_sampling_strategy": "group_by_length"}
    assert sdpa.reasons["packing"] == "auto: sdpa has no varlen kernel, so one sample per row, batched by length"
    old = plan_of(
        make_run(tmp_path), transformers_features={**TRANSFORMERS_5, "length_grouping_arg": "group_by_length"}
    )
    assert old.length_grouping == {"group_by_length": True}  # transformers 4.x's name
    flash = plan_of(
        make_run(tmp_path, model={"attn_implementation": "flash_attention_2"}),
        packing_probe={**isolated, "attn_implementation": "flash_attention_2"},
        transformers_features=TRANSFORMERS_5,
    )
    assert flash.packing and flash.length_grouping == {}
    asked = plan_of(make_run(tmp_path, training={"packing": True}), transformers_features=TRANSFORMERS_5)
    assert asked.packing and asked.reasons["packing"] == "[training].packing in the run config"
