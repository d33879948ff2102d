"""Configs and matrices that contradict themselves (issue 40), through the real CLI (tests/cli_contract.py):

- a DeepSpeed JSON, a model config.json or a facts snapshot holding NaN, Infinity or -Infinity (or 1e400),
  which Python's json reads and the libraries would then train with: refused, naming the key path;
- a model config whose dtype is a number, a list or an 8-bit float no plan can price: refused naming the key,
  while a real fp8 checkpoint (DeepSeek's: a 16-bit dtype and quantization_config fp8) is judged;
- a `nvidia-smi topo -m` matrix that contradicts itself (GPU0->GPU1 NV4 but GPU1->GPU0 SYS, a diagonal
  that is not X, a row of another length, a row without its column): refused when the user gives it
  (--topology, a snapshot), a warning and no NVLink verdict when sftdoctor probed it itself;
- `plan` counts beyond any real machine (--gpus 1000000000): refused naming the option and its limit.
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
from pathlib import Path

import pytest
from cli_contract import ENV, sftdoctor
from conftest import FIXTURES, recorded_topology
from hostile import NON_FINITE_JSON, wrong_type
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sftdoctor import cli
from sftdoctor.errors import InputError, SftdoctorError, loads_finite
from sftdoctor.facts import SCHEMA
from sftdoctor.facts.configs import LOADABLE_DTYPES, read_json_object, summarize_model_config
from sftdoctor.facts.topology import contradiction, parse_topology
from sftdoctor.run.config import load_run_config
from sftdoctor.run.memory import SAVED_DTYPES

FUZZ = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
QWEN2 = json.loads((FIXTURES / "model_config" / "Qwen2-0.5B.json").read_text(encoding="utf-8"))
DEEPSPEED = sorted((FIXTURES / "deepspeed").glob("*.json"))
DEEPSPEED = [p for p in DEEPSPEED if p.name != "index.json"]
LITERALS = [*NON_FINITE_JSON, "1e400", "-1e400"]  # the last two: floats beyond the double range, read as inf


@pytest.fixture(autouse=True)
def _offline_without_plugins(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def key_path(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def at(doc, path: tuple):
    for step in path:
        doc = doc[step]
    return doc


def leaves(node, prefix=()):
    """Every path to a value that is not a container (the places a number may go)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, prefix + (i,))
    else:
        yield prefix


@st.composite
def with_non_finite(draw, base: dict):
    """(JSON text of `base` with one literal of LITERALS at a leaf or a new key, the key path, the literal)."""
    doc = copy.deepcopy(base)
    path = draw(st.sampled_from(sorted(leaves(doc), key=str)))
    if draw(st.booleans()):  # a key of its own beside the real ones, in the nearest object above the leaf
        path = path[:-1]
        while path and not isinstance(at(doc, path), dict):
            path = path[:-1]
        path += ("extra_value",)
    at(doc, path[:-1])[path[-1]] = "@@NON-FINITE@@"
    literal = draw(st.sampled_from(LITERALS))
    return json.dumps(doc, indent=1).replace('"@@NON-FINITE@@"', literal), key_path(path), literal


def refused_naming(result, *words: str) -> str:
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# ---------------------------------------------------------------- non-finite numbers in the JSON the user gives


def test_a_non_finite_literal_is_found_with_its_key_path():
    with pytest.raises(InputError) as caught:
        loads_finite('{"optimizer": {"params": {"lr": NaN, "betas": [0.9, 0.999]}}}', "ds.json")
    assert str(caught.value) == "ds.json: optimizer.params.lr: expected a finite number, got NaN"
    with pytest.raises(InputError, match=r"^x: a\[1\]\.b: expected a finite number, got -Infinity$"):
        loads_finite('{"a": [1, {"b": -Infinity}]}', "x")
    with pytest.raises(InputError, match=r"^x: c: expected a finite number, got 1e400$"):
        loads_finite('{"c": 1e400}', "x")
    with pytest.raises(InputError, match="the whole document"):
        loads_finite("Infinity", "x")
    assert loads_finite('{"lr": 1e-300, "big": 1e308, "n": 10}', "x") == {"lr": 1e-300, "big": 1e308, "n": 10}


@pytest.mark.parametrize("path", DEEPSPEED, ids=[p.name for p in DEEPSPEED])
def test_real_deepspeed_configs_and_their_auto_values_still_read(path):
    config = read_json_object(path, "DeepSpeed config")
    assert isinstance(config, dict)


