"""Pins each private API that sftdoctor/train/compat.py wraps against the installed stack (torch 2.13.0,
transformers 5.24.0-5.25.0, TRL 1.16.0, accelerate 1.15.0-1.16.0, DeepSpeed 0.19.8, liger-kernel 0.8.5): an upgrade that
renames or changes one fails here."""

from __future__ import annotations

import gc
import inspect
import json
import math
import mmap
import os
import pickle
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from trainrun import tiny_qwen2

from sftdoctor.facts.packages import module_file
from sftdoctor.train import compat

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "trl", "deepspeed", "accelerate", "liger_kernel")
C10D_INCLUDE = ("include", "torch", "csrc", "distributed", "c10d")


def python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_importing_compat_and_building_the_launch_env_load_no_heavy_library():
    proc = python(
        "import sys, pathlib\n"
        "from sftdoctor.train import compat\n"
        "compat.flight_recorder_env(pathlib.Path('run'))\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


# ---------------------------------------------------------------- a tiny real trainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real Trainer, fp32 on the CPU, 2 optimizer steps of 2 accumulated micro-batches each, with the
    grad-norm wrapper installed; returns the trainer and what the wrapper saw."""
    import torch
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (8, 12)).tolist()]
    args = TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("trainer")),
        max_steps=2,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=tiny_qwen2(), args=args, train_dataset=rows)
    seen: list = []
    compat.wrap_grad_norm(trainer, seen.append)
    trainer.train()
    return trainer, seen


# ---------------------------------------------------------------- TRL's packing input


@pytest.mark.parametrize("packing", [True, False])
def test_capture_pack_input_keeps_the_tokenized_rows_in_the_order_given(tmp_path, packing):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    ids = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    rows = Dataset.from_list([{"input_ids": i, "sftdoctor_row": n} for n, i in enumerate(ids)])
    args = SFTConfig(output_dir=str(tmp_path), packing=packing, max_length=8, use_cpu=True, report_to=[])
    tokenizer = AutoTokenizer.from_pretrained(Path(__file__).parents[2] / "examples" / "tiny" / "model")
    with compat.capture_pack_input([]) as kept:
        SFTTrainer(model=tiny_qwen2(), args=args, train_dataset=rows, processing_class=tokenizer)
    if not packing:
        assert kept == []  # only a packed run goes through pack_dataset
        return
    [given] = kept
    assert given.column_names == ["input_ids", "labels"] and given["input_ids"] == ids  # the rows' order
    import trl.trainer.sft_trainer as sft_trainer

    assert sft_trainer.pack_dataset.__name__ == "pack_dataset" and not hasattr(sft_trainer.pack_dataset, "__wrapped__")


# ---------------------------------------------------------------- transformers Trainer._get_grad_norm


def test_get_grad_norm_keeps_the_signature_the_training_loop_calls():
    from transformers import Trainer

    params = inspect.signature(Trainer._get_grad_norm).parameters
    assert list(params) == ["self", "model", "grad_norm"]
    assert params["grad_norm"].default is None
    # The loop's call, which the wrapper forwards as is.
    assert "self._get_grad_norm(model, grad_norm=grad_norm)" in inspect.getsource(Trainer)


def test_wrap_grad_norm_sees_a_finite_norm_once_per_optimizer_step(trained):
    import torch

    trainer, seen = trained
    assert trainer.state.global_step == 2
    assert len(seen) == 2  # 4 micro-batches, 2 optimizer steps
    # Not read to the host yet (the kb's cost claim: the watcher's float() is the one read per step).
    assert all(isinstance(v, torch.Tensor) and v.numel() == 1 for v in seen)
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in seen)
    # What the wrapper returns is what the trainer logs.
    logged = [entry["grad_norm"] for entry in trainer.state.log_history if "grad_norm" in entry]
    assert logged == pytest.approx([float(v) for v in seen])


def test_wrap_grad_norm_without_the_method_names_the_version():
    with pytest.raises(RuntimeError, match=r"transformers 5\.\d+.* has no Trainer\._get_grad_norm"):
        compat.wrap_grad_norm(SimpleNamespace(), lambda value: None)


# ---------------------------------------------------------------- zero3_enabled


def test_zero3_enabled_follows_a_live_zero3_config():
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    assert compat.zero3_enabled() is False
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}})
    assert compat.zero3_enabled() is True  # a weakref: true only while the config object lives
    del config
    gc.collect()
    assert compat.zero3_enabled() is False


# ---------------------------------------------------------------- accelerate / DeepSpeed fp16 state


def test_optimizer_step_was_skipped_and_loss_scale_on_an_fp32_trainer(trained):
    from accelerate import Accelerator

    trainer, _ = trained
    assert isinstance(inspect.getattr_static(Accelerator, "optimizer_step_was_skipped"), property)
    assert compat.optimizer_step_was_skipped(trainer) is False
    assert trainer.accelerator.scaler is None and trainer.deepspeed is None
    assert compat.loss_scale(trainer) is None


def test_loss_scale_reads_torch_amp_grad_scaler():
    import torch

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    assert compat.loss_scale(SimpleNamespace(accelerator=SimpleNamespace(scaler=scaler))) == 1024.0


def test_deepspeed_fp16_optimizers_expose_the_scale_loss_scale_reads():
    from accelerate.utils.deepspeed import DeepSpeedOptimizerWrapper
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    for cls in (DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3, FP16_Optimizer):
        assert isinstance(inspect.getattr_static(cls, "loss_scale"), property), cls
    for cls in (DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3):
        assert isinstance(inspect.getattr_static(cls, "cur_scale"), property), cls
    # Under DeepSpeed, accelerate's skip flag is the DeepSpeed optimizer's overflow.
    assert isinstance(inspect.getattr_static(DeepSpeedOptimizerWrapper, "step_was_skipped"), property)

    def engine(**optimizer):
        return SimpleNamespace(
            accelerator=SimpleNamespace(scaler=None), deepspeed=SimpleNamespace(optimizer=SimpleNamespace(**optimizer))
        )

    assert compat.loss_scale(engine(loss_scale=256.0, cur_scale=256.0)) == 256.0  # ZeRO-1/2/3
    assert compat.loss_scale(engine(loss_scale=128.0)) == 128.0  # ZeRO-0 FP16_Optimizer
    assert compat.loss_scale(engine(cur_scale=64.0)) == 64.0
    assert compat.loss_scale(engine(loss_scale=None)) is None  # FP16_Optimizer without scaling; bf16


# ---------------------------------------------------------------- liger-kernel


def test_liger_instance_entry_point_and_the_qwen2_keywords_it_forwards():
    from liger_kernel.transformers import _apply_liger_kernel_to_instance
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    params = inspect.signature(_apply_liger_kernel_to_instance).parameters
    assert "model" in params and any(p.kind is p.VAR_KEYWORD for p in params.values())
    # Keywords the model type's function lacks are dropped silently: ours must be there by name.
    qwen2 = inspect.signature(MODEL_TYPE_TO_APPLY_LIGER_FN["qwen2"]).parameters
    assert {"model", "fused_linear_cross_entropy", "cross_entropy"} <= set(qwen2)
    assert qwen2["fused_linear_cross_entropy"].default is True  # what a dropped False would turn into


LIGER_ON_CPU = """
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2 import modeling_qwen2
from liger_kernel.transformers.rms_norm import LigerRMSNorm
from sftdoctor.train import compat
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1))
compat.apply_liger_kernels(model)
print("norm", model.model.norm.forward.__func__ is LigerRMSNorm.forward)
print("forward_replaced", "forward" in vars(model))
print("module_global", modeling_qwen2.Qwen2RMSNorm is LigerRMSNorm)
try:
    model(input_ids=torch.randint(0, 64, (1, 8)))
    print("forward ok")
