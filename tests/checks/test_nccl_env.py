"""nccl-env: deprecated NCCL variables, risky timeouts, and a busy rendezvous port."""

from conftest import plan_of, run_of, severities


def test_deprecated_nccl_names_point_to_their_torch_names(run):
    findings = run(
        "nccl-env", env={"NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_BLOCKING_WAIT": "0", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    )
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
    busy = {
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "source": "run config [launch]",
        "in_use": True,
        "local": True,
    }
    findings = run("nccl-env", env={}, rendezvous=busy)
    assert severities(findings) == ["error"] and "EADDRINUSE" in findings[0].detail
    assert severities(run("nccl-env", env={}, rendezvous={**busy, "source": "torchrun default"})) == ["warning"]
    assert severities(run("nccl-env", env={}, rendezvous={**busy, "in_use": False})) == ["ok"]


def test_a_busy_default_port_is_information_when_the_plan_moved_the_run_elsewhere(run):
    busy = {
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "source": "torchrun default",
        "in_use": True,
        "local": True,
        "free_port": 40001,
    }
    two = plan_of(run_of(launch={"nproc_per_node": 2}), rendezvous=busy)
    [moved] = run("nccl-env", env={}, rendezvous=busy, plan=two)
    assert moved.severity.value == "info" and "uses port 40001" in moved.title
    [one] = run("nccl-env", env={}, rendezvous=busy, plan=plan_of(run_of(), rendezvous=busy))
    assert one.severity.value == "info" and "one process" in one.title
