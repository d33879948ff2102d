"""untrained-tokens on checkpoints that lie: embedding rows holding NaN/inf at random ids, template token ids
beyond the table's rows, safetensors files that are truncated, whose header lies about offsets, shapes or
dtypes, shards an index names that are missing, and files that are not files (tests/hostile.py). Built as real
safetensors files over the tiny example's tokenizer, read by the real reader and the real CLI: the contract of
tests/cli_contract.py holds, and no ✓ or "trained" is said of a row that was non-finite, absent or unreadable."""

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from cli_contract import sftdoctor
from conftest import EXAMPLES
from hostile import NON_FINITE, SPECIAL, no_hang, special_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from sftdoctor.checks import run_check
from sftdoctor.facts import Facts
from sftdoctor.facts.token_rows import REFERENCE_ROWS, read_rows, weight_files

pytestmark = pytest.mark.slow  # the reader imports torch; each command line reads rows in a child process

TOKENS = {"<|im_start|>": 1, "<|im_end|>": 2}  # what the tiny tokenizer's chat template writes (and its EOS)
NAME = "model.embed_tokens.weight"
FUZZ = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}


def matrix(rows=384, width=16, nonfinite=(), zeros=(), seed=0):
    weight = np.random.default_rng(seed).normal(0, 0.02, (rows, width)).astype(np.float32)
    for i, value in nonfinite:
        weight[i, i % width] = value
    for i in zeros:
        weight[i] = 0.0
    return weight


def example(root: Path, weight=None, repair=False) -> Path:
    """A pretrained checkpoint of the tiny example (its config.json and tokenizer) whose model.safetensors holds
    only the embedding, and a run config over it; returns the run config."""
    shutil.copytree(EXAMPLES / "tiny" / "model", root / "model")
    lines = (EXAMPLES / "tiny" / "data" / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "d.jsonl").write_text("".join(lines[:8]), encoding="utf-8")
    if weight is not None:
        save_file({NAME: weight}, str(root / "model" / "model.safetensors"))
    (root / "run.toml").write_text(
        '[model]\npath = "model"\nweights = "pretrained"\n'
        f'repair_untrained_tokens = {str(repair).lower()}\n[data]\ntrain = "d.jsonl"\n'
        "[training]\npacking = false\n"
    )  # no packing probe: it builds the model (seconds)
    return root / "run.toml"


def header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + size]), data[8 + size :]


def rewrite(path: Path, head: dict, body: bytes) -> None:
    text = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def lie(path: Path, how: str, cut: int) -> None:
    """Make the file lie: truncated, offsets past its end, a shape or dtype that does not fit its bytes, a dtype
    no reader knows, a dtype that is not a float, or a 1-D table."""
    head, body = header(path)
    entry = head[NAME]
    rows, width = entry["shape"]
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: max(0, path.stat().st_size - 1 - cut)])
        return
    changed = {
        "offsets": {"data_offsets": [0, entry["data_offsets"][1] + 4 * (cut + 1)]},
        "shape": {"shape": [rows + cut + 1, width]},
        "dtype-unknown": {"dtype": "X9"},
        "dtype-int": {"dtype": "I32"},
        "dtype-f16": {"dtype": "F16"},
        "flat": {"shape": [rows * width]},
    }[how]
    rewrite(path, {**head, NAME: {**entry, **changed}}, body)


def judged_lines(result) -> tuple[list[str], list[str]]:
    """(✓ lines, every finding line) of `check`'s table."""
    lines = [line for line in result.stdout.splitlines() if "untrained-tokens" in line]
    return [line for line in lines if line.lstrip().startswith("✓")], lines


def check(root: Path, cfg: Path):
    with no_hang(120):
        return sftdoctor(
            ["check", "--config", cfg, "--select", "untrained-tokens"],
            root,
            [cfg, *sorted(root.rglob("*"), key=lambda p: -len(str(p)))],
        )


# ---------------------------------------------------------------- the reader, in this process


@given(
    rows=st.sampled_from([384, 3, 2, 1, 0]),
    width=st.sampled_from([1, 16]),
    nonfinite=st.lists(st.tuples(st.integers(0, 383), st.sampled_from(NON_FINITE)), max_size=4),
    zeros=st.lists(st.integers(0, 383), max_size=2),
    dtype=st.sampled_from([np.float32, np.float16, np.float64]),
)
@settings(max_examples=150, **FUZZ)
def test_the_reader_and_the_check_never_call_a_non_finite_or_absent_row_trained(
    tmp_path_factory, registry, rows, width, nonfinite, zeros, dtype
):
    path = tmp_path_factory.mktemp("rows") / "model.safetensors"
    nonfinite = [(i % rows, v) for i, v in nonfinite] if rows else []
    weight = matrix(rows, width, nonfinite, [i % rows for i in zeros] if rows else []).astype(dtype)
    save_file({NAME: weight}, str(path))
    fact = read_rows([str(path)], TOKENS)
    json.dumps(fact, allow_nan=False)  # the fact is plain JSON: no NaN stands in for a number
    findings = run_check(registry.checks["untrained-tokens"], Facts.replay({"token_rows": fact}))
    said = "\n".join(f.title for f in findings)
    for token, i in TOKENS.items():
        if i >= rows:
            assert f"{token!r} (id {i})" in said and "have no row in the input embedding" in said, said
        elif not np.isfinite(weight[i].astype(np.float64)).all():
            assert f"{i} (token {token!r})" in said and "NaN/inf: the checkpoint is broken" in said, said
        elif not weight[i].any():
            assert f"{token} (all zeros)" in said, said
    if any(f.severity.value == "ok" for f in findings):
        broken = [i for i, _ in nonfinite if not np.isfinite(weight[i].astype(np.float64)).all()]
        assert rows > 2 and not set(broken) & {1, 2} and all(weight[i].any() for i in (1, 2)), said
        read = {round(k * (rows - 1) / (REFERENCE_ROWS - 1)) for k in range(REFERENCE_ROWS)}  # the ordinary rows read
        assert not any(i in read for i in broken), said


