"""The `sftdoctor` command as a user runs it: exit codes, output, bad input."""

import contextlib
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

TOPO = FIXTURES / "topology"
DS = FIXTURES / "deepspeed"
MODELS = FIXTURES / "model_config"
LOGS = FIXTURES / "logs"


def sftdoctor(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "sftdoctor", *args], capture_output=True, text=True, input=stdin)


@pytest.fixture(scope="module")
def v100_snapshot(tmp_path_factory):
    """A facts snapshot of a 4x V100 box as `sftdoctor facts` writes it, with GPU facts recorded from a
    real `nvidia-smi` output and its topology from a real `nvidia-smi topo -m`."""
    from conftest import recorded_gpus

    proc = sftdoctor("facts", "--topology", str(TOPO / "titanx_4x_dual_root_horovod969.txt"))
    doc = json.loads(proc.stdout)
    doc["facts"]["gpus"] = recorded_gpus("v100_pcie_4x_driver470_cuda114_princeton.txt")
    doc["facts"]["torch_build"] = {"version": "2.4.1+cu118", "cuda": "11.8", "hip": None}
    doc["facts"]["toolkit"] = {"cuda_home": None, "found_by": None, "nvcc": None, "nvcc_version": None}  # no nvcc there
    path = tmp_path_factory.mktemp("snap") / "facts.json"
    path.write_text(json.dumps(doc))
    return path


