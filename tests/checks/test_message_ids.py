"""One message, one id: a check that says several different things gives each its own id under the check's
(`nccl-env/port-busy`, as pylint's symbols), declared in `@check(messages=...)`, so that a user can select or
silence one message and keep the others."""

import ast
import math
from pathlib import Path

import pytest
from conftest import plan_of, recorded_gpus, recorded_topology, run_of

from sftdoctor import kb
from sftdoctor.checks import load_checks

CHECKS = Path(__file__).resolve().parents[2] / "sftdoctor" / "checks"
V100 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
A100 = "a100_80g_pcie_4x_driver525_princeton.txt"
BUSY = {"master_addr": "127.0.0.1", "master_port": 29500, "source": "torchrun default", "in_use": True, "local": True}
CALM = [2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 2.02, 1.98, 2.01]


def precision(name, gpus=None):
    return plan_of(run_of(model={"precision": name}), gpus=recorded_gpus(gpus) if gpus else {"devices": []})


def curves(**series):
    """A run logged every 10 steps, as tests/checks/test_curves.py shapes one."""
    return {
        "path": "runs/synthetic",
        "schedule": None,
        "max_grad_norm": 1.0,
        "precision": "bf16",
        "checkpoints": [],
        "series": {k: {"steps": [10 * (i + 1) for i in range(len(v))], "values": list(v)} for k, v in series.items()},
    }


