"""The real CLI, in-process, on broken and odd inputs of every kind it reads.

For every generated input, each command must give a verdict (exit 0 or 1) or refuse the input (exit 2):
no uncaught exception and no traceback; a refusal is one or more lines "sftdoctor: error: ...", each
naming the file at fault; nothing is left behind in the example's folder, and no child process survives
the command. `check` runs with --json, so that a check that crashed or a probe that failed (both swallowed
into the report by design: "a probe bug must not sink the suite") is seen too: on bad input either one
means the input was not judged.

Inputs are the real ones mutated: the bundled example's run config, the tiny model's config.json and
tokenizer (conftest's `tiny_data`), DeepSpeed JSONs and `nvidia-smi topo -m` outputs from tests/fixtures,
and the facts snapshot `sftdoctor facts` takes of this machine.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest
from cli_contract import ENV, RUNNER, sftdoctor
from conftest import FIXTURES, index, recorded_gpus, recorded_topology
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sftdoctor.checks import load_checks
from sftdoctor.cli import main
from sftdoctor.facts.catalogue import CATALOGUE
from sftdoctor.facts.shapes import SHAPES
from sftdoctor.run.config import SECTIONS, keys
from sftdoctor.run.shape import GATED_MLP, NEEDED

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# 25-50 s on two cores, most of it in DeepSpeed's child processes (seconds each) and `plan`'s meta-device count.
pytestmark = pytest.mark.slow

HUGE_LITERAL = "9" * 4400  # more digits than int() converts (sys.int_info.default_max_str_digits)
CRASHED = re.compile(r"crashed: |not a Finding")
PROBE_FAILED = re.compile(r"probe \w+ failed")
FUZZ = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
}


@pytest.fixture(scope="module", autouse=True)
def _offline_without_plugins():
    with pytest.MonkeyPatch.context() as mp:
        for name, value in ENV.items():
            mp.setenv(name, value)
        yield


# ---------------------------------------------------------------- what every command must do


def judged(result) -> dict | None:
    """`check --json` that gave a verdict: one JSON document of it, no check crashed, no probe failed."""
    if result.exit_code == 2:
        return None
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == result.exit_code
    crashed = [f["title"] for f in doc["findings"] if CRASHED.search(f["title"])]
    assert not crashed, crashed
    failed = {k: v for k, v in doc["facts"]["unavailable"].items() if PROBE_FAILED.search(v)}
    assert not failed, failed
    return doc


def no_crash_in(text: str) -> None:
    assert not CRASHED.search(text) and not PROBE_FAILED.search(text), text[-3000:]


def every_path(root: Path) -> list[Path]:
    """Every file and folder of an example: a refusal must name one of them."""
    return sorted(root.rglob("*"), key=lambda p: -len(str(p)))


# ---------------------------------------------------------------- shared strategies

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
NAME = TEXT  # keys, sections, fact names: line breaks in them too
ODD_NUMBERS = st.sampled_from(
    [
        0,
        -1,
        1,
        2,
        3,
        7,
        2**16,
        2**31,
        2**32,
        2**63 - 1,
        -(2**63),
        2**64,
        10**30,
        10**100,
        0.0,
        -0.0,
        0.5,
        1e-9,
        5e-324,
        1e308,
        -1e308,
        math.nan,
        math.inf,
        -math.inf,
    ]
)
ODD_STRINGS = st.sampled_from(
    [
        "",
        " ",
        "auto",
        "none",
        "null",
        "true",
        "false",
        "0",
        "-1",
        "1e400",
        "NaN",
        "inf",
        "bf16",
        "fp16",
        "cpu",
        "gpu",
        "two",
        "stage3",
        "\n",
        "\u2028",
        "ü",
        "\x00",
        "a" * 300,
    ]
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT | ODD_NUMBERS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(NAME, children, max_size=3),
    max_leaves=8,
)


def one_in(n: int):
    """True about once in `n` draws (hypothesis draws the low end of st.integers far more often than that)."""
    return st.sampled_from([False] * (n - 1) + [True])


def constants(values: list):
    """One of `values`, a fresh copy each time (the mutations change the containers they are given)."""
    return st.sampled_from(values).map(copy.deepcopy)


ODD_JSON = st.one_of(
    ODD_NUMBERS,
    ODD_STRINGS,
    st.integers(),
    st.floats(),
    TEXT,
    st.booleans(),
    st.none(),
    JSONISH,
    constants([[], [None], [1, "a"], {}, {"": None}, {"enabled": True}]),
)


def misspelt(word: str):
    """A near miss of `word`: a letter dropped, doubled, swapped or changed, another case, a suffix."""
    if not word:
        return NAME
    return st.tuples(
        st.integers(0, len(word) - 1),
        st.sampled_from(["drop", "double", "swap", "change", "case", "s"]),
        st.sampled_from("aeiou_-. 0Z"),
    ).map(lambda t: _misspell(word, *t))


def _misspell(word: str, i: int, how: str, letter: str) -> str:
    if how == "drop":
        return word[:i] + word[i + 1 :]
    if how == "double":
        return word[:i] + word[i] + word[i:]
    if how == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if how == "case":
        return word.upper()
    if how == "s":
        return word + "s"
    return word[:i] + letter + word[i + 1 :]


def _paths(node, prefix=()):
    """Every path in a JSON document, the root's () first, each container's before its children's."""
    yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        yield from _paths(value, prefix + (key,))