except Exception as error:
    print("forward", type(error).__name__, error)
"""


def test_apply_liger_kernels_patches_qwen2_on_cpu_and_its_forward_needs_a_gpu():
    # In a child: liger also patches transformers' modeling_qwen2 module, which would leak into other tests.
    proc = python(LIGER_ON_CPU)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "norm True" in out  # the instance's RMSNorms now run liger's kernel
    assert "forward_replaced False" in out  # fused linear cross-entropy stayed off
    assert "module_global True" in out  # and the module-level class is replaced for the whole process
    # Triton has no CPU backend: the kernels fail at the first forward (why liger_kernel="auto" needs CUDA).
    assert re.search(r"forward RuntimeError .*active drivers", out), out


# ---------------------------------------------------------------- torch.distributed


@pytest.fixture
def gloo_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_default_store_is_none_outside_a_process_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(ValueError):  # what default_store() turns into None
        dist.distributed_c10d._get_default_store()
    assert compat.default_store() is None


def test_default_store_inside_a_one_process_gloo_group(gloo_group):
    store = compat.default_store()
    assert isinstance(store, gloo_group.Store)
    # The calls the hang reporter makes on it.
    store.set("sftdoctor/test", json.dumps({"rank": 0}))
    assert store.check(["sftdoctor/test"]) and json.loads(store.get("sftdoctor/test")) == {"rank": 0}
    assert store.add("sftdoctor/test/count", 1) == 1


def test_flight_recorder_dump_functions_of_this_build():
    import torch
    import torch.distributed as dist

    c10d = torch._C._distributed_c10d
    assert callable(c10d._dump_fr_trace)  # the generic recorder, in every build
    # ProcessGroupNCCL's own recorder: only where torch was built with NCCL (absent from the CPU wheel).
    assert hasattr(c10d, "_dump_nccl_trace") == dist.is_nccl_available()


def test_dump_flight_recorder_returns_the_pickled_trace(gloo_group):
    import torch

    gloo_group.all_reduce(torch.ones(2))
    data = compat.dump_flight_recorder("gloo")
    assert isinstance(data, bytes)
    trace = pickle.loads(data)
    assert {"version", "pg_config", "pg_status", "entries"} <= set(trace)
    if not gloo_group.is_nccl_available():  # the generic recorder, on by default, records Gloo's collectives
        assert "gloo:all_reduce" in [entry["profiling_name"] for entry in trace["entries"]]


def test_dump_flight_recorder_of_an_nccl_group_needs_the_nccl_recorder(gloo_group):
    assert (compat.dump_flight_recorder("nccl") is None) == (not gloo_group.is_nccl_available())


def test_process_groups_are_named_as_the_flight_recorder_names_them(gloo_group):
    import torch

    extra = gloo_group.new_group(backend="gloo")
    gloo_group.all_reduce(torch.ones(2), group=extra)
    groups = compat.process_groups()
    assert groups == {"0": [0], "1": [0]}
    entries = pickle.loads(compat.dump_flight_recorder("gloo"))["entries"]
    assert {e["process_group"][0] for e in entries[-1:]} <= set(groups)  # the names the entries carry


# ---------------------------------------------------------------- flight recorder environment names


def shared_library_has(name: str) -> bool:
    """Whether libtorch_cpu (where c10d's FlightRecorder.cpp is compiled) holds `name` as a C string."""
    path = module_file("torch", "lib", "libtorch_cpu.so")
    if path is None:
        pytest.skip("no torch/lib/libtorch_cpu.so (not a Linux wheel)")
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(name.encode() + b"\0") >= 0


def test_flight_recorder_env_uses_the_names_the_installed_torch_reads(tmp_path):
    env = compat.flight_recorder_env(tmp_path)
    header = module_file("torch", *C10D_INCLUDE, "FlightRecorder.hpp").read_text()
    nccl_header = module_file("torch", *C10D_INCLUDE, "ProcessGroupNCCL.hpp").read_text()
    # torch 2.13: the new buffer-size name, the old one still its fallback.
    assert re.search(r'\{"TORCH_FR_BUFFER_SIZE",\s*"TORCH_NCCL_TRACE_BUFFER_SIZE"\}', header)
    assert env == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "nccl-trace-rank-"),
    }
    assert "TORCH_FR_BUFFER_SIZE" in header
    assert '"TORCH_NCCL_DUMP_ON_TIMEOUT"' in nccl_header
    # No header names the dump file: FlightRecorder.cpp reads it, so look in the library.
    assert "TORCH_FR_DUMP_TEMP_FILE" not in header
    assert shared_library_has("TORCH_FR_DUMP_TEMP_FILE")


