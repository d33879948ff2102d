"""`sftdoctor train` with a [lora] section for real on the CPU: peft adapters through TRL's SFTTrainer on the tiny
example, what they leave on disk (the base, the adapter, the merged model), resume, DDP over gloo, DeepSpeed
ZeRO-2, and QLoRA's path up to the model load (bitsandbytes needs CUDA: refused here, before anything starts)."""

import json
import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest
from trainrun import EXAMPLES, complete, config, metrics, train

TINY = EXAMPLES / "tiny"
# A random base learns slowly through rank-8 adapters alone: a LoRA-sized rate moves the loss in 6 steps.
LORA = {"r": 8, "merge": True}
FAST = {"learning_rate": 1e-2, "max_steps": 6, "save_steps": 3, "packing": True}  # packed: more rows per step


def lora_config(folder, training=None, lora=None, **more):
    return config(folder, TINY, training={**FAST, **(training or {})}, extra={"lora": {**LORA, **(lora or {})}}, **more)


def said(proc) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


# ---------------------------------------------------------------- one LoRA run, read by several tests

# The tests that read it run on one xdist worker, so that it trains once.
SHARES_LORA_RUN = pytest.mark.xdist_group("lora_run")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora")
    cfg = lora_config(folder)
    proc = train(cfg)
    assert proc.returncode == 0, said(proc)
    return {"cfg": cfg, "run_dir": folder / "out", "proc": proc}


def safetensors(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def prompt_ids(tokenizer):
    row = json.loads((TINY / "data" / "train.jsonl").read_text().splitlines()[0])["messages"]
    return tokenizer.apply_chat_template(row, return_tensors="pt", return_dict=True)


def logits(model, batch):
    import torch

    model.eval()
    with torch.no_grad():
        return model(**batch).logits


@pytest.mark.slow
@SHARES_LORA_RUN
def test_lora_trains_the_tiny_example_and_the_loss_falls(lora_run):
    run_dir, proc = lora_run["run_dir"], lora_run["proc"]
    losses = [m["loss"] for m in metrics(run_dir)]
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert losses[-1] < losses[0] - 0.1, losses
    assert re.search(r"adapters +LoRA r 8, alpha 32 on all-linear: 19,456 trainable of", proc.stdout)
    assert re.search(r"lora-targets +adapters of rank 8 on 14 layers train 19,456 parameters", proc.stdout)
    assert complete(run_dir) == ["checkpoint-3", "checkpoint-6"]
    assert "AutoPeftModelForCausalLM.from_pretrained" in proc.stdout and "final-merged" in proc.stdout
    final = run_dir / "final"
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "README.md",
    } <= {p.name for p in final.iterdir()}
    assert not (final / "model.safetensors").exists()  # the adapter only, not a whole model
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(run_dir / "base")
    assert (adapter["peft_type"], adapter["r"], adapter["lora_alpha"]) == ("LORA", 8, 32)
    assert (run_dir / "base" / "config.json").is_file() and (run_dir / "base" / "model.safetensors").is_file()
    assert "AutoPeftModelForCausalLM.from_pretrained" in (final / "README.md").read_text()