def test_this_machine_without_gpus_passes():
    proc = sftdoctor("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch-cuda-match" in proc.stdout and "no NVIDIA GPU visible" in proc.stdout
    assert re.match(r"\d+ checks: 0 errors", proc.stdout.strip().splitlines()[-1])


def test_replayed_v100_with_bf16_deepspeed_fails_with_fixes_and_topics(tmp_path, v100_snapshot):
    proc = sftdoctor("check", "--facts", str(v100_snapshot), "--deepspeed", str(DS / "axolotl_zero3_bf16.json"))
    assert proc.returncode == 1
    assert "✗" in proc.stdout and "bf16-support" in proc.stdout and "lack bf16" in proc.stdout
    assert "fix:" in proc.stdout and "sftdoctor explain bf16-support" in proc.stdout
    assert re.fullmatch(
        r"\d+ checks: 1 error, \d+ warnings?, \d+ info, \d+ ok, \d+ skipped", proc.stdout.splitlines()[-1]
    )


def test_json_document_has_findings_facts_and_summary(v100_snapshot):
    proc = sftdoctor(
        "check", "--json", "--facts", str(v100_snapshot), "--model-config", str(MODELS / "Qwen2-0.5B.json")
    )
    doc = json.loads(proc.stdout)
    assert set(doc) >= {"findings", "skipped", "summary", "facts", "exit_code"}
    for finding in doc["findings"]:
        assert {"id", "severity", "title", "detail", "fix", "explain"} <= set(finding)
    assert doc["facts"]["facts"]["gpus"]["devices"][0]["name"] == "Tesla V100-PCIE..."
    assert doc["exit_code"] == proc.returncode


def test_a_replayed_snapshot_does_not_mix_in_this_machine(v100_snapshot):
    doc = json.loads(sftdoctor("check", "--json", "--facts", str(v100_snapshot), "--select", "torch-cuda-match").stdout)
    assert doc["findings"][0]["evidence"]["torch"]["version"] == "2.4.1+cu118"


def test_facts_snapshot_round_trips_through_check(tmp_path):
    snap = tmp_path / "facts.json"
    snap.write_text(sftdoctor("facts").stdout)
    direct = json.loads(sftdoctor("check", "--json").stdout)
    replayed = json.loads(sftdoctor("check", "--json", "--facts", str(snap)).stdout)
    assert [(f["id"], f["severity"], f["title"]) for f in direct["findings"]] == [
        (f["id"], f["severity"], f["title"]) for f in replayed["findings"]
    ]


def test_select_and_list():
    proc = sftdoctor("check", "--select", "nccl-env")
    assert "nccl-env" in proc.stdout and "torch-cuda-match" not in proc.stdout
    listing = sftdoctor("check", "--list").stdout
    assert all(
        i in listing
        for i in (
            "torch-cuda-match",
            "bf16-support",
            "gpu-topology",
            "model-dtype",
            "deepspeed-precision",
            "flash-attn",
            "nccl-env",
        )
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["check", "--select", "gpu-topolgy"], "did you mean 'gpu-topology'"),
        (["check", "--deepspeed", "/nonexistent/ds.json"], "/nonexistent/ds.json: DeepSpeed config not found"),
        (["check", "--topology", str(MODELS / "gpt2.json")], "no `nvidia-smi topo -m` matrix found"),
        (["check", "--facts", str(TOPO / "index.json")], "expected a JSON object with a 'facts' object"),
        (["facts", "--model-config", str(TOPO / "k40m_4x_soc_mlx4_tensorflow_gdr.txt")], "not valid JSON"),
        (["explain", "nan-los"], "no topic 'nan-los'"),
        (["explain", "--log", "/nonexistent/train.log"], "/nonexistent/train.log: cannot read the log: No such file"),
        (["explain", "--log", str(TOPO)], "cannot read the log: Is a directory"),
        (["explain", "nan-loss", "--log", "-"], "give a TOPIC or --log FILE, not both"),
        (["explain", "nan-los", "--json"], "no topic 'nan-los'"),
        (["check", "--distributed"], "--distributed runs under a launcher: torchrun"),
        (["check", "--bogus"], "sftdoctor check: No such option '--bogus'"),
        # click's own usage errors, one line like the rest, not its four (usage, hint, blank, error)
        (
            ["check", "--seconds", "abc"],
            "sftdoctor check: Invalid value for '--seconds': 'abc' is not a valid float range",
        ),
        (
            ["plan", "--mfu", "nan", "run.toml"],
            "sftdoctor plan: Invalid value for '--mfu': 'nan' is not a finite number",
        ),
        (["plan"], "sftdoctor plan: Missing argument 'CONFIG'. (see sftdoctor plan --help)"),
        (["trian"], "sftdoctor: No such command 'trian'"),
        (["explain", "--log", "-", "--jobs", "0"], "'-j' / '--jobs': 0 is not in the range x>=1"),
        (["check", "--seconds", "3"], "--seconds: goes with --distributed"),  # not silently ignored
        (
            ["train", "run.toml", "--drill", "nan-loss@\u00b2"],
            "--drill: expected nan-loss@STEP[:RANK]",
        ),  # '²'.isdigit()
        (["train", "run.toml", "--drill", ""], "--drill: expected nan-loss@STEP[:RANK]"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(args, says):
    proc = sftdoctor(*args)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("sftdoctor: error: ") and says in line


@pytest.mark.parametrize(
    "log, says",
    [
        (b"", "-: cannot triage the log: empty: there is nothing to triage"),
        (
            gzip.compress((LOGS / "gpu-negative-healthy-trl-dpo-logs.log").read_bytes()),
            "-: cannot triage the log: a gzip file, not a text log: decompress it first (zcat FILE",
        ),
        (bytes(range(256)) * 64, "-: cannot triage the log: binary data, not a text log"),
    ],
)
def test_a_log_that_cannot_be_read_as_text_is_refused_not_found_healthy(log, says):
    """A false "nothing recognised" (exit 0) on bytes that were never a log is the worst answer: refuse them."""
    proc = subprocess.run([sys.executable, "-m", "sftdoctor", "explain", "--log", "-"], input=log, capture_output=True)
    assert proc.returncode == 2 and proc.stdout == b""
    [line] = proc.stderr.decode().splitlines()
    assert line.startswith(f"sftdoctor: error: {says}")


def test_a_broken_run_config_lists_every_problem(tmp_path):
    config = tmp_path / "run.toml"
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    config.write_text(
        '[model]\npath = "x"\nprecision = "bf61"\n[data]\ntrain = "d.jsonl"\n[launch]\nmaster_port = 70000\n'
    )
    proc = sftdoctor("check", "--config", str(config))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"sftdoctor: error: {config}") for line in lines)
    assert "[model].precision: expected one of auto, bf16, fp16, fp32, got 'bf61'" in proc.stderr


