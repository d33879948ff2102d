"""batch-size, lr-scheduler and gradient-checkpointing: verdicts on the plans of real machines."""

from conftest import TRANSFORMERS_5, make_run, plan_of, recorded_gpus, severities

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"


def test_batch_size_check(run, tmp_path):
    gpus = recorded_gpus(H100x8)
    plan = lambda **t: plan_of(make_run(tmp_path, training=t), gpus=gpus)  # noqa: E731
    good = run("batch-size", plan=plan(global_batch_size=528, per_device_batch_size=2))
    assert severities(good) == ["ok"] and "528 = 2 per device x 33 accumulation x 8" in good[0].title
    bad = run("batch-size", plan=plan(global_batch_size=500, per_device_batch_size=2))
    assert severities(bad) == ["error"] and "496 or 512" in bad[0].detail and "512 or 496" in bad[0].fix
    slow = run("batch-size", plan=plan(global_batch_size=1024))
    assert severities(slow) == ["warning"] and "128 sequential micro-steps" in slow[0].title


def test_batch_size_suggests_a_smaller_micro_batch_that_reaches_the_target(run, tmp_path):
    plan = plan_of(
        make_run(tmp_path, training={"global_batch_size": 16, "per_device_batch_size": 8}), gpus=recorded_gpus(H100x8)
    )
    [finding] = run("batch-size", plan=plan)
    assert finding.severity.value == "error" and "per_device_batch_size = 2 (accumulation 1)" in finding.fix


def test_lr_scheduler_check(run, tmp_path):
    short = plan_of(make_run(tmp_path, training={"max_steps": 100, "warmup_steps": 100}))
    assert severities(run("lr-scheduler", plan=short)) == ["error"]
    (tmp_path / "ds.json").write_text("{}")
    ds = {"path": str(tmp_path / "ds.json"), "config": {"scheduler": {"type": "WarmupDecayLR", "params": {}}}}
    replaced = plan_of(make_run(tmp_path, deepspeed={"config": "ds.json"}), deepspeed_config=ds)
    ignored = run("lr-scheduler", plan=replaced)
    assert severities(ignored) == ["warning"] and "replaces cosine_with_min_lr" in ignored[0].title
    old = run("lr-scheduler", plan=plan_of(make_run(tmp_path)), transformers_features={"cosine_with_min_lr": False})
    assert severities(old) == ["error"]
    fine = run(
        "lr-scheduler",
        plan=plan_of(
            make_run(tmp_path, training={"min_lr_rate": 0.0, "max_steps": 1000}), transformers_features=TRANSFORMERS_5
        ),
        transformers_features=TRANSFORMERS_5,
    )
    assert severities(fine) == ["ok"] and "floor of 0 x learning_rate (min_lr_rate)" in fine[0].title
    assert "30 of ~1000" in fine[0].title


def test_warmup_is_judged_against_the_steps_the_data_gives(run, tmp_path):
    cfg = make_run(tmp_path, training={"warmup_steps": 50, "global_batch_size": 64}, launch={"nproc_per_node": 8})
    short = plan_of(cfg, data={"train": {"rows": 3200, "shape": "text"}})  # 3200 / 64 = 50 steps
    assert severities(run("lr-scheduler", plan=short)) == ["error"]
    assert severities(run("lr-scheduler", plan=plan_of(cfg, data={"train": {"rows": 6400, "shape": "text"}}))) == ["ok"]


def test_gradient_checkpointing_check(run, tmp_path):
    on = run(
        "gradient-checkpointing",
        plan=plan_of(
            make_run(tmp_path, training={"gradient_checkpointing": True}), transformers_features=TRANSFORMERS_5
        ),
    )
    assert severities(on) == ["ok"] and "TrainingArguments.activation_checkpointing" in on[0].title
    (tmp_path / "ds.json").write_text("{}")
    ds = {"path": "ds.json", "config": {"activation_checkpointing": {"partition_activations": True}}}
    off = plan_of(
        make_run(tmp_path, training={"gradient_checkpointing": False}, deepspeed={"config": "ds.json"}),
        deepspeed_config=ds,
    )
    assert severities(run("gradient-checkpointing", plan=off)) == ["info", "warning"]


def test_an_absolute_floor_is_an_error_only_where_the_stack_cannot_take_a_rate_under_deepspeed(run, tmp_path):
    old = {**TRANSFORMERS_5, "min_lr_rate": False}  # a transformers that knows only min_lr
    ds = make_run(tmp_path, deepspeed={"zero_stage": 2})
    [crash] = run("lr-scheduler", plan=plan_of(ds, transformers_features=old), transformers_features=old)
    assert (
        crash.severity.value == "error" and "no attribute" not in crash.title and "optimizer.defaults" in crash.detail
    )
    assert severities(
        run(
            "lr-scheduler", plan=plan_of(ds, transformers_features=TRANSFORMERS_5), transformers_features=TRANSFORMERS_5
        )
    ) == ["ok"]
    assert severities(
        run("lr-scheduler", plan=plan_of(make_run(tmp_path), transformers_features=old), transformers_features=old)
    ) == ["ok"]  # without DeepSpeed the optimizer has its defaults


def test_batch_sizes_a_deepspeed_json_hard_codes_are_judged_against_the_run(run, tmp_path):
    """A JSON copied from another cluster: transformers would refuse it once the model has loaded."""
    (tmp_path / "ds.json").write_text("{}")
    gpus = recorded_gpus(H100x8)

    def plan(ds):
        return plan_of(
            make_run(
                tmp_path,
                training={"global_batch_size": 64, "per_device_batch_size": 2},
                deepspeed={"config": "ds.json"},
            ),
            gpus=gpus,
            deepspeed_config={"path": "ds.json", "config": {"zero_optimization": {"stage": 2}, **ds}},
        )

    [bad] = run(
        "batch-size",
        plan=plan({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8}),
    )
    assert bad.severity.value == "error"
    assert "gradient_accumulation_steps = 8 (the run: 4), train_batch_size = 128 (the run: 64)" in bad.title
    assert "micro" not in bad.title and 'to "auto"' in bad.fix
    same = run("batch-size", plan=plan({"train_batch_size": 64.0, "train_micro_batch_size_per_gpu": "auto"}))
    assert severities(same) == ["ok"]