@pytest.mark.slow
@SHARES_LORA_RUN
def test_only_the_adapters_change(lora_run):
    """RUN_DIR/base is the seed's random init the workers trained over; the PeftModel rebuilt from final/ holds
    it bit for bit; the optimizer stepped exactly the adapters' tensors; the adapters left their init (B = 0)."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    run_dir = lora_run["run_dir"]
    plan = json.loads((run_dir / "resolved.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base")
    reference = {k: v.clone() for k, v in base.state_dict().items()}
    torch.manual_seed(plan["seed"])  # as sft.load_model builds a random base
    fresh = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(TINY / "model"), dtype=torch.float32, attn_implementation=plan["attn_implementation"]
    )
    assert fresh.state_dict().keys() == reference.keys()
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in reference.items())

    peft_model = PeftModel.from_pretrained(base, run_dir / "final")
    compared = set()
    for name, tensor in peft_model.state_dict().items():
        if "lora_" in name:
            continue
        key = name.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(tensor, reference[key]), key
        compared.add(key)
    assert compared == set(reference)

    adapter = safetensors(run_dir / "final" / "adapter_model.safetensors")
    assert adapter and all("lora_A" in k or "lora_B" in k for k in adapter)
    assert all(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # trained away from B = 0
    assert sum(v.numel() for v in adapter.values()) == plan["lora"]["trainable_params"] == 19_456
    optimizer = torch.load(run_dir / "checkpoint-6" / "optimizer.pt", weights_only=True)
    stepped = [p for group in optimizer["param_groups"] for p in group["params"]]
    assert len(stepped) == len(adapter)  # AdamW holds the adapters' tensors and nothing of the base
    assert sum(s["exp_avg"].numel() for s in optimizer["state"].values()) == plan["lora"]["trainable_params"]
    last = safetensors(run_dir / "checkpoint-6" / "adapter_model.safetensors")
    assert all(torch.equal(last[k], v) for k, v in adapter.items())  # final/ is the trained state of step 6
    earlier = safetensors(run_dir / "checkpoint-3" / "adapter_model.safetensors")
    assert any(not torch.equal(earlier[k], v) for k, v in adapter.items())


@pytest.mark.slow
@SHARES_LORA_RUN
def test_the_adapter_reloads_onto_its_base_and_the_merged_model_equals_base_plus_adapter(lora_run):
    import torch
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = lora_run["run_dir"]
    final, merged_dir = run_dir / "final", run_dir / "final-merged"
    tokenizer = AutoTokenizer.from_pretrained(final)
    batch = prompt_ids(tokenizer)
    reloaded = AutoPeftModelForCausalLM.from_pretrained(final)  # finds its base through adapter_config.json
    by_hand = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(run_dir / "base"), final)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)  # plain transformers, no peft
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base")
    ours, theirs, together = logits(reloaded, batch), logits(by_hand, batch), logits(merged, batch)
    assert torch.equal(ours, theirs)
    assert torch.allclose(ours, together, atol=1e-4), (ours - together).abs().max()
    assert (ours - logits(base, batch)).abs().max() > 1e-3  # the adapter changes what the model says

    assert not any("lora_" in k for k in merged.state_dict())
    assert merged.state_dict().keys() == base.state_dict().keys()
    by_hand_merged = by_hand.merge_and_unload().state_dict()
    for name, tensor in merged.state_dict().items():
        assert torch.allclose(tensor, by_hand_merged[name], atol=1e-6), name
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for folder in (final, merged_dir):
        eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
        assert eot in (eos if isinstance(eos, list) else [eos]), folder
    assert (merged_dir / "tokenizer.json").is_file()


@pytest.mark.slow
@SHARES_LORA_RUN
def test_resume_continues_the_adapters_from_the_newest_complete_checkpoint(lora_run, tmp_path):
    """On a copy of the run above, as if killed while saving step 6: the resumed run starts from checkpoint-3's
    adapters and optimizer and ends where the uninterrupted run ended."""
    import torch

    first_dir = lora_run["run_dir"]
    first = metrics(first_dir)
    run_dir = tmp_path / "out"
    shutil.copytree(first_dir, run_dir)
    (run_dir / "checkpoint-6" / "sftdoctor-complete").unlink()
    cfg = lora_config(tmp_path)
    proc = train(cfg, "--resume")
    assert proc.returncode == 0, said(proc)
    assert f"resuming from {run_dir / 'checkpoint-3'}" in proc.stdout
    assert "run complete: 3 steps (steps 4-6, resumed)" in proc.stdout
    assert "missing keys" not in proc.stdout + proc.stderr
    after = metrics(run_dir)
    assert [m["step"] for m in after] == [1, 2, 3, 4, 5, 6]  # 4-6 once: the resumed run's
    assert after[3]["loss"] == pytest.approx(first[3]["loss"], rel=1e-4)  # step 4 trains checkpoint-3's adapters
    assert after[-1]["loss"] == pytest.approx(first[-1]["loss"], rel=1e-4)
    assert complete(run_dir) == ["checkpoint-3", "checkpoint-6"]
    resumed = safetensors(run_dir / "final" / "adapter_model.safetensors")
    uninterrupted = safetensors(first_dir / "final" / "adapter_model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in resumed.items():
        assert torch.allclose(tensor, uninterrupted[name], atol=1e-5), name
    assert json.loads((run_dir / "final" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        run_dir / "base"
    )
    assert (run_dir / "final-merged" / "model.safetensors").is_file()


# ---------------------------------------------------------------- several processes


def assert_adapter_written(run_dir, steps):
    from peft import AutoPeftModelForCausalLM

    assert [m["step"] for m in metrics(run_dir)] == list(range(1, steps + 1))
    final = run_dir / "final"
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == str(run_dir / "base")
    adapter = safetensors(final / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter) and not (final / "model.safetensors").exists()
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)
    AutoPeftModelForCausalLM.from_pretrained(final)


@pytest.mark.slow
def test_lora_on_two_processes_ddp_over_gloo(tmp_path):
    cfg = lora_config(
        tmp_path, training={"max_steps": 2, "save_steps": 2}, lora={"merge": False}, launch={"nproc_per_node": 2}
    )
    proc = train(cfg, "--no-rehearse")  # the rehearsal has tests of its own; this one keeps the file short
    assert proc.returncode == 0, said(proc)
    assert re.search(r"world size +2 ", proc.stdout) and "rehearsing" not in proc.stdout
    assert re.search(r"cluster-consistency +2 ranks on 1 node agree", proc.stdout)  # every rank, before the load
    assert proc.stdout.count("step 2/2  loss") == 1  # rank 0 only
    run_dir = tmp_path / "out"
    assert complete(run_dir) == ["checkpoint-2"]
    assert_adapter_written(run_dir, 2)
    assert not (run_dir / "final-merged").exists()


@pytest.mark.slow
def test_lora_on_two_processes_deepspeed_zero2(tmp_path):
    cfg = lora_config(
        tmp_path,
        training={"max_steps": 2, "save_steps": 2},
        lora={"merge": False},
        launch={"nproc_per_node": 2},
        deepspeed={"zero_stage": 2},
    )
    proc = train(cfg, "--no-rehearse")
    assert proc.returncode == 0, said(proc)
    assert re.search(r"sharding +DeepSpeed ZeRO-2", proc.stdout) and "sftdoctor: run complete: 2 steps" in proc.stdout
    run_dir = tmp_path / "out"
    assert complete(run_dir) == ["checkpoint-2"]
    assert list((run_dir / "checkpoint-2").glob("global_step2/*optim_states.pt"))  # DeepSpeed's own partitions
    assert_adapter_written(run_dir, 2)


# ---------------------------------------------------------------- refused before any training


def check_json(cfg, *flags) -> tuple[int, list[dict]]:
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--config", str(cfg), "--json", *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, json.loads(proc.stdout)["findings"]


def our_processes(mark: str) -> list[int]:
    """Processes still alive that inherited SFTDOCTOR_TEST_MARK=mark (torchrun, workers, probes)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if f"SFTDOCTOR_TEST_MARK={mark}".encode() in environ.split(b"\0"):
            alive.append(int(entry))
    return alive