LIES = {
    "truncated": "incomplete metadata",
    "offsets": "invalid shape, data type, or offset",
    "shape": "invalid shape, data type, or offset",
    "dtype-unknown": "unknown variant `X9`",
    "dtype-int": "model.embed_tokens.weight is I32, not a floating-point type",
    "dtype-f16": "invalid shape, data type, or offset",
    "flat": "has shape [6144], not a (rows, width) matrix",
}


@pytest.mark.parametrize("how", LIES)
def test_a_file_that_lies_is_named_with_why_and_its_rows_are_not_read(tmp_path, registry, how):
    path = tmp_path / "model.safetensors"
    save_file({NAME: matrix()}, str(path))
    lie(path, how, 0)
    fact = read_rows([str(path)], TOKENS)
    assert fact["file"] == str(path) and LIES[how] in fact["error"], fact
    [finding] = run_check(registry.checks["untrained-tokens"], Facts.replay({"token_rows": fact}))
    assert finding.severity.value == "warning" and finding.title.startswith("not judged: ")


# ---------------------------------------------------------------- the CLI on files that lie or are not files


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_file_that_is_not_a_file_in_place_of_the_checkpoint_is_not_judged(tmp_path, kind):
    cfg = example(tmp_path)
    special_file(tmp_path / "model" / "model.safetensors", kind)
    result = check(tmp_path, cfg)
    passed, lines = judged_lines(result)
    assert not passed, result.stdout
    if result.exit_code == 2:  # refused with the run config: a file that cannot be read, or no safetensors at all
        assert (
            "model.safetensors cannot be read as a file" in result.stderr
            or "[model].path: model.safetensors: " in result.stderr
        ), result.stderr
    else:  # a file that can be opened but holds no safetensors: the probe says so
        assert result.exit_code == 0 and any(
            f"not judged: the embedding rows could not be read ({tmp_path}/model/model.safetensors: " in line
            for line in lines
        ), result.stdout


def test_a_shard_the_index_names_that_is_missing_is_refused_before_the_rows_are_judged(tmp_path):
    """from_pretrained would stop on it at load: refused with the run config (facts.checkpoint_files), and the
    probe that reads the rows says the same when asked on its own."""
    cfg = example(tmp_path, matrix())
    (tmp_path / "model" / "model.safetensors").rename(tmp_path / "model" / "model-00002-of-00002.safetensors")
    (tmp_path / "model" / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    NAME: "model-00001-of-00002.safetensors",
                    "lm_head.weight": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    result = check(tmp_path, cfg)
    assert result.exit_code == 2 and (
        "[model].path: model-00001-of-00002.safetensors: safetensors file not found" in result.stderr
    ), result.stderr
    assert weight_files(tmp_path / "model") == {
        "error": "safetensors shard not found",
        "file": f"{tmp_path}/model/model-00001-of-00002.safetensors",
    }


@given(
    how=st.sampled_from(
        ["none", "truncated", "offsets", "shape", "dtype-unknown", "dtype-int", "dtype-f16", "flat", "special"]
    ),
    cut=st.integers(0, 300),
    nonfinite=st.lists(st.tuples(st.integers(0, 383), st.sampled_from(NON_FINITE)), max_size=3),
    rows=st.sampled_from([384, 2]),
    kind=st.sampled_from(SPECIAL),
)
@settings(max_examples=6, **FUZZ)
def test_check_never_passes_rows_it_could_not_read(tmp_path_factory, how, cut, nonfinite, rows, kind):
    root = tmp_path_factory.mktemp("lie")
    nonfinite = [(i % rows, v) for i, v in nonfinite]
    cfg = example(root, matrix(rows, 16, nonfinite))
    shard = root / "model" / "model.safetensors"
    if how == "special":
        shard.unlink()
        special_file(shard, kind)
    elif how != "none":
        lie(shard, how, cut)
    result = check(root, cfg)
    passed, lines = judged_lines(result)
    if how != "none":  # refused as bad input (a special file in the model folder), or not judged
        assert not passed and (result.exit_code == 2 or any("not judged" in line for line in lines)), result.stdout
    broken = {i for i, _ in nonfinite} & {1, 2}
    if passed:
        assert how == "none" and rows > 2 and not broken and not nonfinite, result.stdout
    if how == "none" and broken:
        assert "holds NaN/inf: the checkpoint is broken" in result.stdout or "hold NaN/inf" in result.stdout


# ---------------------------------------------------------------- a repair of rows that cannot be read

REFUSAL = (
    "[model] repair_untrained_tokens cannot repair the embedding rows: they cannot be read "
    "({}/model/model.safetensors: ValueError: model.embed_tokens.weight has shape [6144], not a (rows, width) "
    "matrix)"
)


def test_a_repair_of_rows_that_cannot_be_read_is_refused_by_check_and_by_the_gate(tmp_path):
    cfg = example(tmp_path, matrix(zeros=[1, 2]), repair=True)
    lie(tmp_path / "model" / "model.safetensors", "flat", 0)  # a 1-D table: it loads, but holds no rows to read
    result = check(tmp_path, cfg)
    refusal = REFUSAL.format(tmp_path)
    assert result.exit_code == 1 and refusal in " ".join(result.stdout.split()), result.stdout
    with no_hang(300):
        dry = sftdoctor(["train", cfg, "--dry-run"], tmp_path, [cfg])
    assert dry.exit_code == 1 and refusal in " ".join(dry.stdout.split()), dry.stdout[-3000:]