def test_run_config_pulls_in_its_model_and_deepspeed_configs(tmp_path, v100_snapshot):
    config = tmp_path / "run.toml"
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    config.write_text(
        f'[model]\npath = "{MODELS / "Qwen2-0.5B.json"}"\nprecision = "fp16"\n'
        f'[deepspeed]\nconfig = "{DS / "FastChat_deepspeed_config_s2.json"}"\n'
        '[data]\ntrain = "d.jsonl"\n'
    )
    doc = json.loads(sftdoctor("check", "--json", "--facts", str(v100_snapshot), "--config", str(config)).stdout)
    checks = {f["id"].split("/")[0] for f in doc["findings"]}  # CHECK, or CHECK/message
    assert {"model-dtype", "deepspeed-precision", "bf16-support"} <= checks
    model = next(f for f in doc["findings"] if f["id"] == "model-dtype/bf16-as-fp16")
    assert model["severity"] == "warning" and "65504" in model["detail"]


def test_explain_prints_a_topic_and_lists_them():
    proc = sftdoctor("explain", "bf16-support")
    assert proc.returncode == 0 and "compute capability" in proc.stdout.lower()
    assert "bf16-support" in sftdoctor("explain", "--list").stdout


def test_explain_json_gives_a_topic_its_section_or_the_list_for_machines():
    doc = json.loads(sftdoctor("explain", "bf16-support", "--json").stdout)
    assert doc["topic"] == "bf16-support" and "bf16-support" in doc["checks"]
    assert "compute capability" in doc["text"].lower() and doc["summary"]
    listed = json.loads(sftdoctor("explain", "--list", "--json").stdout)["topics"]
    assert {"name": "bf16-support", "summary": doc["summary"]} in listed and len(listed) > 50
    section = json.loads(sftdoctor("explain", "bf16-support/mixed-gpus", "--json").stdout)
    assert section["topic"] == "bf16-support/mixed-gpus" and section["text"].startswith("### mixed-gpus")


def test_check_works_on_a_box_without_the_training_stack(tmp_path):
    """Only sftdoctor and its own light dependencies on the path: no torch, transformers, deepspeed."""
    import importlib.util
    from pathlib import Path

    for module in ("sftdoctor", "click", "pynvml"):
        origin = Path(importlib.util.find_spec(module).origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (tmp_path / source.name).symlink_to(source)
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from sftdoctor.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code, "check", "--json"], capture_output=True, text=True, cwd=tmp_path
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    torch = next(f for f in doc["findings"] if f["id"] == "torch-cuda-match/no-torch")
    assert torch["severity"] == "info" and "torch is not installed" in torch["title"]
    assert doc["facts"]["facts"]["packages"]["transformers"] is None


def test_explain_log_names_the_root_cause_first_and_exits_1():
    proc = sftdoctor("explain", "--log", str(LOGS / "dist-host-oom-sigkill-accelerate-axolotl.log"))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1] == "root cause: host-oom at line 8"
    assert "local rank 7 was killed with SIGKILL (exitcode -9)" in lines[2]
    assert "sftdoctor explain host-oom" in proc.stdout
    assert "ignored 7 cascade lines (closing-signal ×7)" in proc.stdout