@pytest.mark.slow
def test_qlora_without_a_cuda_gpu_is_an_error_and_train_does_not_start(tmp_path):
    from importlib.util import find_spec

    cfg = lora_config(tmp_path, lora={"quantize": "4bit"})
    code, findings = check_json(cfg)
    assert code == 1
    qlora = [f for f in findings if f["id"].split("/")[0] == "qlora"]
    assert qlora and all(f["severity"] == "error" for f in qlora)
    titles = [f["title"] for f in qlora]
    assert any("needs a CUDA GPU, and none is visible" in t for t in titles), titles
    if find_spec("bitsandbytes") is None:
        assert any("needs bitsandbytes, which is not installed" in t for t in titles), titles

    mark = uuid.uuid4().hex
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "train", str(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SFTDOCTOR_TEST_MARK": mark},
    )
    assert proc.returncode == 1, said(proc)  # the gate's exit: an error finding (2 is bad input)
    assert "not starting: the checks above found errors" in proc.stdout
    assert "qlora" in proc.stdout and "needs a CUDA GPU" in proc.stdout
    assert re.search(r"adapters +QLoRA\b.* r 8, alpha 32 on all-linear", proc.stdout)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "out").exists()  # no run directory, no base saved, no worker started
    assert our_processes(mark) == []