# check -> [(its facts, the sub-id expected, a phrase of that message's title)]: each a different message.
CASES = {
    "nccl-env": [
        (lambda: {"env": {"NCCL_ASYNC_ERROR_HANDLING": "1"}}, "deprecated", "is deprecated; torch reads"),
        (lambda: {"env": {"NCCL_IB_TIMEOUT": "8"}}, "ib-timeout", "is very short"),
        (lambda: {"env": {"NCCL_IB_TIMEOUT": "30"}}, "ib-timeout", "is very long"),  # one message, two values
        (lambda: {"env": {"NCCL_IB_TIMEOUT": "banana"}}, "ib-timeout", "outside NCCL's range"),
        (lambda: {"env": {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "10"}}, "heartbeat-short", "is very short (default"),
        (lambda: {"env": {"TORCH_NCCL_BLOCKING_WAIT": "1"}}, "blocking-wait", "blocking wait is on"),
        (lambda: {"env": {}, "rendezvous": {"error": "MASTER_PORT='x': not a number"}}, "port-invalid", "MASTER_PORT"),
        (lambda: {"env": {}, "rendezvous": BUSY}, "port-busy", "is already taken"),
        (lambda: {"env": {}, "rendezvous": {**BUSY, "source": "run config [launch]"}}, "port-busy", "already taken"),
        (
            lambda: {"env": {}, "rendezvous": BUSY, "plan": plan_of(run_of(), rendezvous=BUSY)},
            "port-moved",
            "no rendezvous: one process",
        ),
    ],
    "bf16-support": [
        (lambda: {"gpus": recorded_gpus(V100), "plan": precision("bf16", V100)}, "bf16-unsupported", "lack bf16"),
        (lambda: {"gpus": recorded_gpus(V100)}, "no-bf16", "have no bf16 or tf32"),
        (lambda: {"gpus": recorded_gpus(A100), "plan": precision("fp16", A100)}, "fp16-on-bf16-gpus", "although"),
    ],
    "gpu-topology": [
        (
            lambda: {"topology": recorded_topology("rtx3090_4x_nvlink_pairs_aikitoria_pr18.txt")},
            "pcie",
            "NVLink islands",
        ),
        (
            lambda: {"topology": recorded_topology("dgx1_8xv100_sxm2_oneflow_dlperf.txt")},
            "partial-nvlink",
            "partial NVLink",
        ),
        (
            lambda: {
                "topology": recorded_topology("dgx_a100_8x_mlx5_gengwg.txt"),
                "env": {"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "LOC"},
            },
            "p2p-disabled",
            "NCCL_P2P_DISABLE is set",
        ),
        (
            lambda: {"topology": recorded_topology("dgx_a100_8x_mlx5_gengwg.txt"), "env": {"NCCL_P2P_LEVEL": "LOC"}},
            "p2p-level",
            "disables peer-to-peer everywhere",
        ),
    ],
    "loss-spike": [
        (lambda: {"log_stats": {"step": 2, "loss": 42.4, "history": [5.77]}}, "diverging", "loss diverging"),
        (lambda: {"log_stats": {"step": 100, "loss": 4.0, "history": CALM}}, "spike", "loss spike at step 100"),
    ],
    "fp16-loss-scale": [
        (
            lambda: {"scale_stats": {"step": 400, "scale": 1.0, "skipped": 40, "window": 100}},
            "stuck-at-minimum",
            "stuck at its minimum",
        ),
        (
            lambda: {"scale_stats": {"step": 400, "scale": 512.0, "skipped": 70, "window": 100}},
            "skipping",
            "skipped 70 of the last 100",
        ),
    ],
    "loss-plateau": [
        (lambda: {"curves": curves(loss=[2.3] * 20 + [math.nan])}, "non-finite", "is non-finite"),
        (lambda: {"curves": curves(loss=[2.3 + 0.01 * math.sin(i) for i in range(40)])}, "flat", "stayed flat"),
    ],
    "collective-correctness": [
        (lambda: {"cluster": {"missing": [1], "bound_s": 30}}, "rank-missing", "did not join"),
        (lambda: {"cluster": {"sweep": {"error": "timed out"}}}, "unfinished", "did not finish"),
        (lambda: {"cluster": {"sweep": {"wrong_ranks": [1], "groups": []}}}, "wrong-sums", "sums were wrong"),
    ],
}


@pytest.mark.parametrize("check_id", sorted(CASES))
def test_each_message_of_a_check_carries_its_own_declared_id(run, registry, check_id):
    """Each different message is told apart by its id alone: its declared sub-id, and no other message's."""
    declared = registry.checks[check_id].messages
    by_id: dict[str, set[str]] = {}
    for facts, slug, phrase in CASES[check_id]:
        [said] = [f for f in run(check_id, **facts()) if phrase in f.title]
        assert slug in declared, (check_id, slug)
        assert said.id == f"{check_id}/{slug}", (phrase, said.id)
        by_id.setdefault(said.id, set()).add(slug)
    assert all(len(slugs) == 1 for slugs in by_id.values()), by_id
    assert len(by_id) == len({slug for _, slug, _ in CASES[check_id]})


def test_a_message_with_no_finding_of_its_own_kind_keeps_the_checks_id(run):
    """ok findings (and a check that says one thing) keep the check's own id."""
    [fine] = run("nccl-env", env={"NCCL_IB_TIMEOUT": "22"})
    assert fine.severity.value == "ok" and fine.id == "nccl-env"
    [nan] = run("nan-loss", step_stats={"step": 3, "finite": False, "lr": 1e-5, "precision": "bf16"})
    assert nan.id == "nan-loss"


# ---------------------------------------------------------------- every built-in check, read from its source

SEVERITIES = {"info", "warning", "error", "severity", "Finding"}


def _finding_calls(tree: ast.Module):
    """(the top-level function it is in, the call) for each non-ok finding made in a module."""
    for top in tree.body:
        for node in ast.walk(top):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            names = {func.id} if isinstance(func, ast.Name) else set()
            if isinstance(func, ast.IfExp) and isinstance(func.body, ast.Name) and isinstance(func.orelse, ast.Name):
                names = {func.body.id, func.orelse.id}
            if names and names <= SEVERITIES:
                yield getattr(top, "name", ""), node


def _ids():
    """(module, function, the id given: a str, or an ast.JoinedStr, or None) of every non-ok finding."""
    for path in sorted(CHECKS.glob("[!_]*.py")):
        for function, call in _finding_calls(ast.parse(path.read_text())):
            given = next((k.value for k in call.keywords if k.arg == "id"), None)
            yield path.name, function, given.value if isinstance(given, ast.Constant) else given


# The checks that say one thing: their findings keep the check's id.
ONE_MESSAGE = {"nan_loss", "nccl_timeout"}


def test_every_non_ok_finding_of_a_built_in_check_names_its_message():
    """A new warning without `id=CHECK/slug` fails here, whichever check it is in."""
    unnamed = [f"{module}:{function}" for module, function, given in _ids() if given is None]
    assert {name.split(":")[1] for name in unnamed} <= ONE_MESSAGE, unnamed


def test_every_literal_id_is_a_declared_message_and_every_message_is_said():
    checks = load_checks(plugins=False).checks
    said: dict[str, set[str]] = {check: set() for check in checks}
    dynamic, anywhere = set(), set()  # checks whose slugs are computed; slugs said by a helper of several checks
    for _, _, given in _ids():
        if isinstance(given, str):
            check, _, slug = given.partition("/")
            assert check in checks and slug in checks[check].messages, given
            said[check].add(slug)
        elif isinstance(given, ast.JoinedStr):
            head, tail = given.values[0], given.values[-1]
            if isinstance(head, ast.Constant):
                dynamic.add(head.value.split("/")[0])
            elif isinstance(tail, ast.Constant):
                anywhere.add(tail.value.lstrip("/"))
    for check, spec in checks.items():
        if check not in dynamic:
            assert set(spec.messages) <= said[check] | anywhere, (check, set(spec.messages) - said[check])


def test_a_message_that_points_to_a_section_of_its_topic_finds_it():
    """`explain="nccl-env#port-busy"`: the topic has a `### port-busy` section (`sftdoctor explain nccl-env/port-busy`
    prints it alone)."""
    topics = {t.name: t for t in kb.topics()}
    pointers = []
    for path in CHECKS.glob("[!_]*.py"):
        for _, call in _finding_calls(ast.parse(path.read_text())):
            pointers += [
                k.value.value for k in call.keywords if k.arg == "explain" and isinstance(k.value, ast.Constant)
            ]
    sections = [p for p in pointers if "#" in p]
    assert sections  # nccl-env's messages point to their causes
    for pointer in sections:
        topic, section = pointer.split("#")
        assert section in kb.sections(topics[topic].body), pointer