def test_explain_log_reads_the_flight_recorder_dumps_beside_the_log(tmp_path):
    """A log that names no failure, beside the dumps of a hang: the dumps say which rank called what."""
    import shutil

    shutil.copytree(FIXTURES / "flight_recorder" / "gloo-desync-drill", tmp_path / "flight-recorder")
    (tmp_path / "train.log").write_text("step 2 loss 3.1\n")
    proc = sftdoctor("explain", "--log", str(tmp_path / "train.log"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1] == "root cause: nccl-timeout in the flight-recorder dumps beside the log"
    assert (
        "flight recorder: rank 1 called broadcast #31 on default_pg [[1048576]] Float where rank 0 called" in lines[2]
    )
    doc = json.loads(sftdoctor("explain", "--log", str(tmp_path / "train.log"), "--json").stdout)
    assert doc["findings"][0]["evidence"]["groups"][0]["other"]["1"]["collective"] == "broadcast"


def test_explain_log_without_dumps_beside_it_says_nothing_of_them(tmp_path):
    (tmp_path / "train.log").write_text("step 2 loss 3.1\n")
    proc = sftdoctor("explain", "--log", str(tmp_path / "train.log"))
    assert proc.returncode == 0 and "nothing recognised" in proc.stdout and "flight" not in proc.stdout


def test_explain_log_reads_stdin_and_prints_json_for_machines():
    text = (LOGS / "gpu-oom-new-format-llamafactory-multirank-rank7.log").read_text()
    proc = sftdoctor("explain", "--log", "-", "--json", stdin=text)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["log"] == "<stdin>" and doc["root_cause"] == "cuda-oom"
    first = doc["findings"][0]
    assert first["role"] == "root" and first["evidence"]["tried"] == "270.00 MiB" and first["evidence"]["rank"] == 7


def test_explain_log_of_a_healthy_run_exits_0_and_says_nothing_was_recognised():
    proc = sftdoctor("explain", "--log", str(LOGS / "gpu-negative-healthy-trl-dpo-logs.log"))
    assert proc.returncode == 0
    assert "nothing recognised" in proc.stdout


def test_explain_log_of_a_run_that_failed_for_no_known_reason_exits_1_and_says_so():
    """A real paste that ends in a traceback's frames (the NameError is only in the issue's title): a failure."""
    proc = sftdoctor(
        "explain", "--log", str(LOGS / "verdict-cut-traceback-frames-only-main-py-stable-diffusion.log"), "--json"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["verdict"], doc["failed"], doc["root_cause"]) == ("failed-unrecognised", True, None)
    assert doc["findings"][0]["id"] == "crash-log" and doc["findings"][0]["severity"] == "error"


def test_gpu_memory_sizes_parse_or_fail_cleanly():
    import click
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from sftdoctor.cli import Size

    assert Size().convert("80GiB", None, None) == 80 * 2**30
    assert Size().convert("40 GB", None, None) == 40 * 10**9
    assert Size().convert("81920MiB", None, None) == 80 * 2**30
    for nothing in ("0", "0GiB", "512KiB"):
        with pytest.raises(click.BadParameter, match="less than 1 MiB"):
            Size().convert(nothing, None, None)

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=20))
    def anything(text):
        with contextlib.suppress(click.BadParameter):
            assert Size().convert(text, None, None) >= 2**20

    anything()


@pytest.mark.parametrize(
    "option, value", [("--mfu", "nan"), ("--peak-tflops", "inf"), ("--tokens-per-second", "nan"), ("--gpu-memory", "0")]
)
def test_plan_refuses_numbers_that_mean_nothing(tmp_path, option, value):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "run.toml").write_text(
        f'[model]\npath = "{MODELS / "Meta-Llama-3-8B.json"}"\n[data]\ntrain = "d.jsonl"\n'
    )
    proc = sftdoctor("plan", str(tmp_path / "run.toml"), "--gpu-memory", "80GiB", option, value)
    assert proc.returncode == 2 and option in proc.stderr and "Traceback" not in proc.stderr


def test_a_light_install_names_the_extra_to_install(tmp_path):
    """As after `pip install -e .`: only sftdoctor and its light dependencies on the path."""
    import importlib.util

    for module in ("sftdoctor", "click", "pynvml"):
        origin = Path(importlib.util.find_spec(module).origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (tmp_path / source.name).symlink_to(source)
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "run.toml").write_text(f'[model]\npath = "{MODELS / "gpt2.json"}"\n[data]\ntrain = "d.jsonl"\n')
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from sftdoctor.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code, "train", "run.toml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "needs torch, which is not installed" in proc.stderr and "pip install 'sftdoctor[train]'" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()