def _at(doc, path):
    for step in path:
        doc = doc[step]
    return doc


def _new_key(names):
    return NAME if names is None else names | names.flatmap(misspelt) | NAME


@st.composite
def mutated_json(draw, base, values=ODD_JSON, names=None, max_ops: int = 3):
    """`base` (a JSON tree) with 1-3 of: a value replaced (wrong type, nan, huge), a key deleted, renamed
    (misspelt) or added, a value wrapped in a list. `names`: keys worth adding (misspellings are drawn too)."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, max_ops))):
        depth = draw(st.sampled_from([1, 2, 3, 4, 99]))  # the big trees' leaves would crowd out their keys
        path = draw(st.sampled_from([p for p in _paths(doc) if len(p) <= depth]))
        node = _at(doc, path)
        how = draw(st.sampled_from(["set", "set", "set", "delete", "rename", "add", "wrap"]))
        if not path:
            if how == "set" and draw(one_in(10)):
                doc = draw(values)  # not an object at all
            elif isinstance(doc, dict):
                doc[draw(_new_key(names))] = draw(values)
            continue
        parent, last = _at(doc, path[:-1]), path[-1]
        if how == "set":
            parent[last] = draw(values)
        elif how == "delete":
            del parent[last]
        elif how == "rename" and isinstance(parent, dict):
            parent[draw(misspelt(last))] = parent.pop(last)
        elif how == "add" and isinstance(node, dict):
            node[draw(_new_key(names))] = draw(values)
        elif how == "add" and isinstance(node, list):
            node.append(draw(values))
        else:
            parent[last] = [node]
    return doc


def broken_text(base: str):
    """Text derived from a real file: cut short, a line dropped or repeated, a slice spliced elsewhere, junk put in."""

    def cut(at):
        return base[:at]

    def drop(i):
        lines = base.splitlines(keepends=True)
        return "".join(lines[:i] + lines[i + 1 :])

    def repeat(i):
        lines = base.splitlines(keepends=True)
        return "".join(lines[: i + 1] + lines[i:])

    def splice(a, b, at):
        a, b = sorted((a, b))
        return base[:at] + base[a:b] + base[at:]

    def insert(at, junk):
        return base[:at] + junk + base[at:]

    n, lines = len(base), max(1, len(base.splitlines()))
    return st.one_of(
        st.integers(0, n).map(cut),
        st.integers(0, lines - 1).map(drop),
        st.integers(0, lines - 1).map(repeat),
        st.tuples(st.integers(0, n), st.integers(0, n), st.integers(0, n)).map(lambda t: splice(*t)),
        st.tuples(st.integers(0, n), JUNK).map(lambda t: insert(*t)),
    )


# Put into a quoted name, U+0085, U+2028 and U+2029 are valid TOML and JSON, and line breaks to str.splitlines();
# a name longer than a file name may be is ENAMETOOLONG .
JUNK = st.text(max_size=20) | ODD_STRINGS


def random_bytes():
    """Text or bytes with no structure: binary, any text, a BOM, an empty file."""
    return st.one_of(
        st.binary(max_size=300),
        st.text(max_size=300).map(str.encode),
        st.sampled_from(
            [
                b"",
                b"\xef\xbb\xbf",
                b"\xff\xfe\x00",
                b"\x00" * 16,
                b"{}",
                b"[]",
                b"null",
                b'{"a": 1, "a": 2}',
                b'{"a": 1} // comment',
                b'{"a": 1,}',
                b'"text"',
            ]
        ),
    )


def unconvertible():
    """What int() or the parsers' recursion cannot take."""
    return st.sampled_from(["[" * 3000 + "]" * 3000, '{"a": ' * 3000 + "1" + "}" * 3000, HUGE_LITERAL])


def broken_bytes(text, around):
    """A file's bytes broken one of three ways: `text` (a strategy of its text, broken), bytes of no structure, or
    a value no parser can take (`unconvertible`) put in a file by `around` (value -> text)."""
    return text.map(str.encode) | random_bytes() | unconvertible().map(lambda v: around(v).encode())


def lone_surrogates():
    """A JSON string escape of half a UTF-16 pair: valid JSON, not text."""
    return st.just('{"text": "a\\udb3fb"}')


# ---------------------------------------------------------------- the inputs every example starts from


@pytest.fixture(scope="module")
def tiny_model(tiny_data) -> Path:
    """The tiny example's model folder: a 2-layer Qwen2 config.json and its trained tokenizer with a chat template."""
    return tiny_data["messages"] / "model"


