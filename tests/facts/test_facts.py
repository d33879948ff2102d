"""The Facts record: lazy probes, snapshots and replay. A replay with --config judges exactly like the
machine it was taken on: every fact derived from the run's configs is computed from the configs given
now, the machine's facts come from the snapshot, and a malformed snapshot is bad input."""

import json
import subprocess
import sys

import pytest
from conftest import FIXTURES, index, recorded_gpus, recorded_topology

from sftdoctor.checks import load_checks, run_checks
from sftdoctor.errors import InputError
from sftdoctor.facts import SCHEMA, Facts, Inputs, Overlay

GPU_FIXTURES = [e["file"] for e in index("nvidia_smi")]
LLAMA8B = FIXTURES / "model_config" / "Meta-Llama-3-8B.json"
QWEN = FIXTURES / "model_config" / "Qwen2-0.5B.json"


@pytest.fixture(scope="module")
def machine():
    """This machine's facts as `sftdoctor facts` records them (no config given)."""
    doc = json.loads(
        subprocess.run([sys.executable, "-m", "sftdoctor", "facts"], capture_output=True, text=True).stdout
    )
    assert doc["schema"] == SCHEMA
    return doc


def configs(tmp_path):
    """Two run configs that need no child process: a Llama-3-8B ZeRO-2 run and a Qwen2 DDP run in fp16."""
    (tmp_path / "d.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n' * 300
    )
    out = []
    for name, body in (
        (
            "llama",
            f'[model]\npath = "{LLAMA8B}"\n[data]\ntrain = "d.jsonl"\nmax_length = 4096\n'
            "[training]\nglobal_batch_size = 64\npacking = false\n[deepspeed]\nzero_stage = 2\n",
        ),
        (
            "qwen",
            f'[model]\npath = "{QWEN}"\nprecision = "fp16"\n[data]\ntrain = "d.jsonl"\n'
            "[training]\npacking = false\nper_device_batch_size = 3\n[launch]\nnproc_per_node = 2\n",
        ),
    ):
        (tmp_path / f"{name}.toml").write_text(body)
        out.append(tmp_path / f"{name}.toml")
    return out


def verdicts(facts):
    findings, skipped = run_checks(load_checks(plugins=False).phase("preflight"), facts)
    return [(f.id, f.severity.value, f.title) for f in findings], [(s.id, s.reason) for s in skipped]


@pytest.mark.parametrize("gpus", GPU_FIXTURES)
def test_a_replay_with_a_config_judges_like_the_machine(tmp_path, machine, gpus):
    recorded = {**machine["facts"], "gpus": recorded_gpus(gpus)}
    snapshot = tmp_path / "facts.json"
    snapshot.write_text(json.dumps({**machine, "facts": recorded}))
    for config in configs(tmp_path):
        live = Facts.replay(recorded, Inputs(config=config))  # the machine itself: its facts, the config read now
        replayed = Facts(Inputs(config=config, facts=snapshot))
        assert verdicts(replayed) == verdicts(live)
        _, skipped = verdicts(replayed)
        assert not [s for s in skipped if "not recorded" in s[1] or "no run config" in s[1]], skipped
        assert replayed.get("plan").world_size == (
            2 if "qwen" in config.name else max(1, len(recorded["gpus"]["devices"]))
        )


@pytest.mark.slow
def test_a_replay_live_on_this_machine_gives_the_same_verdicts(tmp_path):
    """The snapshot `sftdoctor facts` takes here, replayed with the tiny example, against the live check."""
    snapshot = tmp_path / "facts.json"
    snapshot.write_text(
        subprocess.run([sys.executable, "-m", "sftdoctor", "facts"], capture_output=True, text=True).stdout
    )
    config = FIXTURES.parents[1] / "examples" / "tiny.toml"
    assert verdicts(Facts(Inputs(config=config, facts=snapshot))) == verdicts(Facts(Inputs(config=config)))


