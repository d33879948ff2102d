"""flash-attn and nccl-env."""

from conftest import NO_GPU, plan_of, recorded_gpus, run_of, severities
from sftdoctor.checks import Skipped

A100 = "a100_80g_pcie_4x_driver525_princeton.txt"
V100 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
# The ImportError of a flash-attn wheel built against another torch, as reported in
# https://github.com/X-PLUG/mPLUG-Owl/issues/192 (also Dao-AILab/flash-attention#931).
UNDEFINED = ("ImportError: /usr/local/lib/python3.10/dist-packages/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: "
             "undefined symbol: _ZN3c104cuda9SetDeviceEi")
FLASH_OK = {"installed": True, "version": "2.7.4.post1", "import_ok": True, "import_error": None}
FLASH_BROKEN = {"installed": True, "version": "2.7.4.post1", "import_ok": False, "import_error": UNDEFINED}
ASKED = plan_of(run_of(model={"attn_implementation": "flash_attention_2"}))


def test_flash_attn_importing_on_ampere_is_ok(run):
    findings = run("flash-attn", packages={"flash-attn": "2.7.4.post1"}, flash_attn=FLASH_OK, gpus=recorded_gpus(A100))
    assert severities(findings) == ["ok"]


def test_abi_mismatch_is_an_error_that_names_the_symbol(run):
    findings = run("flash-attn", packages={"flash-attn": "2.7.4.post1"}, flash_attn=FLASH_BROKEN, gpus=recorded_gpus(A100))
    assert severities(findings) == ["error"]
    assert "another torch version or C++ ABI" in findings[0].title and "_ZN3c104cuda9SetDeviceEi" in findings[0].detail


def test_flash_attn_on_v100_warns_and_errors_when_requested(run):
    base = dict(packages={"flash-attn": "2.7.4.post1"}, flash_attn=FLASH_OK, gpus=recorded_gpus(V100))
    assert severities(run("flash-attn", **base)) == ["warning"]
    findings = run("flash-attn", plan=ASKED, **base)
    assert severities(findings) == ["error"] and "Ampere" in findings[0].detail


def test_requested_but_not_installed_is_an_error(run):
    findings = run("flash-attn", packages={"flash-attn": None}, flash_attn={"installed": False},
                   gpus=recorded_gpus(A100), plan=ASKED)
    assert severities(findings) == ["error"] and "not installed" in findings[0].title


def test_not_installed_is_advice_on_ampere_and_nothing_elsewhere(run):
    args = dict(packages={"flash-attn": None}, flash_attn={"installed": False})
    assert severities(run("flash-attn", gpus=recorded_gpus(A100), **args)) == ["info"]
    assert isinstance(run("flash-attn", gpus=NO_GPU, **args), Skipped)


def test_deprecated_nccl_names_point_to_their_torch_names(run):
    findings = run("nccl-env", env={"NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_BLOCKING_WAIT": "0",
                                    "TORCH_NCCL_BLOCKING_WAIT": "1"})
    titles = [f.title for f in findings]
    assert "NCCL_ASYNC_ERROR_HANDLING=1 is deprecated; torch reads TORCH_NCCL_ASYNC_ERROR_HANDLING" in titles
    assert any("(set to 1, which wins)" in t for t in titles)
    assert any("blocking wait is on" in t for t in titles)


def test_risky_timeouts(run):
    assert severities(run("nccl-env", env={"NCCL_IB_TIMEOUT": "8"})) == ["warning"]
    assert severities(run("nccl-env", env={"NCCL_IB_TIMEOUT": "30"})) == ["warning"]
    assert severities(run("nccl-env", env={"NCCL_IB_TIMEOUT": "banana"})) == ["warning"]
    assert severities(run("nccl-env", env={"NCCL_IB_TIMEOUT": "22"})) == ["ok"]
    assert severities(run("nccl-env", env={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "10"})) == ["warning"]


def test_busy_port_from_the_run_config_is_an_error(run):
    busy = {"master_addr": "127.0.0.1", "master_port": 29500, "source": "run config [launch]", "in_use": True, "local": True}
    findings = run("nccl-env", env={}, rendezvous=busy)
    assert severities(findings) == ["error"] and "EADDRINUSE" in findings[0].detail
    assert severities(run("nccl-env", env={}, rendezvous={**busy, "source": "torchrun default"})) == ["warning"]
    assert severities(run("nccl-env", env={}, rendezvous={**busy, "in_use": False})) == ["ok"]


def test_a_busy_default_port_is_information_when_the_plan_moved_the_run_elsewhere(run):
    busy = {"master_addr": "127.0.0.1", "master_port": 29500, "source": "torchrun default", "in_use": True,
            "local": True, "free_port": 40001}
    two = plan_of(run_of(launch={"nproc_per_node": 2}), rendezvous=busy)
    [moved] = run("nccl-env", env={}, rendezvous=busy, plan=two)
    assert moved.severity.value == "info" and "uses port 40001" in moved.title
    [one] = run("nccl-env", env={}, rendezvous=busy, plan=plan_of(run_of(), rendezvous=busy))
    assert one.severity.value == "info" and "one process" in one.title


def test_the_port_probe_sees_a_real_listener(tmp_path):
    import socket

    from sftdoctor.facts import Facts, Inputs

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        config = tmp_path / "run.toml"
        (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
        config.write_text(f'[model]\npath = "m"\n[data]\ntrain = "d.jsonl"\n[launch]\nmaster_port = {port}\n')
        assert Facts(Inputs(config=config)).get("rendezvous")["in_use"] is True
    assert Facts(Inputs(config=config)).get("rendezvous")["in_use"] is False
