"""The plan (batch arithmetic, precision, DeepSpeed JSON, schedule) and the gate checks, without training."""

import pytest

from conftest import FIXTURES, recorded_gpus, severities
from sftdoctor.checks import Skipped
from sftdoctor.checks.run_config import largest_layer, model_state_bytes, parameter_count
from sftdoctor.facts.configs import read_json_object, summarize_model_config
from sftdoctor.train import resolve
from sftdoctor.train.config import validate

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"
V100x4 = "v100_pcie_4x_driver470_cuda114_princeton.txt"


def run_config(tmp_path, **sections):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    raw = {"model": {"path": "m"}, "data": {"train": "d.jsonl"}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return validate(raw, tmp_path / "run.toml")


def test_global_batch_arithmetic_and_the_nearest_targets():
    assert resolve.accumulation(528, 2, 8) == 33
    assert resolve.accumulation(500, 2, 8) is None
    assert resolve.nearest_global_batches(500, 2, 8) == [496, 512]
    assert resolve.nearest_global_batches(10, 2, 8) == [16]


def test_world_size_auto_counts_visible_gpus(tmp_path):
    cfg = run_config(tmp_path)
    assert resolve.world(cfg, recorded_gpus(H100x8)) == (8, 1)
    assert resolve.world(cfg, {"devices": []}) == (1, 1)
    assert resolve.world(run_config(tmp_path, launch={"nproc_per_node": 4, "nnodes": 2}), None) == (4, 2)


def test_precision_auto_follows_the_gpus(tmp_path):
    cfg = run_config(tmp_path)
    assert resolve.precision(cfg, recorded_gpus(H100x8)) == "bf16"
    assert resolve.precision(cfg, recorded_gpus(V100x4)) == "fp16"
    assert resolve.precision(cfg, {"devices": []}) == "fp32"


def test_flash_attention_only_where_installed_and_ampere(tmp_path):
    cfg = run_config(tmp_path)
    assert resolve.attn_implementation(cfg, recorded_gpus(H100x8), {"flash-attn": "2.8.3"}) == "flash_attention_2"
    assert resolve.attn_implementation(cfg, recorded_gpus(V100x4), {"flash-attn": "2.8.3"}) == "sdpa"
    assert resolve.attn_implementation(cfg, recorded_gpus(H100x8), {"flash-attn": None}) == "sdpa"


def test_generated_deepspeed_json_is_accepted_by_deepspeed(tmp_path):
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = run_config(tmp_path, deepspeed={"zero_stage": 3, "offload_optimizer": True, "offload_params": True})
    ds = resolve.deepspeed_config(cfg)
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    # What transformers does with the "auto" values, then DeepSpeed's own parser.
    filled = {**ds, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_batch_size": 8,
              "gradient_clipping": 1.0, "bf16": {"enabled": True}, "fp16": {**ds["fp16"], "enabled": False},
              "zero_optimization": {**ds["zero_optimization"], "reduce_bucket_size": 1e6,
                                    "stage3_prefetch_bucket_size": 1e6, "stage3_param_persistence_threshold": 1e4}}
    parsed = DeepSpeedConfig(filled)
    assert parsed.zero_optimization_stage == 3 and parsed.bfloat16_config.enabled


def test_min_lr_floor_is_passed_as_the_installed_transformers_takes_it():
    training = {"lr_scheduler": "cosine_with_min_lr", "learning_rate": 2e-5}
    assert resolve.lr_scheduler_kwargs({**training, "min_lr_rate": 0.0}, {"min_lr_rate": True}) == {"min_lr_rate": 0.0}
    assert resolve.lr_scheduler_kwargs(training, {"min_lr_rate": False}) == {"min_lr": pytest.approx(2e-6)}
    assert resolve.lr_scheduler_kwargs({**training, "lr_scheduler": "cosine"}, None) == {}


def test_transformers_features_are_read_from_the_installed_source():
    from sftdoctor.facts import Facts

    features = Facts().get("transformers_features")
    assert features == {"cosine_with_min_lr": True, "min_lr_rate": True, "min_lr": True,
                        "checkpointing_arg": "activation_checkpointing", "warmup_ratio": False,
                        "non_padding_token_count": True}


def test_batch_size_check(run, tmp_path):
    gpus = recorded_gpus(H100x8)
    good = run("batch-size", run_config=run_config(tmp_path, training={"global_batch_size": 528, "per_device_batch_size": 2}), gpus=gpus)
    assert severities(good) == ["ok"] and "528 = 2 per device x 33 accumulation x 8" in good[0].title
    bad = run("batch-size", run_config=run_config(tmp_path, training={"global_batch_size": 500, "per_device_batch_size": 2}), gpus=gpus)
    assert severities(bad) == ["error"] and "496 or 512" in bad[0].detail
    slow = run("batch-size", run_config=run_config(tmp_path, training={"global_batch_size": 1024}), gpus=gpus)
    assert severities(slow) == ["warning"] and "128 sequential micro-steps" in slow[0].title


def test_lr_scheduler_check(run, tmp_path):
    cfg = run_config(tmp_path, training={"max_steps": 100, "warmup_steps": 100})
    assert severities(run("lr-scheduler", run_config=cfg)) == ["error"]
    ds = {"path": "ds.json", "config": {"scheduler": {"type": "WarmupDecayLR", "params": {}}}}
    ignored = run("lr-scheduler", run_config=run_config(tmp_path), deepspeed_config=ds)
    assert severities(ignored) == ["warning"] and "replaces cosine_with_min_lr" in ignored[0].title
    old = run("lr-scheduler", run_config=run_config(tmp_path), transformers_features={"cosine_with_min_lr": False})
    assert severities(old) == ["error"]
    fine = run("lr-scheduler", run_config=run_config(tmp_path, training={"min_lr_rate": 0.0, "max_steps": 1000}),
               transformers_features={"cosine_with_min_lr": True, "min_lr_rate": True})
    assert severities(fine) == ["ok"] and "floor of 0 x learning_rate (min_lr_rate)" in fine[0].title and "30 of ~1000" in fine[0].title


def test_warmup_ratio_is_judged_against_the_steps_the_data_gives(run, tmp_path):
    cfg = run_config(tmp_path, training={"warmup_steps": 50, "global_batch_size": 64}, launch={"nproc_per_node": 8})
    data = {"train": {"rows": 3200, "shape": "text"}}
    assert severities(run("lr-scheduler", run_config=cfg, data=data)) == ["error"]  # 3200 / 64 = 50 steps
    assert severities(run("lr-scheduler", run_config=cfg, data={"train": {"rows": 6400, "shape": "text"}})) == ["ok"]


def test_gradient_checkpointing_check(run, tmp_path):
    on = run("gradient-checkpointing", run_config=run_config(tmp_path),
             transformers_features={"checkpointing_arg": "activation_checkpointing"})
    assert severities(on) == ["ok"] and "TrainingArguments.activation_checkpointing" in on[0].title
    ds = {"path": "ds.json", "config": {"activation_checkpointing": {"partition_activations": True}}}
    findings = run("gradient-checkpointing", run_config=run_config(tmp_path, training={"gradient_checkpointing": False}),
                   deepspeed_config=ds)
    assert severities(findings) == ["info", "warning"]


def model(name):
    path = FIXTURES / "model_config" / name
    return summarize_model_config(path, read_json_object(path, "config.json"))


def test_parameter_count_from_real_configs():
    assert parameter_count(model("Meta-Llama-3-8B.json")) == 8_030_261_248  # the published 8.03B
    assert parameter_count(model("Qwen2-0.5B.json")) is not None
    assert parameter_count(model("gpt2.json")) is None  # not a gated-MLP family: not guessed


@pytest.mark.parametrize("name", ["Meta-Llama-3-8B.json", "Llama-2-7b-chat-hf.json"])
def test_model_states_equal_deepspeeds_own_estimators(name):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cfg = model(name)
    params, largest = parameter_count(cfg), largest_layer(cfg)
    for gpus in (1, 8):
        assert model_state_bytes(params, largest, 2, gpus) == estimate_zero2_model_states_mem_needs(params, gpus, 1, False)[1]
        assert model_state_bytes(params, largest, 2, gpus, offload_optimizer=True) == \
            estimate_zero2_model_states_mem_needs(params, gpus, 1, True)[1]
        assert model_state_bytes(params, largest, 3, gpus) == \
            estimate_zero3_model_states_mem_needs(params, largest, gpus, 1, False, False)[1]
        assert model_state_bytes(params, largest, 3, gpus, True, True) == \
            estimate_zero3_model_states_mem_needs(params, largest, gpus, 1, True, True)[1]


def test_zero_stage_check_on_real_machines(run, tmp_path):
    llama8b = model("Meta-Llama-3-8B.json")
    h100 = recorded_gpus(H100x8)  # 8 x 80 GB
    ok = run("zero-stage", run_config=run_config(tmp_path, deepspeed={"zero_stage": 2}), model_config=llama8b, gpus=h100)
    assert severities(ok) == ["ok"] and "8.03B parameters on 8 GPUs" in ok[0].title
    ddp = run("zero-stage", run_config=run_config(tmp_path), model_config=llama8b, gpus=h100)
    assert severities(ddp) == ["error"] and "zero_stage = 2" in ddp[0].fix  # 16 bytes x 8B = 128 GB > 80 GB
    slow = run("zero-stage", run_config=run_config(tmp_path, deepspeed={"zero_stage": 3}), model_config=llama8b, gpus=h100)
    assert severities(slow) == ["info"] and "ZeRO-2 would fit" in slow[0].title
    v100 = recorded_gpus(V100x4)  # 4 x 32 GB
    tight = run("zero-stage", run_config=run_config(tmp_path, deepspeed={"zero_stage": 2}), model_config=llama8b, gpus=v100)
    assert severities(tight) == ["error"]
    assert isinstance(run("zero-stage", run_config=run_config(tmp_path), model_config=llama8b,
                          gpus={"devices": []}), Skipped)


def test_packing_check_verdicts(run, tmp_path):
    isolated = {"isolated": True, "max_abs_diff": 2e-7, "tolerance": 1e-4, "attn_implementation": "sdpa", "model_type": "qwen2"}
    leaky = {**isolated, "isolated": False, "max_abs_diff": 0.8}
    auto = run_config(tmp_path)
    forced = run_config(tmp_path, training={"packing": True})
    assert severities(run("packing", run_config=auto, packing_probe=isolated)) == ["ok"]
    assert severities(run("packing", run_config=auto, packing_probe=leaky)) == ["info"]
    assert severities(run("packing", run_config=forced, packing_probe=leaky)) == ["error"]
    assert severities(run("packing", run_config=forced)) == ["warning"]
    assert severities(run("packing", run_config=run_config(tmp_path, training={"packing": False}))) == ["ok"]


def test_workers_load_a_cached_hub_model_offline_and_refuse_a_missing_one(tmp_path, monkeypatch):
    from sftdoctor.errors import InputError
    from sftdoctor.train.launch import worker_env

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = run_config(tmp_path, model={"path": "Qwen/Qwen2.5-7B"})
    assert worker_env(cfg, tmp_path / "run.toml", tmp_path)["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        worker_env(run_config(tmp_path, model={"path": "meta-llama/Llama-3.1-8B"}), tmp_path / "run.toml", tmp_path)


def test_a_report_backend_that_is_not_installed_is_bad_input(tmp_path):
    from importlib.util import find_spec

    from sftdoctor.errors import InputError
    from sftdoctor.train.launch import worker_env

    missing = next(b for b in ("wandb", "tensorboard") if find_spec(b) is None)
    with pytest.raises(InputError, match=rf"\[report\].to: {missing} is not installed"):
        worker_env(run_config(tmp_path, report={"to": missing}), tmp_path / "run.toml", tmp_path)


def test_warmup_ratio_reaches_transformers_under_the_name_it_reads():
    from transformers import TrainingArguments

    new, old = {"warmup_ratio": False}, {"warmup_ratio": True}
    assert resolve.warmup_arguments({"warmup_ratio": 0.05}, new) == {"warmup_steps": 0.05}
    assert resolve.warmup_arguments({"warmup_ratio": 0.05}, old) == {"warmup_ratio": 0.05}
    assert resolve.warmup_arguments({"warmup_steps": 7}, new) == {"warmup_steps": 7}
    from sftdoctor.facts import Facts

    args = TrainingArguments(output_dir="/tmp/x", report_to=[],
                             **resolve.warmup_arguments({"warmup_ratio": 0.05}, Facts().get("transformers_features")))
    assert args.get_warmup_steps(200) == 10
