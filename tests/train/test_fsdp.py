"""`sftdoctor train` with [fsdp] for real on 2 CPU ranks: FSDP2 (fully_shard over gloo) through transformers and
accelerate, on the tiny example: the rehearsal, sharded checkpoints (one shard per rank), a whole final model that
from_pretrained loads, a resume that continues exactly where the uninterrupted run went, and LoRA adapters."""

import json
import shutil

import pytest
from trainrun import EXAMPLES, complete, config, metrics, train

pytestmark = pytest.mark.slow  # end-to-end: real 2-rank FSDP2 runs

TINY = EXAMPLES / "tiny"
FAST = {"learning_rate": 1e-2, "max_steps": 6, "save_steps": 3, "packing": True}
SHARES_FSDP_RUN = pytest.mark.xdist_group("fsdp_run")  # the tests that read the run train it once


def fsdp_config(folder, lora=None):
    extra = {"fsdp": {}, **({"lora": lora} if lora else {})}
    return config(folder, TINY, training=FAST, launch={"nproc_per_node": 2}, extra=extra)


def said(proc) -> str:
    return proc.stdout[-4000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp")
    proc = train(fsdp_config(folder))  # with its rehearsal: 2 ranks are rehearsed by default
    assert proc.returncode == 0, said(proc)
    return {"folder": folder, "run_dir": folder / "out", "proc": proc}


@SHARES_FSDP_RUN
def test_the_tiny_example_trains_sharded_on_two_cpu_ranks(fsdp_run):
    run_dir, out = fsdp_run["run_dir"], fsdp_run["proc"].stdout
    assert "sftdoctor: rehearsal passed in" in out  # the shrunk model, a save and a resume, under FSDP2 first
    assert "sharding        FSDP2: full: every rank holds 1/world of the states" in out
    assert "FSDP2 on CPU ranks" in out  # the plugin accelerate drops without a GPU was turned on
    resolved = json.loads((run_dir / "resolved.json").read_text())
    assert resolved["fsdp"]["version"] == 2 and resolved["ddp_find_unused_parameters"] is False
    losses = [m["loss"] for m in metrics(run_dir)]
    assert losses[-1] < losses[0] - 0.5, losses
    assert complete(run_dir) == ["checkpoint-3", "checkpoint-6"]
    for kind in ("pytorch_model_fsdp_0", "optimizer_0"):  # each rank wrote its own shard, nobody gathered
        shards = sorted(p.name for p in (run_dir / "checkpoint-6" / kind).iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], shards
    assert not (run_dir / "checkpoint-6" / "model.safetensors").exists()


@SHARES_FSDP_RUN
def test_the_final_model_is_whole_and_loads_with_from_pretrained(fsdp_run):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    final = fsdp_run["run_dir"] / "final"
    model = AutoModelForCausalLM.from_pretrained(str(final))
    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY / "model")))
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in fresh.parameters())
    weights = load_file(str(final / "model.safetensors"))
    assert all(type(t) is torch.Tensor for t in weights.values())  # gathered, not DTensor shards
    for name, tensor in fresh.state_dict().items():  # every tensor at its full shape
        if name in weights:
            assert weights[name].shape == tensor.shape, name


@SHARES_FSDP_RUN
def test_a_resume_from_a_sharded_checkpoint_continues_the_run_exactly(fsdp_run, tmp_path):
    """On a copy of the run, as if killed while saving step 6: the resumed run loads checkpoint-3's shards (weights,
    optimizer, schedule) and trains steps 4-6 to the losses the uninterrupted run had."""
    first = metrics(fsdp_run["run_dir"])
    run_dir = tmp_path / "out"
    shutil.copytree(fsdp_run["run_dir"], run_dir)
    (run_dir / "checkpoint-6" / "sftdoctor-complete").unlink()
    shutil.rmtree(run_dir / "final")
    proc = train(fsdp_config(tmp_path), "--resume")
    assert proc.returncode == 0, said(proc)
    assert f"resuming from {run_dir / 'checkpoint-3'}" in proc.stdout
    after = metrics(run_dir)
    assert [m["step"] for m in after] == [1, 2, 3, 4, 5, 6]
    for step in (3, 5):  # steps 4 and 6
        assert after[step]["loss"] == pytest.approx(first[step]["loss"], rel=1e-4), (after, first)
    assert (run_dir / "final" / "model.safetensors").is_file()


def test_lora_under_fsdp2_trains_and_saves_an_adapter_that_loads_on_its_base(tmp_path):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    proc = train(fsdp_config(tmp_path, lora={"r": 8}), "--no-rehearse")
    assert proc.returncode == 0, said(proc)
    run_dir = tmp_path / "out"
    losses = [m["loss"] for m in metrics(run_dir)]
    assert losses[-1] < losses[0], losses
    final = run_dir / "final"
    adapter = load_file(str(final / "adapter_model.safetensors"))
    assert adapter and all("lora_" in name for name in adapter)  # the adapter only, not the gathered base
    assert any(t.abs().sum() > 0 for n, t in adapter.items() if "lora_B" in n)  # lora_B starts at zero: it trained
    base_path = json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), str(final))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


ACCELERATE_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: {loading}
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
mixed_precision: 'no'
num_machines: 1
num_processes: 2
"""


def test_an_accelerate_config_trains_and_rank_0s_weights_fill_every_shard(tmp_path):
    """`[fsdp] config` with pretrained weights: with cpu_ram_efficient_loading the ranks other than 0 start empty
    and receive rank 0's weights; the first step's loss is the one every rank loading its own copy gives."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model = tmp_path / "model"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY / "model"))).save_pretrained(str(model))
    AutoTokenizer.from_pretrained(str(TINY / "model")).save_pretrained(str(model))
    first = {}
    for loading in ("true", "false"):
        folder = tmp_path / loading
        folder.mkdir()
        (folder / "fsdp.yaml").write_text(ACCELERATE_YAML.format(loading=loading))
        cfg = config(
            folder,
            TINY,
            training={**FAST, "max_steps": 2, "save_steps": 2},
            launch={"nproc_per_node": 2},
            extra={"fsdp": {"config": str(folder / "fsdp.yaml")}},
        )
        text = cfg.read_text().replace(f'path = "{TINY / "model"}"', f'path = "{model}"')
        cfg.write_text(text.replace('weights = "random"', 'weights = "pretrained"'))
        proc = train(cfg, "--no-rehearse")
        assert proc.returncode == 0, said(proc)
        assert f"sharding        FSDP2 ({folder / 'fsdp.yaml'})" in proc.stdout
        resolved = json.loads((folder / "out" / "resolved.json").read_text())
        assert resolved["fsdp"]["cpu_ram_efficient_loading"] is (loading == "true")
        first[loading] = metrics(folder / "out")[0]["loss"]
    assert first["true"] == pytest.approx(first["false"], rel=1e-5), first