def new_example(tmp_path_factory, tiny_model: Path, kind: str, rows: int = 8) -> Path:
    root = tmp_path_factory.mktemp(kind)
    shutil.copytree(tiny_model, root / "model")
    lines = (tiny_model.parent / "data" / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "d.jsonl").write_text("".join(lines[:rows]), encoding="utf-8")
    (root / "e.jsonl").write_text("".join(lines[rows : rows + 4]), encoding="utf-8")
    return root


# As the bundled examples/tiny.toml, with packing off (packing = "auto" runs a probe in a child process).
BASE_RUN = {
    "model": {"path": "model", "weights": "random", "precision": "auto", "attn_implementation": "auto"},
    "data": {"train": "d.jsonl", "eval": "e.jsonl", "max_length": 256, "format": "auto"},
    "training": {
        "global_batch_size": 16,
        "per_device_batch_size": 8,
        "learning_rate": 3e-3,
        "lr_scheduler": "cosine_with_min_lr",
        "min_lr_rate": 0.1,
        "warmup_ratio": 0.05,
        "max_steps": 60,
        "gradient_checkpointing": False,
        "packing": False,
        "logging_steps": 10,
        "save_steps": 30,
        "seed": 0,
    },
    "launch": {"nproc_per_node": "auto", "master_port": 29500},
    "watch": {"on_nan": "stop", "hang_timeout_s": 300},
    "report": {"to": "none"},
}


def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(doc: dict) -> str:
    """TOML of a dict of sections: the keys that are not tables first (TOML puts root keys before tables)."""
    root = [f"{toml_string(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    tables = [
        f"[{toml_string(k)}]\n" + "".join(f"{toml_string(kk)} = {toml_value(vv)}\n" for kk, vv in v.items())
        for k, v in doc.items()
        if isinstance(v, dict)
    ]
    return "\n".join(root) + "\n" + "\n".join(tables)


TOML_SCALARS = st.one_of(
    ODD_NUMBERS, ODD_STRINGS, st.integers(), st.floats(), TEXT, st.booleans(), st.dates(), st.times(), st.datetimes()
)
TOML_VALUES = st.recursive(
    TOML_SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(NAME, c, max_size=2), max_leaves=5
)
PATHISH = st.sampled_from(
    [
        "d.jsonl",
        "e.jsonl",
        "model",
        "run.toml",
        "missing.jsonl",
        "model/",
        "../outside.jsonl",
        "/nonexistent/x.jsonl",
        "~/x",
        "org/name",
        "a/b/c",
        ".",
        "./",
        "",
        "d.jsonl\n",
        "mo\u2028del",
    ]
)
SECTION_NAMES = st.sampled_from(list(SECTIONS)) | st.sampled_from(["modle", "Model", "train", "deepspeeds", ""]) | NAME


def _key_of(section: str):
    known = list(keys(SECTIONS[section])) if section in SECTIONS else []
    return (st.sampled_from(known) | st.sampled_from(known).flatmap(misspelt)) if known else NAME


@st.composite
def run_documents(draw):
    """BASE_RUN with 1-4 of: a key set to a value of the wrong type (nan, inf, huge, negative, a date, a list, a
    table, a path that is not there), a key deleted or misspelt, a section deleted, made a scalar, a list or an
    array of tables, or an unknown section added."""
    doc = copy.deepcopy(BASE_RUN)
    for _ in range(draw(st.integers(1, 4))):
        section = draw(SECTION_NAMES)
        how = draw(st.sampled_from(["set", "set", "set", "set", "path", "delete", "misspell", "section", "drop"]))
        table = doc.get(section)
        if how == "section":
            doc[section] = draw(
                TOML_SCALARS
                | st.lists(TOML_SCALARS, max_size=2)
                | st.lists(st.dictionaries(NAME, TOML_SCALARS, max_size=2), min_size=1, max_size=2)
            )
        elif how == "drop":
            doc.pop(section, None)
        elif how in ("delete", "misspell") and isinstance(table, dict) and table:
            key = draw(st.sampled_from(list(table)))
            value = table.pop(key)
            if how == "misspell":
                table[draw(misspelt(key))] = value
        else:
            if not isinstance(table, dict):
                table = doc[section] = {}
            key = draw(_key_of(section))
            value = draw(PATHISH | st.lists(PATHISH, max_size=3) if how == "path" else TOML_VALUES)
            table[key] = value
    training = doc.setdefault("training", {})
    if isinstance(training, dict) and training.get("packing", "auto") in ("auto", True):
        training["packing"] = False  # the packing probe is a child process of seconds: not this test's subject
    return doc


def _plain(value) -> str:
    return json.dumps(value, default=str, allow_nan=True, sort_keys=True)


RUN_TEXT = toml_document(BASE_RUN)


