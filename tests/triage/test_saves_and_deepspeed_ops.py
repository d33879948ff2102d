"""Triage of three failure classes on real public logs (tests/fixtures/logs/index.json cites each): a save that ran
out of disk (disk-full), DeepSpeed's own batch assertion (batch-size) and DeepSpeed's op build without a CUDA toolkit
(torch-cuda-match); each pasted plain, as a markdown quote, wrapped at 80 columns, and quoted and wrapped."""

import io

import pytest
from triage.helpers import LOGS, by_file, diagnosis_of, log_bytes, problems, quoted, wrapped

from sftdoctor.triage import diagnose
from sftdoctor.triage.saves import batch_fix

MINE = [e for e in LOGS if e["file"].startswith(("disk-full-", "ds-batch-assertion-", "ds-cuda-home-missing-"))]


def pasted(text: str) -> dict[str, bytes]:
    return {
        "plain": text.encode(),
        "quoted": quoted(text).encode(),
        "wrapped": wrapped(text).encode(),
        "quoted+wrapped": quoted(wrapped(text)).encode(),
    }


def test_each_class_has_at_least_three_logs_from_different_projects():
    for prefix in ("disk-full-", "ds-batch-assertion-", "ds-cuda-home-missing-"):
        projects = {e["project"] for e in MINE if e["file"].startswith(prefix)}
        assert len(projects) >= 3, prefix


@pytest.mark.parametrize("entry", MINE, ids=by_file(MINE))
def test_the_root_cause_and_its_specifics(entry):
    diagnosis = diagnosis_of(entry["file"])
    [topic] = entry["expect"]
    assert diagnosis.root is not None and diagnosis.root.finding.id == topic
    found = problems(diagnosis)[topic]
    for key, value in entry["evidence"][topic].items():
        assert found.get(key) == value, (key, found)


@pytest.mark.parametrize("entry", MINE, ids=by_file(MINE))
@pytest.mark.parametrize("form", ["quoted", "wrapped", "quoted+wrapped"])
def test_a_pasted_log_is_diagnosed_the_same(entry, form):
    data = pasted(log_bytes(entry["file"]).decode())[form]
    diagnosis = diagnose(io.BytesIO(data))
    assert sorted(problems(diagnosis)) == sorted(entry["expect"])
    topic = entry["expect"][0]
    numbers = {k: v for k, v in entry["evidence"][topic].items() if k not in ("saving", "text")}
    assert {k: problems(diagnosis)[topic].get(k) for k in numbers} == numbers


def test_the_disk_full_finding_names_the_file_deepspeed_was_saving():
    [root, *_] = diagnosis_of("disk-full-unexpected-pos-openrlhf-ray-simplerl.log").findings
    assert root.finding.title.startswith("torch.save could not write data/0")
    assert root.finding.title.endswith(
        "while writing checkpoints/Qwen2.5-Math-1.5B_ppo_from_base_math_lv35/_actor/"
        "global_step12/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    assert "save_total_limit" in root.finding.fix


def test_shared_memory_errors_with_the_same_errno_are_not_a_full_checkpoint_disk():
    """NCCL's /dev/shm and the DataLoader's shared memory report errno 28 too (their own topics)."""
    log = (
        b"misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-3kT1 to 9637892 bytes: "
        b"No space left on device\n"
        b"RuntimeError: unable to write to file </torch_5845_4138295531>: No space left on device (28)\n"
    )
    assert "disk-full" not in problems(diagnose(io.BytesIO(log)))


def test_deepspeed_0_19_names_a_cuda_home_without_nvcc_too():
    """builder.py installed_cuda_version (0.19.8): f"Unable to run {nvcc}, unable to compile CUDA op(s): {err}"."""
    log = (
        b"deepspeed.ops.op_builder.builder.MissingCUDAException: Unable to run /usr/local/cuda/bin/nvcc, unable to "
        b"compile CUDA op(s): [Errno 2] No such file or directory: '/usr/local/cuda/bin/nvcc'\n"
    )
    finding = diagnose(io.BytesIO(log)).root.finding
    assert finding.id == "torch-cuda-match" and finding.title.endswith("Unable to run /usr/local/cuda/bin/nvcc")


@pytest.mark.parametrize(
    "numbers, says",
    [
        ((512, 2, 42, 6), "not a multiple of 2 per GPU x 6 ranks = 12: set train_batch_size to 504"),
        ((528, 2, 33, 4), "gradient_accumulation_steps should be 66"),
        ((4096, 128, 4, 1), "DeepSpeed saw world_size 1"),
    ],
)
def test_the_fix_says_which_batch_number_is_the_odd_one(numbers, says):
    assert says in batch_fix(*numbers)


def test_the_cuda_home_finding_quotes_the_exception_not_the_raise_statement_above_it():
    root = diagnosis_of("ds-cuda-home-missing-import-vixtts.log").root
    assert root.line == 3 and root.finding.evidence["text"].startswith("deepspeed.ops.op_builder.builder.MissingCUDA")