@pytest.mark.slow
def test_qlora_quantization_config_and_the_load_up_to_bitsandbytes(tmp_path, monkeypatch):
    """The plan's BitsAndBytesConfig (NF4, double quantization, the run's compute dtype, uint8 storage or the
    compute dtype under ZeRO-3), and sft.load_model's quantized path with it: the random base saved to
    RUN_DIR/base, then loaded back from there through bitsandbytes on this rank's device."""
    from importlib.util import find_spec

    import torch
    import transformers
    from conftest import plan_of, run_of
    from transformers import BitsAndBytesConfig

    from sftdoctor.facts.trainer_inputs import quantization_config
    from sftdoctor.train import sft

    for stage, storage in ((0, torch.uint8), (2, torch.uint8), (3, torch.bfloat16)):
        plan = plan_of(
            run_of(
                model={"precision": "bf16"},
                lora={"quantize": "4bit"},
                **({"deepspeed": {"zero_stage": stage}} if stage else {}),
            )
        )
        assert (plan.lora["compute_dtype"], plan.lora["quant_storage"]) == ("bfloat16", str(storage).split(".")[1])
        q = quantization_config(plan)
        assert isinstance(q, BitsAndBytesConfig) and q.load_in_4bit and not q.load_in_8bit
        assert q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant
        assert q.bnb_4bit_compute_dtype == torch.bfloat16 and q.bnb_4bit_quant_storage == storage
    fp16 = quantization_config(plan_of(run_of(model={"precision": "fp16"}, lora={"quantize": "4bit"})))
    assert fp16.bnb_4bit_compute_dtype == torch.float16
    eight = quantization_config(plan_of(run_of(model={"precision": "bf16"}, lora={"quantize": "8bit"})))
    assert eight.load_in_8bit and not eight.load_in_4bit
    assert quantization_config(plan_of(run_of(lora={}))) is None
    assert quantization_config(plan_of(run_of())) is None

    plan = plan_of(
        run_of(
            model={"path": str(TINY / "model"), "weights": "random", "precision": "bf16"},
            training={"output_dir": str(tmp_path / "out")},
            lora={"quantize": "4bit"},
        )
    )
    if find_spec("bitsandbytes") is None:  # the real load on this machine: refused by transformers, by name
        with pytest.raises(ImportError, match="bitsandbytes"):
            sft.load_model(plan)
    seen = {}

    def loading(path, **kwargs):
        seen.update(path=str(path), **kwargs)
        raise RuntimeError("stop at the load")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loading)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match="stop at the load"):
        sft.load_model(plan)
    assert seen["path"] == str(tmp_path / "out" / "base") and (tmp_path / "out" / "base" / "config.json").is_file()
    assert seen["device_map"] == {"": 1} and seen["dtype"] == torch.bfloat16
    q = seen["quantization_config"]
    assert q.load_in_4bit and q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant
    assert q.bnb_4bit_compute_dtype == torch.bfloat16 and q.bnb_4bit_quant_storage == torch.uint8


@pytest.mark.slow
def test_a_misspelt_target_module_is_caught_before_training(tmp_path):
    cfg = lora_config(tmp_path, lora={"target_modules": ["q_proj", "c_attn"]})
    code, findings = check_json(cfg, "--select", "lora-targets")  # the train gate runs the same check
    assert code == 1
    [finding] = [f for f in findings if f["id"] == "lora-targets/missing-targets"]
    assert finding["severity"] == "error"
    assert "c_attn" in finding["title"] and "q_proj" not in finding["evidence"]["missing"]
    assert finding["evidence"]["missing"] == ["c_attn"]
    assert "peft silently skips names" in finding["detail"]  # q_proj matches: peft would not have said a word
    assert not (tmp_path / "out").exists()  # checked from the config alone: nothing trained, nothing written