def _packing_off(text: str) -> str:
    """A broken run TOML that still parses keeps packing off, as run_documents() does (the probe takes seconds)."""
    try:
        training = tomllib.loads(text).get("training")
    except (tomllib.TOMLDecodeError, ValueError, RecursionError):
        return text
    if training is None:
        return text + '\n["training"]\n"packing" = false\n'
    if isinstance(training, dict) and training.get("packing", "auto") in ("auto", True):
        return re.sub(r'^\["training"\][ \t]*$', '["training"]\n"packing" = false', text, count=1, flags=re.MULTILINE)
    return text


@given(data=st.data())
@settings(max_examples=100, **FUZZ)
def test_run_toml(tmp_path_factory, tiny_model, data):
    """`check --config` and `train --dry-run` on a run TOML: structured mutations of a valid run, or broken text."""
    root = new_example(tmp_path_factory, tiny_model, "toml")
    config = root / "run.toml"
    structured = data.draw(st.booleans(), label="structured")
    if structured:
        doc = data.draw(run_documents(), label="run")
        text = toml_document(doc)
        assert _plain(tomllib.loads(text)) == _plain(doc), text  # the mutations reach validation, not the parser
        config.write_text(text, encoding="utf-8")
    else:
        raw = data.draw(
            broken_bytes(broken_text(RUN_TEXT).map(_packing_off), lambda v: RUN_TEXT + f"\n[more]\nx = {v}\n"),
            label="text",
        )
        config.write_bytes(raw)
    names = every_path(root)
    judged(sftdoctor(["check", "--json", "--config", config], root, names))
    result = sftdoctor(["train", "--dry-run", config, "--no-rehearse"], root, names)
    no_crash_in(result.stdout)


# ---------------------------------------------------------------- DeepSpeed JSON

DEEPSPEED = [json.loads((FIXTURES / "deepspeed" / e["file"]).read_text()) for e in index("deepspeed")]
DS_NAMES = st.sampled_from(
    [
        "zero_optimization",
        "zero_optimisation",
        "fp16",
        "bf16",
        "bfloat16",
        "optimizer",
        "scheduler",
        "gradient_clipping",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "stage",
        "offload_optimizer",
        "offload_param",
        "device",
        "enabled",
        "loss_scale",
        "overlap_comm",
        "steps_per_print",
        "wall_clock_breakdown",
    ]
)
DS_VALUES = ODD_JSON | constants(
    [
        {"device": "gpu"},
        {"stage": 99},
        {"stage": "two"},
        {"enabled": "yes"},
        {"device": "cpu", "pin_memory": "yes"},
        "auto",
    ]
)


def test_the_fuzz_bases_are_accepted(tmp_path_factory, tiny_model):
    """Every mutation starts from an input the CLI accepts, so what the fuzz finds is the mutation's doing."""
    root = new_example(tmp_path_factory, tiny_model, "base")
    (root / "run.toml").write_text(RUN_TEXT, encoding="utf-8")
    (root / "ds.json").write_text(json.dumps(DEEPSPEED[0]), encoding="utf-8")
    (root / "topo.txt").write_text(TOPOLOGIES[0][1], encoding="utf-8")
    names = every_path(root)
    for args in (
        ["check", "--json", "--config", root / "run.toml"],
        ["check", "--json", "--model-config", root / "model"],
        ["check", "--json", "--topology", root / "topo.txt"],
    ):
        assert judged(sftdoctor(args, root, names)) is not None, args  # judged (0 or 1), not refused
    assert sftdoctor(["train", "--dry-run", root / "run.toml", "--no-rehearse"], root, names).exit_code != 2
    assert sftdoctor(["plan", root / "run.toml", "--gpu-memory", "80GiB"], root, names).exit_code == 0
    assert judged(sftdoctor(["check", "--json", "--deepspeed", root / "ds.json"], root, names)) is not None


@given(data=st.data())
@settings(max_examples=15, **FUZZ)
def test_deepspeed_json_text(tmp_path_factory, data):
    """`check --deepspeed` on a real DeepSpeed JSON broken as text, or random bytes: mostly refused before DeepSpeed
    is asked; what still parses as an object is judged by DeepSpeed in a child process."""
    root = tmp_path_factory.mktemp("dstext")
    path = root / "ds.json"
    base = json.dumps(data.draw(st.sampled_from(DEEPSPEED), label="base"), indent=2)
    raw = data.draw(
        broken_bytes(broken_text(base), lambda v: f'{{"train_batch_size": {v}}}'),
        label="text",
    )
    path.write_bytes(raw)
    judged(sftdoctor(["check", "--json", "--deepspeed", path], root, [path]))


@given(data=st.data())
@settings(max_examples=8, **FUZZ)
def test_deepspeed_json(tmp_path_factory, data):
    """`check --deepspeed` on real DeepSpeed JSONs mutated: the installed DeepSpeed judges them in a child process
    (seconds each)."""
    root = tmp_path_factory.mktemp("ds")
    path = root / "ds.json"
    doc = data.draw(st.sampled_from(DEEPSPEED).flatmap(lambda d: mutated_json(d, DS_VALUES, DS_NAMES)), label="ds")
    path.write_text(json.dumps(doc, indent=2, allow_nan=True), encoding="utf-8")
    judged(sftdoctor(["check", "--json", "--deepspeed", path], root, [path]))