def test_flight_recorder_env_falls_back_to_the_old_names(tmp_path, monkeypatch):
    old = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "nccl-trace-rank-"),
    }
    monkeypatch.setattr(compat, "module_file", lambda *parts: None)  # torch before FlightRecorder.hpp
    assert compat.flight_recorder_env(tmp_path) == old
    older = tmp_path / "FlightRecorder.hpp"
    older.write_text('getCvarInt({"TORCH_NCCL_TRACE_BUFFER_SIZE"}, 0);')
    monkeypatch.setattr(compat, "module_file", lambda *parts: older)
    assert compat.flight_recorder_env(tmp_path) == old
    # torch 2.13 still reads the old names (the buffer size with a deprecation warning).
    assert shared_library_has("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") and shared_library_has("TORCH_NCCL_TRACE_BUFFER_SIZE")


RECORDED_ENTRIES = """
import pickle, torch, torch.distributed as dist
from sftdoctor.train import compat
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
print(len(pickle.loads(compat.dump_flight_recorder("gloo"))["entries"]))
dist.destroy_process_group()
"""


def test_the_buffer_size_name_really_switches_the_recorder(tmp_path):
    name = next(key for key in compat.flight_recorder_env(tmp_path) if key.endswith("BUFFER_SIZE"))
    proc = python(RECORDED_ENTRIES.format(port=free_port()), env={name: "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "0"  # 0 turns it off: torch reads this name


def test_rendezvous_key_is_where_torchruns_c10d_backend_keeps_its_state():
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from sftdoctor.facts.system import free_port

    store = TCPStore("127.0.0.1", free_port(), None, True, timedelta(seconds=10), wait_for_workers=False)
    assert not store.check([compat.rendezvous_key("run-7")])
    C10dRendezvousBackend(store, "run-7")  # what torchrun's agent on node 0 does at the first round
    assert store.check([compat.rendezvous_key("run-7")])


# ---------------------------------------------------------------- accelerate: FSDP2 without a GPU

FSDP_ON_CPU = """
import json, os, torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments
from trainrun import tiny_qwen2
from sftdoctor.train import compat
args = TrainingArguments(output_dir=os.environ["OUT"], use_cpu=True, report_to=[], max_steps=1,
                         per_device_train_batch_size=1, fsdp=True, fsdp_config={"version": 2})
rows = Dataset.from_list([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}] * 4)
trainer = Trainer(model=tiny_qwen2(), args=args, train_dataset=rows)
state = trainer.accelerator.state
before = [str(state.distributed_type), getattr(state, "fsdp_plugin", None) is not None]
turned_on = compat.fsdp_without_a_gpu(trainer)
trainer.train()
from accelerate.state import PartialState
after = [str(PartialState().distributed_type), trainer.accelerator.is_fsdp2, type(trainer.model_wrapped).__name__,
         sorted({type(p).__name__ for p in trainer.model.parameters()})]
if int(os.environ["RANK"]) == 0:
    print(json.dumps({"before": before, "turned_on": turned_on, "after": after}))
"""


@pytest.mark.slow  # two real ranks
def test_fsdp_without_a_gpu_turns_on_the_plugin_accelerate_drops_on_cpu_ranks(tmp_path):
    """accelerate 1.16 keeps the FSDP plugin only on accelerators: on 2 CPU ranks it drops it (the run would train
    as DDP); compat turns it on and the model trains sharded (DTensor parameters, FSDP's wrapper class)."""
    script = tmp_path / "fsdp_on_cpu.py"
    script.write_text(FSDP_ON_CPU)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            str(script),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OUT": str(tmp_path / "out"), "PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    assert said["before"] == ["DistributedType.MULTI_CPU", False], said  # accelerate dropped it: compat is needed
    assert said["turned_on"] is True
    assert said["after"][:2] == ["DistributedType.FSDP", True], said
    assert said["after"][2].startswith("FSDP") and said["after"][3] == ["DTensor"], said