def test_memory_fit_runs_on_a_replayed_gpu_box(tmp_path, machine):
    snapshot = tmp_path / "facts.json"
    snapshot.write_text(
        json.dumps(
            {
                **machine,
                "facts": {**machine["facts"], "gpus": recorded_gpus("h100_sxm_8x_driver550_modal_glossary.txt")},
            }
        )
    )
    llama = configs(tmp_path)[0]
    findings, _ = verdicts(Facts(Inputs(config=llama, facts=snapshot)))
    assert any(f[0] == "memory-fit" and "8.03B parameters on 8 GPUs" in f[2] for f in findings)


def test_a_check_json_document_is_accepted_as_a_snapshot(tmp_path):
    doc = json.loads(
        subprocess.run([sys.executable, "-m", "sftdoctor", "check", "--json"], capture_output=True, text=True).stdout
    )
    path = tmp_path / "check.json"
    path.write_text(json.dumps(doc))
    facts = Facts(Inputs(facts=path))
    assert facts.get("packages") == doc["facts"]["facts"]["packages"]
    findings, skipped = verdicts(facts)
    assert findings and not [s for s in skipped if s[0] == "torch-cuda-match"]


@pytest.mark.parametrize(
    "doc, says",
    [
        ({"schema": 99, "facts": {}}, "schema 99"),
        ({"schema": SCHEMA, "facts": {"gpuz": {}}}, "unknown fact (did you mean 'gpus'?)"),
        ({"schema": SCHEMA, "facts": {"gpus": ["A100"]}}, "facts.gpus: expected an object, got list"),
        ({"schema": SCHEMA, "facts": {"env": "CUDA_VISIBLE_DEVICES=0"}}, "facts.env: expected an object, got str"),
        ({"schema": SCHEMA}, "expected a JSON object with a 'facts' object"),
        (
            {"schema": SCHEMA, "facts": {"gpus": {"devices": "8x A100"}}},
            "facts.gpus.devices: expected a list, got '8x A100'",
        ),
        (
            {"schema": SCHEMA, "facts": {"gpus": {"devices": [{"memory_total_mib": "80GB"}]}}},
            "facts.gpus.devices[0].memory_total_mib: expected an integer >= 0 or null, got '80GB'",
        ),
        (
            {"schema": SCHEMA, "facts": {"gpus": {"devices": [{"compute_capability": 8.0}]}}},
            "facts.gpus.devices[0].compute_capability: expected a version string or null, got 8.0",
        ),
        (
            {"schema": SCHEMA, "facts": {"env": {"NCCL_IB_TIMEOUT": 22}}},
            "facts.env.NCCL_IB_TIMEOUT: expected a string or null, got 22",
        ),
        (
            {"schema": SCHEMA, "facts": {"packages": {"torch": 2.4}}},
            "facts.packages.torch: expected a string or null, got 2.4",
        ),
        # found by tests/test_cli_fuzz.py: checks that read these crashed instead
        (
            {
                "schema": SCHEMA,
                "facts": {"topology": {"devices": ["GPU0", "GPU1"], "links": {"GPU0": {"GPU1": ["NV18"]}}}},
            },
            "facts.topology.links.GPU0.GPU1: expected a string, got ['NV18']",
        ),
        (
            {"schema": SCHEMA, "facts": {"topology": {"devices": "GPU0 GPU1", "links": {}}}},
            "facts.topology.devices: expected a list",
        ),
        ({"schema": SCHEMA, "facts": {"topology": {}}}, "facts.topology.devices: missing"),
        (
            {"schema": SCHEMA, "facts": {"topology": {"devices": ["GPU0"], "links": {}, "incomplete": ["GPU1"]}}},
            "facts.topology.incomplete: expected an object",
        ),
        (
            {"schema": SCHEMA, "facts": {"flash_attn": {"installed": True, "wheel": 5}}},
            "facts.flash_attn.wheel: expected a string or null, got 5",
        ),
        (
            {"schema": SCHEMA, "facts": {"torch_build": {"version": "2.6.0+cu124", "cuda": True}}},
            "facts.torch_build.cuda: expected a version string or null, got True",
        ),
        ([1, 2], "expected a JSON object with a 'facts' object"),
    ],
)
def test_a_malformed_snapshot_is_bad_input_naming_what_is_wrong(tmp_path, doc, says):
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="facts.json") as err:
        Facts(Inputs(facts=path))
    assert says in str(err.value)
    proc = subprocess.run(
        [sys.executable, "-m", "sftdoctor", "check", "--facts", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_facts_derived_from_inputs_are_never_taken_from_a_snapshot(tmp_path, machine):
    stale = {**machine["facts"], "run": {"model": "elsewhere"}, "plan": {"world_size": 999}}
    path = tmp_path / "facts.json"
    path.write_text(json.dumps({**machine, "facts": stale}))
    facts = Facts(Inputs(facts=path))
    assert facts.get("plan") is None and "no run config given" in facts.why_missing("plan")


def test_a_recorded_topology_is_replayed_unless_a_file_is_given(tmp_path, machine):
    topo = recorded_topology("titanx_4x_dual_root_horovod969.txt")
    path = tmp_path / "facts.json"
    path.write_text(json.dumps({**machine, "facts": {**machine["facts"], "topology": topo}}))
    assert Facts(Inputs(facts=path)).get("topology")["source"] == topo["source"]
    given = Facts(Inputs(facts=path, topology=FIXTURES / "topology" / "titanx_4x_single_root_horovod969.txt"))
    assert given.get("topology")["source"] != topo["source"]


def test_an_overlay_replaces_some_facts_and_reads_the_rest():
    base = Facts.replay({"gpus": {"devices": []}, "packages": {"torch": "2.13.0"}})
    view = Overlay(base, gpus={"devices": [{"index": 0}]})
    assert view.get("gpus")["devices"] and view.get("packages") == {"torch": "2.13.0"}


def test_probes_run_once_and_only_for_what_is_asked(monkeypatch):
    calls = []
    facts = Facts()
    original = facts.probes["env"]
    monkeypatch.setitem(facts.probes, "env", type(original)(lambda f: calls.append(1) or {"A": "1"}))
    assert facts.get("env") == facts.get("env") == {"A": "1"} and calls == [1]
    assert "gpus" not in facts.collected()["facts"]


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=10,
)
DEVICE = st.fixed_dictionaries(
    {},
    optional={
        "index": JSON,
        "name": JSON,
        "compute_capability": JSON,
        "memory_total_mib": JSON,
        "nvlink_links_up": JSON,
        "uuid": JSON,
    },
)
FACT = st.fixed_dictionaries(
    {},
    optional={
        "gpus": st.fixed_dictionaries(
            {},
            optional={
                "devices": st.lists(DEVICE, max_size=3),
                "cuda_version": JSON,
                "driver_version": JSON,
                "error": JSON,
            },
        ),
        "torch_build": st.dictionaries(st.sampled_from(["version", "cuda", "hip"]), JSON, max_size=3),
        "env": st.dictionaries(st.sampled_from(["NCCL_IB_TIMEOUT", "CUDA_VISIBLE_DEVICES", "NCCL_P2P_DISABLE"]), JSON),
        "packages": st.dictionaries(st.sampled_from(["torch", "flash-attn", "deepspeed"]), JSON),
        "toolkit": st.dictionaries(st.sampled_from(["nvcc_version", "cuda_home"]), JSON),
        "flash_attn": st.dictionaries(
            st.sampled_from(["installed", "import_ok", "import_error", "version", "wheel"]), JSON
        ),
        "topology": st.fixed_dictionaries(
            {"devices": st.just(["GPU0", "GPU1"]), "links": st.just({"GPU0": {"GPU0": "X", "GPU1": "NV4"}})},
            optional={"incomplete": JSON},
        ),
        "rendezvous": st.dictionaries(st.sampled_from(["master_port", "in_use", "source", "error"]), JSON),
    },
)


@given(FACT)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_snapshot_is_refused_cleanly_or_judged_without_a_crashed_check(tmp_path, facts):
    path = tmp_path / "facts.json"
    path.write_text(json.dumps({"schema": SCHEMA, "facts": facts}))
    try:
        loaded = Facts(Inputs(facts=path))
    except InputError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        return
    findings, _ = verdicts(loaded)
    crashed = [f for f in findings if "crashed" in f[2] or "not a Finding" in f[2]]
    assert not crashed, crashed