# ---------------------------------------------------------------- accelerate FSDP YAML

FSDP_TEXTS = [(FIXTURES / "fsdp" / e["file"]).read_text(encoding="utf-8") for e in index("fsdp")]
FSDP_NAMES = st.sampled_from(
    [
        "fsdp_config",
        "distributed_type",
        "mixed_precision",
        "num_processes",
        "num_machines",
        "parallelism_config",
        "fsdp_version",
        "version",
        "fsdp_sharding_strategy",
        "fsdp_reshard_after_forward",
        "fsdp_auto_wrap_policy",
        "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_state_dict_type",
        "fsdp_cpu_ram_efficient_loading",
        "fsdp_sync_module_states",
        "fsdp_activation_checkpointing",
        "fsdp_ignored_modules",
        "fsdp_min_num_params",
    ]
)
FSDP_VALUES = ODD_JSON | constants(
    ["FSDP", "MULTI_GPU", "FULL_SHARD", "HYBRID_SHARD", "NO_WRAP", "SIZE_BASED_WRAP", "LOCAL_STATE_DICT", "no", 2, 3]
    + ["fp16", "bf16", "LlamaDecoderLayer, X", {"parallelism_config_dp_replicate_size": 2}, "2", 0, None, "true"]
)


def _fsdp_doc(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)


@given(data=st.data())
@settings(max_examples=15, **FUZZ)
def test_fsdp_yaml_text(tmp_path_factory, data):
    """`check --fsdp` on a real accelerate FSDP config broken as text, or random bytes: judged, or refused in one
    line naming the file."""
    root = tmp_path_factory.mktemp("fsdptext")
    path = root / "fsdp.yaml"
    base = data.draw(st.sampled_from(FSDP_TEXTS), label="base")
    raw = data.draw(broken_bytes(broken_text(base), lambda v: f"distributed_type: FSDP\nfsdp_config: {v}\n"))
    path.write_bytes(raw)
    judged(sftdoctor(["check", "--json", "--fsdp", path], root, [path]))


@given(data=st.data())
@settings(max_examples=40, **FUZZ)
def test_fsdp_yaml(tmp_path_factory, data):
    """`check --fsdp` on real accelerate FSDP configs mutated (written as JSON, which YAML reads): wrong types,
    keys dropped, misspelt, added, values of the other FSDP version."""
    root = tmp_path_factory.mktemp("fsdp")
    path = root / "fsdp.yaml"
    base = _fsdp_doc(data.draw(st.sampled_from(FSDP_TEXTS), label="base"))
    doc = data.draw(mutated_json(base, FSDP_VALUES, FSDP_NAMES), label="fsdp")
    path.write_text(json.dumps(doc, indent=2, allow_nan=True), encoding="utf-8")
    judged(sftdoctor(["check", "--json", "--fsdp", path], root, [path]))


# ---------------------------------------------------------------- model config.json

SHAPE_KEYS = [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "intermediate_size",
    "head_dim",
    "model_type",
    "torch_dtype",
    "dtype",
    "tie_word_embeddings",
    "max_position_embeddings",
    "text_config",
    "n_embd",
    "n_layer",
    "n_head",
    "num_experts",
]
MODEL_TYPES = (
    st.sampled_from(sorted(GATED_MLP))
    | st.sampled_from(["", "Qwen2", "llama ", "not-a-model", "gpt2"])
    | constants([None, 0, 5, True, [], {}, ["llama"]])
)
SHAPE_VALUES = st.one_of(
    constants(
        [
            0,
            -1,
            1,
            3,
            7,
            64,
            10**7,
            10**18,
            2**63,
            10**100,
            0.5,
            64.0,
            -64.0,
            math.nan,
            math.inf,
            True,
            False,
            None,
            "64",
            "",
            "auto",
            [64],
            {"a": 1},
        ]
    ),
    st.integers(-5, 10**9),
    st.floats(),
    TEXT,
)
DTYPES = (
    constants(
        [
            "bfloat16",
            "float16",
            "float32",
            "torch.bfloat16",
            "bf16",
            "half",
            "auto",
            "int8",
            "",
            "float64",
            None,
            16,
            True,
            ["bfloat16"],
            {"dtype": "bfloat16"},
        ]
    )
    | TEXT
)


@st.composite
def model_configs(draw, base: str):
    """The tiny Qwen2's config.json (`base`) with its shape keys given odd values (strings, 0, -1, floats, huge ints),
    deleted, or nested under text_config; sometimes not an object at all."""
    config = json.loads(base)
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(SHAPE_KEYS))
        how = draw(st.sampled_from(["set", "set", "set", "delete", "nest"]))
        if how == "delete":
            config.pop(key, None)
        elif how == "nest":
            config["text_config"] = {k: config[k] for k in SHAPE_KEYS if k in config and draw(st.booleans())}
        else:
            config[key] = draw(MODEL_TYPES if key == "model_type" else DTYPES if "dtype" in key else SHAPE_VALUES)
    if draw(one_in(20)):
        return draw(JSONISH)
    return config