@given(data=st.data())
@settings(max_examples=40, **FUZZ)
def test_a_deepspeed_json_with_nan_or_infinity_is_refused_naming_the_key(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("ds")
    base = json.loads(data.draw(st.sampled_from(DEEPSPEED), label="base").read_text(encoding="utf-8"))
    text, key, literal = data.draw(with_non_finite(base), label="text")
    path = root / "ds.json"
    path.write_text(text, encoding="utf-8")
    result = sftdoctor(["check", "--deepspeed", path, "--select", "deepspeed-precision"], root, [path])
    line = refused_naming(result, str(path))
    assert line == f"sftdoctor: error: {path}: {key}: expected a finite number, got {literal}"


@given(data=st.data())
@settings(max_examples=30, **FUZZ)
def test_a_model_config_with_nan_or_infinity_is_refused_naming_the_key(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("model")
    text, key, literal = data.draw(with_non_finite(QWEN2), label="text")
    path = root / "config.json"
    path.write_text(text, encoding="utf-8")
    result = sftdoctor(["check", "--model-config", root, "--select", "model-dtype"], root, [path])
    refused_naming(result, f"{path}: {key}: expected a finite number, got {literal}")


@given(data=st.data())
@settings(max_examples=15, **FUZZ)
def test_a_facts_snapshot_with_nan_or_infinity_is_refused_naming_the_key(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("snap")
    snapshot = {
        "sftdoctor": "0",
        "schema": SCHEMA,
        "host": "h",
        "facts": {
            "deepspeed_defaults": {"version": "0.19.8", "gradient_clipping": 1.0},
            "topology": recorded_topology("rtx3090_4x_nvlink_pairs_aikitoria_pr18.txt"),
        },
    }
    text, key, literal = data.draw(with_non_finite(snapshot), label="text")
    path = root / "facts.json"
    path.write_text(text, encoding="utf-8")
    result = sftdoctor(["check", "--facts", path, "--select", "gpu-topology"], root, [path])
    refused_naming(result, f"{path}: {key}: expected a finite number, got {literal}")


# ---------------------------------------------------------------- a model dtype no plan can price

FP8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "torch.float8_e4m3fn"]
UNPRICED = st.sampled_from([*FP8, "int8", "uint8", "bool", "complex64", "float4_e2m1fn_x2", "bfloat8", "BF16"])
BAD_DTYPES = (wrong_type("bfloat16") | UNPRICED).filter(lambda v: v is not None)  # null: no dtype recorded
DTYPE_KEYS = st.sampled_from(["torch_dtype", "dtype", "text_config.torch_dtype", "text_config.dtype"])


def model_folder(root: Path, config: dict) -> Path:
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (root / "d.jsonl").write_text('{"text": "a b c"}\n', encoding="utf-8")
    (root / "run.toml").write_text(
        '[model]\npath = "model"\nweights = "random"\n[data]\ntrain = "d.jsonl"\n[training]\npacking = false\n',
        encoding="utf-8",
    )
    return root / "model" / "config.json"


def with_dtype(key: str, value) -> dict:
    config = copy.deepcopy(QWEN2)
    if key.startswith("text_config."):
        config.pop("torch_dtype")  # the language part's dtype is read only when the model has none of its own
        config["text_config"] = {key.split(".")[1]: value}
    else:
        config[key] = value
    return config


@given(data=st.data())
@settings(max_examples=50, **FUZZ)
def test_a_dtype_no_plan_can_price_is_refused_naming_the_key(tmp_path_factory, data):
    """`check --model-config`, `check --config` and `plan` exit 2 on a dtype that is a number, a list, an object,
    a bool, an 8-bit float or another type, naming config.json, the key and the dtypes a plan prices."""
    root = tmp_path_factory.mktemp("dtype")
    key, value = data.draw(DTYPE_KEYS, label="key"), data.draw(BAD_DTYPES, label="value")
    path = model_folder(root, with_dtype(key, value))
    command = data.draw(
        st.sampled_from(
            [
                ["check", "--model-config", root / "model", "--select", "model-dtype"],
                ["check", "--config", root / "run.toml"],
                ["plan", root / "run.toml", "--gpu-memory", "80GiB"],
            ]
        ),
        label="command",
    )
    line = refused_naming(sftdoctor(command, root, [path]), f"{path}: {key}: expected one of")
    assert ", ".join(LOADABLE_DTYPES) in line
    assert ("quantization_config" in line) == ("float8" in str(value)), line


@pytest.mark.parametrize("value", [*LOADABLE_DTYPES, None])
def test_every_dtype_a_plan_prices_is_read(tmp_path, value):
    summary = summarize_model_config(tmp_path / "config.json", {**QWEN2, "torch_dtype": value})
    assert summary["dtype"] in (*SAVED_DTYPES, None)


@pytest.mark.parametrize("value", ["auto", "bf16", "torch.bfloat16"])
def test_a_dtype_name_transformers_cannot_load_is_refused(tmp_path, value):
    """What `train` would meet first: AutoConfig stops on these (pinned in tests/facts/test_configs.py)."""
    with pytest.raises(InputError, match=rf"torch_dtype: expected one of bfloat16, .*got \"{value}\" \(transformers"):
        summarize_model_config(tmp_path / "config.json", {**QWEN2, "torch_dtype": value})


# config.json of deepseek-ai/DeepSeek-R1 (the DeepSeek-V3 architecture, its fp8 weights as released): the dtype is
# bfloat16 and the fp8 format is declared in quantization_config, with the scales stored beside each weight.
DEEPSEEK_R1 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}


def test_a_real_fp8_checkpoint_is_judged_not_refused(tmp_path):
    path = model_folder(tmp_path, DEEPSEEK_R1)
    result = sftdoctor(["check", "--json", "--model-config", path, "--select", "model-dtype"], tmp_path, [path])
    assert result.exit_code == 0, result.stderr
    (finding,) = json.loads(result.stdout)["findings"]
    assert (finding["id"], finding["severity"], finding["evidence"]["dtype"]) == ("model-dtype", "ok", "bfloat16")


# ---------------------------------------------------------------- topology matrices that contradict themselves

CODES = ["NV1", "NV2", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"]


@st.composite
def matrices(draw):
    """(device names, a symmetric matrix of link codes with X on its diagonal) of 2-8 GPUs and 0-2 NICs."""
    gpus, nics = draw(st.integers(2, 8)), draw(st.integers(0, 2))
    names = [f"GPU{i}" for i in range(gpus)] + [f"NIC{i}" for i in range(nics)]
    codes = {}
    for i, a in enumerate(names):
        codes[(a, a)] = "X"
        for b in names[i + 1 :]:
            codes[(a, b)] = codes[(b, a)] = draw(st.sampled_from(CODES if b.startswith("GPU") else CODES[5:]))
    return names, codes


def render(names: list[str], codes: dict, header: list[str] | None = None, rows: list[str] | None = None) -> str:
    """As `nvidia-smi topo -m` prints it (tabs, affinity columns, the legends)."""
    header = names if header is None else header
    lines = ["\t" + "\t".join(header) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for a in names if rows is None else rows:
        cells = [codes.get((a, b), "") for b in header]
        cells = [f" {c} " if c == "X" else c for c in cells if c]
        lines.append("\t".join([a, *cells, *(["0-15", "0", "N/A"] if a.startswith("GPU") else ["", "", ""])]))
    lines += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks", ""]
    nics = [n for n in names if n.startswith("NIC")]
    if nics:
        lines += ["NIC Legend:", ""] + [f"  {n}: mlx5_{n[3:]}" for n in nics]
    return "\n".join(lines) + "\n"


@st.composite
def contradicting(draw):
    """(matrix text, the words its refusal must say) for one contradiction drawn into a symmetric matrix."""
    names, codes = draw(matrices())
    kind = draw(st.sampled_from(["asymmetric", "asymmetric", "diagonal", "x-off-diagonal", "short-row", "no-column"]))
    if kind == "asymmetric":
        i, j = sorted(draw(st.lists(st.integers(0, len(names) - 1), min_size=2, max_size=2, unique=True)))
        a, b = names[i], names[j]
        was = codes[(a, b)]
        now = draw(st.sampled_from([c for c in CODES if c != was]))
        if draw(st.booleans()):
            codes[(a, b)], was, now = now, now, was  # the upper or the lower triangle changed
        else:
            codes[(b, a)] = now
        return render(names, codes), [f"{a}/{b}", f"{a}->{b} is {was}", f"{b}->{a} is {now}"]
    if kind == "diagonal":
        a = draw(st.sampled_from(names))
        codes[(a, a)] = draw(st.sampled_from(CODES))
        return render(names, codes), [f"row {a} should have X in its own column"]
    if kind == "x-off-diagonal":
        i, j = sorted(draw(st.lists(st.integers(0, len(names) - 1), min_size=2, max_size=2, unique=True)))
        codes[(names[i], names[j])] = codes[(names[j], names[i])] = "X"
        return render(names, codes), [f"{names[i]}/{names[j]}", "is X"]
    if kind == "short-row":  # not the last row: a paste cut off at its end is read as incomplete, not refused
        a = draw(st.sampled_from(names[:-1]))
        del codes[(a, draw(st.sampled_from([b for b in names if b != a])))]
        return render(names, codes), [f"row {a} should have {len(names)} link codes"]
    gone = draw(st.sampled_from([n for n in names if n.startswith("GPU")][1:]))
    header = [n for n in names if n != gone]
    return render(names, codes, header=header), [f"row {gone} has no column in the header"]


def test_real_matrices_do_not_contradict_themselves():
    for path in sorted((FIXTURES / "topology").glob("*.txt")):
        topo = recorded_topology(path.name)
        assert contradiction(topo["links"]) is None, path.name


@given(data=st.data())
@settings(max_examples=80, **FUZZ)
def test_a_matrix_that_contradicts_itself_is_refused_naming_the_pair(tmp_path_factory, data):
    """`check --topology FILE`: refused in one line naming the file and the pair (or row) with both readings;
    the same matrix, symmetric, is judged."""
    root = tmp_path_factory.mktemp("topo")
    text, words = data.draw(contradicting(), label="matrix")
    path = root / "topo.txt"
    path.write_text(text, encoding="utf-8")
    result = sftdoctor(["check", "--topology", path, "--select", "gpu-topology"], root, [path])
    refused_naming(result, str(path), *words)


@given(matrix=matrices())
@settings(max_examples=30, **FUZZ)
def test_a_symmetric_matrix_is_judged(tmp_path_factory, matrix):
    root = tmp_path_factory.mktemp("topo")
    path = root / "topo.txt"
    path.write_text(render(*matrix), encoding="utf-8")
    result = sftdoctor(["check", "--topology", path, "--select", "gpu-topology"], root, [path])
    assert result.exit_code == 0, result.stderr
    gpus = [n for n in matrix[0] if n.startswith("GPU")]
    all_nvlink = all(matrix[1][(a, b)].startswith("NV") for a in gpus for b in gpus if a != b)
    assert ("✓  gpu-topology" in result.stdout) == all_nvlink, result.stdout


@given(matrix=matrices(), data=st.data())
@settings(max_examples=30, **FUZZ)
def test_a_snapshot_whose_matrix_contradicts_itself_is_refused_naming_the_pair(tmp_path_factory, matrix, data):
    root = tmp_path_factory.mktemp("snap")
    names, codes = matrix
    topo = {"source": "nvidia-smi topo -m", **parse_topology(render(names, codes))}
    a, b = sorted(data.draw(st.lists(st.sampled_from(names), min_size=2, max_size=2, unique=True)), key=names.index)
    was = topo["links"][a][b]
    topo["links"][b][a] = now = data.draw(st.sampled_from([c for c in CODES if c != was]), label="now")
    path = root / "facts.json"
    path.write_text(json.dumps({"sftdoctor": "0", "schema": SCHEMA, "host": "h", "facts": {"topology": topo}}))
    result = sftdoctor(["check", "--facts", path, "--select", "gpu-topology"], root, [path])
    refused_naming(result, f"{path}: facts.topology.links: {a}/{b}", f"{a}->{b} is {was}", f"{b}->{a} is {now}")


def fake_nvidia_smi(folder: Path, text: str) -> None:
    """An `nvidia-smi` first on PATH that prints `text` for `topo -m` and fails for anything else (no GPU query)."""
    folder.mkdir()
    (folder / "topo.txt").write_text(text, encoding="utf-8")
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n[ "$1 $2" = "topo -m" ] && exec cat "{folder / "topo.txt"}"\nexit 9\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("asymmetric", [True, False])
def test_a_probed_matrix_that_contradicts_itself_is_a_warning_and_no_verdict(tmp_path, monkeypatch, asymmetric):
    names = ["GPU0", "GPU1", "GPU2", "GPU3"]
    codes = {(a, b): "X" if a == b else "NV4" for a in names for b in names}
    if asymmetric:
        codes[("GPU2", "GPU1")] = "SYS"
    fake_nvidia_smi(tmp_path / "bin", render(names, codes))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    result = sftdoctor(["check", "--json", "--select", "gpu-topology"], tmp_path, [])
    assert result.exit_code == 0, result.stderr
    (finding,) = json.loads(result.stdout)["findings"]
    if asymmetric:
        assert finding["severity"] == "warning" and "contradicts itself" in finding["title"], finding
        assert "GPU1/GPU2" in finding["detail"] and "NVLink" in finding["title"], finding
    else:
        assert finding["severity"] == "ok" and "NVLink" in finding["title"], finding


def test_a_recorded_inconsistent_matrix_replays_as_the_same_warning(tmp_path):
    """What the probe recorded on the machine (`sftdoctor facts` there) is judged the same here, nothing from NVML."""
    topo = {
        "source": "nvidia-smi topo -m",
        "devices": [],
        "nics": {},
        "links": {},
        "inconsistent": "GPU1/GPU2: the matrix contradicts itself: GPU1->GPU2 is NV4 but GPU2->GPU1 is SYS",
    }
    gpus = {"devices": [{"index": i, "nvlink_links_up": 4} for i in range(4)]}
    path = tmp_path / "facts.json"
    snapshot = {"sftdoctor": "0", "schema": SCHEMA, "host": "h", "facts": {"topology": topo, "gpus": gpus}}
    path.write_text(json.dumps(snapshot))
    result = sftdoctor(["check", "--json", "--facts", path, "--select", "gpu-topology"], tmp_path, [path])
    (finding,) = json.loads(result.stdout)["findings"]
    assert finding["severity"] == "warning" and "GPU1/GPU2" in finding["detail"], finding


# ---------------------------------------------------------------- counts beyond any real machine


def huge_size(limit: int):
    units = {"TiB": 2**40, "TB": 10**12, "GiB": 2**30}
    return st.sampled_from(sorted(units)).flatmap(
        lambda unit: st.integers(limit // units[unit] + 1, 10**400).map(lambda n: f"{n}{unit}")
    )


@given(option=st.sampled_from(["--gpus", "--nodes", "--gpu-memory"]), data=st.data())
@settings(max_examples=25, **FUZZ)
def test_plan_counts_beyond_their_limit_are_refused_naming_the_option(tmp_path_factory, option, data):
    root = tmp_path_factory.mktemp("plan")
    config = model_folder(root, QWEN2)
    limit = {"--gpus": cli.MAX_GPUS_PER_NODE, "--nodes": cli.MAX_NODES}.get(option)
    value = data.draw(huge_size(cli.MAX_GPU_MEMORY) if limit is None else st.integers(limit + 1, 10**30), label="v")
    result = sftdoctor(["plan", root / "run.toml", "--gpu-memory", "80GiB", option, value], root, [option, config])
    refused_naming(result, f"'{option}'", "1024" if option == "--gpus" else "65536" if option == "--nodes" else "4 TiB")


def test_plan_counts_at_their_limit_are_taken(tmp_path):
    """At the limits the options are read; the refusal that follows is the config's, not theirs."""
    path = model_folder(tmp_path, with_dtype("torch_dtype", 16))
    result = sftdoctor(
        [
            "plan",
            tmp_path / "run.toml",
            "--gpus",
            cli.MAX_GPUS_PER_NODE,
            "--nodes",
            cli.MAX_NODES,
            "--gpu-memory",
            "4TiB",
        ],
        tmp_path,
        [path],
    )
    refused_naming(result, f"{path}: torch_dtype")


@pytest.mark.parametrize("key, limit", [("nproc_per_node", cli.MAX_GPUS_PER_NODE), ("nnodes", cli.MAX_NODES)])
def test_plans_limits_are_the_run_configs(tmp_path, key, limit):
    """--gpus and --nodes stand for [launch] nproc_per_node and nnodes: the same bounds."""
    option = next(p for p in cli.plan.params if p.name == {"nproc_per_node": "gpus_per_node"}.get(key, "nodes"))
    assert (option.type.min, option.type.max) == (1, limit)
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    for value, taken in ((limit, True), (limit + 1, False)):
        path = tmp_path / f"{value}.toml"
        extra = '\nmaster_port = 29500\nmaster_addr = "10.0.0.1"' if key == "nnodes" else ""
        path.write_text(f'[model]\npath = "m"\n[data]\ntrain = "d.jsonl"\n[launch]\n{key} = {value}{extra}\n')
        if taken:
            assert getattr(load_run_config(path).launch, key) == value
        else:
            with pytest.raises(SftdoctorError, match=re.escape(key)):
                load_run_config(path)


@pytest.mark.slow
def test_a_plan_at_the_limits_finishes_without_memory_growing_with_the_counts(tmp_path):
    """`plan --gpus 1000000000` built a GPU record per GPU and died of MemoryError after a minute; at the limits
    the plan is made in the time and memory of an 8-GPU one."""
    import resource

    model_folder(tmp_path, QWEN2)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = sftdoctor(
        [
            "plan",
            tmp_path / "run.toml",
            "--gpu-memory",
            "80GiB",
            "--gpus",
            cli.MAX_GPUS_PER_NODE,
            "--nodes",
            cli.MAX_NODES,
        ],
        tmp_path,
        [],
    )
    assert result.exit_code in (0, 1), result.stderr
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 512, grown_mib