def _counted_on_meta_device(config) -> bool:
    """`plan` counts parameters in a child process when the closed form does not apply."""
    from sftdoctor.run.shape import closed_form, dimension_problem

    if not isinstance(config, dict):
        return False
    try:
        return closed_form(config) is None and not (config.get("model_type") in GATED_MLP and dimension_problem(config))
    except (TypeError, ValueError, AttributeError, OverflowError):  # the CLI's to survive, not this helper's
        return True


@given(data=st.data())
@settings(max_examples=100, **FUZZ)
def test_model_config(tmp_path_factory, tiny_model, data):
    """`check --model-config` on the tiny model's config.json mutated, given as the file or its folder."""
    root = new_example(tmp_path_factory, tiny_model, "model")
    path = root / "model" / "config.json"
    base = path.read_text(encoding="utf-8")
    if data.draw(one_in(5), label="text"):
        raw = data.draw(
            broken_bytes(broken_text(base), lambda v: f'{{"hidden_size": {v}}}'),
            label="raw",
        )
        path.write_bytes(raw)
    else:
        path.write_text(json.dumps(data.draw(model_configs(base), label="config"), allow_nan=True), encoding="utf-8")
    given_as = data.draw(st.sampled_from([path, path.parent]), label="given as")
    judged(sftdoctor(["check", "--json", "--model-config", given_as], root, every_path(root)))


@given(data=st.data())
@settings(max_examples=20, **FUZZ)
def test_model_config_plan(tmp_path_factory, tiny_model, data):
    """`plan RUN.toml --gpu-memory 80GiB` with the run's model folder holding a mutated config.json and the
    tokenizer. A config the closed form cannot size is counted in a child process (seconds): a few of those."""
    root = new_example(tmp_path_factory, tiny_model, "plan")
    base = json.loads((root / "model" / "config.json").read_text(encoding="utf-8"))
    config = data.draw(model_configs(json.dumps(base)), label="config")
    if isinstance(config, dict):
        if data.draw(one_in(10), label="meta device"):  # an architecture counted in a child process (seconds)
            config["model_type"] = data.draw(st.sampled_from(["gpt2", "phi", "not-a-model", "", 5, None]), label="type")
        elif _counted_on_meta_device(config):  # the others stay with the closed form: a gated family, its keys
            config["model_type"] = data.draw(st.sampled_from(sorted(GATED_MLP)), label="family")
            if _counted_on_meta_device(config):
                config.update({k: base[k] for k in NEEDED})
    (root / "model" / "config.json").write_text(json.dumps(config, allow_nan=True), encoding="utf-8")
    (root / "run.toml").write_text(RUN_TEXT, encoding="utf-8")
    result = sftdoctor(["plan", root / "run.toml", "--gpu-memory", "80GiB"], root, every_path(root))
    assert result.exit_code in (0, 1) or "config.json" in result.stderr, result.stderr


# ---------------------------------------------------------------- facts snapshot


@pytest.fixture(scope="module")
def snapshots() -> list[dict]:
    """This machine's `sftdoctor facts`, and the same with 8 recorded H100s and their recorded topology."""
    result = RUNNER.invoke(main, ["facts"])
    assert result.exit_code == 0, result.stderr
    machine = json.loads(result.stdout)
    gpu_box = copy.deepcopy(machine)
    gpu_box["facts"]["gpus"] = recorded_gpus("h100_sxm_8x_driver550_modal_glossary.txt")
    gpu_box["facts"]["topology"] = recorded_topology("h100_8x_nv18_no_nic_stas00_ml_engineering.txt")
    return [machine, gpu_box]


def _keys(spec) -> list[str]:
    """The named keys of a recorded fact's shape (facts.shapes' language), at any depth."""
    found = []
    if isinstance(spec, dict):
        for key, inner in spec.items():
            found += ([key] if isinstance(key, str) else []) + _keys(inner)
    elif isinstance(spec, (list, tuple)):
        for inner in spec:
            found += _keys(inner)
    return found


# Every fact the catalogue declares (recorded or not: a snapshot may name any), the keys of their recorded shapes,
# and the snapshot's own keys: derived from the declarations, so a new fact is fuzzed without being listed here.
FACT_NAMES = st.sampled_from(
    sorted({*CATALOGUE, *(k for spec in SHAPES.values() for k in _keys(spec)), "schema", "facts"})
)


@given(data=st.data())
@settings(max_examples=100, **FUZZ)
def test_facts_snapshot(tmp_path_factory, tiny_model, snapshots, data):
    """`check --facts` (sometimes with the run config, so the run's checks judge the replayed machine) on a real
    snapshot with values of the wrong type, keys dropped, misspelt or added; or on broken text."""
    root = new_example(tmp_path_factory, tiny_model, "facts")
    path = root / "snap.json"
    base = data.draw(st.sampled_from(snapshots), label="base")
    if data.draw(one_in(5), label="text"):
        raw = data.draw(
            broken_bytes(broken_text(json.dumps(base, indent=1)), lambda v: f'{{"schema": {v}, "facts": {{}}}}'),
            label="raw",
        )
        path.write_bytes(raw)
    else:
        doc = data.draw(mutated_json(base, names=FACT_NAMES), label="snapshot")
        path.write_text(json.dumps(doc, allow_nan=True), encoding="utf-8")
    args = ["check", "--json", "--facts", path]
    if data.draw(st.booleans(), label="with config"):
        (root / "run.toml").write_text(RUN_TEXT, encoding="utf-8")
        args += ["--config", root / "run.toml"]
    judged(sftdoctor(args, root, every_path(root)))


# ---------------------------------------------------------------- data rows

ROLES = st.sampled_from(["system", "user", "assistant", "tool", "human", "gpt", "function_call", "robot", "", None, 1])
CONTENT = st.one_of(st.text(max_size=20), st.sampled_from(["", " ", "\n"]), ODD_JSON)
TURN = (
    st.fixed_dictionaries({}, optional={"role": ROLES, "content": CONTENT, "from": ROLES, "value": CONTENT}) | ODD_JSON
)
TURNS = st.lists(TURN, max_size=4) | ODD_JSON | st.text(max_size=10)
WORDS = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20).filter(lambda t: t.strip())
CHAT = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": st.text(max_size=20)}
    ),
    min_size=1,
    max_size=3,
)
GOOD = {  # valid rows of each format, as data/train.jsonl files hold them
    "messages": st.fixed_dictionaries({"messages": CHAT}),
    "sharegpt": st.fixed_dictionaries(
        {
            "conversations": st.lists(
                st.fixed_dictionaries(
                    {
                        "from": st.sampled_from(["system", "human", "gpt", "user", "assistant", "observation"]),
                        "value": st.text(max_size=20),
                    }
                ),
                min_size=1,
                max_size=3,
            )
        }
    ),
    "alpaca": st.fixed_dictionaries(
        {"instruction": st.text(max_size=20), "output": st.text(max_size=20)},
        optional={"input": st.text(max_size=10) | st.none(), "system": st.text(max_size=10) | st.none()},
    ),
    "prompt_completion": st.fixed_dictionaries(
        {"prompt": st.text(max_size=20) | CHAT, "completion": st.text(max_size=20) | CHAT}
    ),
    "text": st.fixed_dictionaries({"text": WORDS}),
}
ROW_KEYS = ["messages", "conversations", "instruction", "input", "output", "system", "prompt", "completion", "text"]
ROW = st.one_of(  # a row of any shape: valid, of the wrong types, of no format, of two formats at once
    st.sampled_from(sorted(GOOD)).flatmap(GOOD.get),
    JSONISH,
    st.fixed_dictionaries({"messages": TURNS}),
    st.fixed_dictionaries({"conversations": TURNS}),
    st.fixed_dictionaries({"instruction": CONTENT, "output": CONTENT}, optional={"input": CONTENT, "system": CONTENT}),
    st.fixed_dictionaries({"prompt": CONTENT | TURNS, "completion": CONTENT | TURNS}),
    st.fixed_dictionaries({"text": CONTENT}),
    st.tuples(
        st.sampled_from(sorted(GOOD)).flatmap(GOOD.get),
        st.dictionaries(st.sampled_from(ROW_KEYS), CONTENT | TURNS, min_size=1, max_size=2),
    ).map(lambda t: {**t[0], **t[1]}),
)
JUNK_LINES = st.sampled_from(
    [
        "",
        "   ",
        "{",
        "}",
        "not json",
        "[1, 2",
        '{"text": "a"} {"text": "b"}',
        "\ufeff{}",
        '{"text": "a",}',
        "NaN",
        '{"text": NaN}',
        "null",
        "[]",
        '"text"',
    ]
) | st.text(max_size=20)


def _row_line(draw, row) -> str:
    return json.dumps(row, allow_nan=True, ensure_ascii=draw(st.booleans()))


@st.composite
def data_files(draw):
    """(file name, bytes, the format of its valid rows). Mostly valid rows of one format with one odd row or line put in
    (wrong types, no format, two formats, not JSON, blank); or any rows and lines; a JSON array; an empty file,
    a BOM, CRLF line ends, binary."""
    fmt = draw(st.sampled_from(sorted(GOOD)))
    rows = draw(st.lists(GOOD[fmt], min_size=draw(st.sampled_from([0, 1, 1])), max_size=5))
    lines = [_row_line(draw, r) for r in rows]
    shape = draw(st.sampled_from(["one odd", "one odd", "one odd", "valid", "any", "array", "bytes"]))
    if shape == "one odd":
        at = draw(st.integers(0, len(lines)))
        odd = draw(st.sampled_from(["row", "row", "two formats", "line", "deep"]))
        if odd in ("row", "two formats"):
            row = draw(
                ROW
                if odd == "row"
                else st.tuples(
                    GOOD[fmt], st.dictionaries(st.sampled_from(ROW_KEYS), CONTENT | TURNS, min_size=1, max_size=2)
                ).map(lambda t: {**t[0], **t[1]})
            )
            rows.insert(at, row)
            lines.insert(at, _row_line(draw, row))
        else:
            lines.insert(at, draw(JUNK_LINES if odd == "line" else unconvertible() | lone_surrogates() | JUNK_LINES))
    elif shape == "any":
        rows = draw(st.lists(ROW, max_size=5))
        lines = [_row_line(draw, r) for r in rows] + draw(st.lists(JUNK_LINES | unconvertible(), max_size=2))
        lines = draw(st.permutations(lines))
    elif shape == "array":
        text = json.dumps(rows, allow_nan=True)
        return "d.json", (text if draw(st.booleans()) else draw(broken_text(text))).encode(), fmt
    text = draw(st.sampled_from(["\n", "\r\n", "\n\n"])).join(lines) + draw(st.sampled_from(["", "\n"]))
    raw = draw(st.sampled_from([b"", b"", b"\xef\xbb\xbf"])) + text.encode()
    return "d.jsonl", draw(random_bytes()) if shape == "bytes" else raw, fmt


CHILD_PROBED = ("training-targets", "packing", "token-ids", "data-prep-timeout", "ddp-unused-parameters")


@given(data=st.data())
@settings(max_examples=100, **FUZZ)
def test_data_rows(tmp_path_factory, tiny_model, data):
    """`check --config` validates every row of the run's data; `plan` then tokenizes them with the tiny tokenizer."""
    root = new_example(tmp_path_factory, tiny_model, "data")
    name, raw, written = data.draw(data_files(), label="data")
    (root / name).write_bytes(raw)
    fmt = data.draw(
        st.sampled_from(["auto", "auto", written, "messages", "sharegpt", "alpaca", "prompt_completion", "text"]),
        label="format",
    )
    train = data.draw(st.sampled_from([name, [name], [name, name]]), label="train")
    run = {**BASE_RUN, "data": {"train": train, "max_length": 64, "format": fmt}}
    (root / "run.toml").write_text(toml_document(run), encoding="utf-8")
    names = every_path(root)
    # The checks that build a trainer in a child process (6 s each) judge one input in 25; the others, every one.
    # A middle value: hypothesis draws a bound (0, 24) about one time in ten, a middle value one in 25.
    every = data.draw(st.integers(0, 24), label="with the trainer probes") == 12
    select = (
        [] if every else ["--select", ",".join(c for c in load_checks(plugins=False).checks if c not in CHILD_PROBED)]
    )
    judged(sftdoctor(["check", "--json", "--config", root / "run.toml", *select], root, names))
    sftdoctor(["plan", root / "run.toml", "--gpu-memory", "80GiB"], root, names)


# ---------------------------------------------------------------- topology text

TOPOLOGIES = [(e["file"], (FIXTURES / "topology" / e["file"]).read_text(encoding="utf-8")) for e in index("topology")]
TOKENS = st.sampled_from(
    [
        "X",
        "NV1",
        "NV12",
        "NV18",
        "NV999",
        "PIX",
        "PXB",
        "PHB",
        "NODE",
        "SYS",
        "SOC",
        "PSB",
        "NA",
        "N/A",
        "GPU0",
        "GPU1",
        "GPU7",
        "GPU99",
        "NIC0",
        "mlx5_0",
        "CPU",
        "Affinity",
        "NUMA",
        "0-47",
        "\x1b[4m",
        "\t",
        "",
        "GPU0\tGPU0",
        "Legend:",
        "NIC0: mlx5_0",
    ]
) | st.text(max_size=6)


@st.composite
def topology_texts(draw):
    """A real `nvidia-smi topo -m` output with tokens swapped or replaced, lines dropped or repeated, cut short."""
    _, text = draw(st.sampled_from(TOPOLOGIES))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["swap", "replace", "replace", "broken"]))
        tokens = re.split(r"(\s+)", text)
        words = [i for i, t in enumerate(tokens) if t and not t.isspace()]
        if how == "broken" or not words:
            text = draw(broken_text(text))
            continue
        i = draw(st.sampled_from(words))
        if how == "swap":
            j = draw(st.sampled_from(words))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        else:
            tokens[i] = draw(TOKENS)
        text = "".join(tokens)
    return text


@given(data=st.data())
@settings(max_examples=100, **FUZZ)
def test_topology_text(tmp_path_factory, data):
    """`check --topology` on real matrices mutated, random text or binary."""
    root = tmp_path_factory.mktemp("topo")
    path = root / "topo.txt"
    raw = data.draw(topology_texts().map(str.encode) | random_bytes(), label="topology")
    path.write_bytes(raw)
    judged(sftdoctor(["check", "--json", "--topology", path], root, [path]))
