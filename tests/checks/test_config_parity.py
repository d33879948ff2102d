"""`check --config` refuses everything `train` refuses, in the same words (issue 40): both ask
facts.launch_inputs.require, before any check runs. Each case runs `check --config`, `train --dry-run` and (where
it is refused) `train` itself on one config, in-process under the CLI contract (tests/cli_contract.py: one line
per problem naming the file, exit 2, no traceback, nothing left behind, no child left running), and compares their
refusals line for line; the verdicts that are warnings (data-rows) must read the same in `check` and `train`'s gate.
The last test draws configs mutated with these classes together."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_contract import ENV, sftdoctor
from hostile import SPECIAL, no_hang, special_file, wrong_type
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny"
LINES = (EXAMPLE / "data" / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
MISSING_BACKEND = next(
    (b for b in ("wandb", "tensorboard") if __import__("importlib.util").util.find_spec(b) is None), None
)
# As the bundled examples/tiny.toml, packing off (the packing probe is a child process of seconds).
BASE = {
    "model": {"path": "model", "weights": "random"},
    "data": {"train": "d.jsonl", "eval": "e.jsonl", "max_length": 256},
    "training": {
        "global_batch_size": 16,
        "per_device_batch_size": 8,
        "max_steps": 60,
        "gradient_checkpointing": False,
        "packing": False,
        "output_dir": "out",
    },
    "launch": {"master_port": "auto"},
    "report": {"to": "none"},
}


@pytest.fixture(autouse=True)
def _offline_without_plugins(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "model"
    shutil.copytree(EXAMPLE / "model", folder)
    return folder


@pytest.fixture(scope="module")
def bare_model(tmp_path_factory) -> Path:
    """The tiny model's config.json alone: no tokenizer, so the probes that build the model in child processes
    (seconds each) skip, and the gate takes a second; the chat-template check fails the same way in both."""
    folder = tmp_path_factory.mktemp("bare") / "model"
    folder.mkdir()
    shutil.copy(EXAMPLE / "model" / "config.json", folder)
    return folder


def example(root: Path, model: Path, sections: dict | None = None, rows: int = 20, data: str | None = None) -> Path:
    """A run folder: the tiny model, `rows` training rows (or `data` as d.json), 4 eval rows, run.toml."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model").symlink_to(model)
    (root / "d.jsonl").write_text("".join(LINES[:rows]), encoding="utf-8")
    (root / "e.jsonl").write_text("".join(LINES[100:104]), encoding="utf-8")
    doc = json.loads(json.dumps(BASE))
    if data is not None:
        (root / "d.json").write_text(data, encoding="utf-8")
        doc["data"]["train"] = "d.json"
    for name, values in (sections or {}).items():
        for key, value in values.items():
            if value is None:
                doc[name].pop(key, None)
            else:
                doc.setdefault(name, {})[key] = value
    text = "".join(
        f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()) for name, values in doc.items()
    )
    (root / "run.toml").write_text(text, encoding="utf-8")
    return root / "run.toml"


def warnings_of(stdout: str) -> set[str]:
    return {line.strip() for line in stdout.splitlines() if line.startswith("!  data-rows")}


def same_verdict(config: Path, launch: bool = True) -> tuple[int, list[str], set[str]]:
    """(exit code, refusal lines, data-rows warnings) that `check --config` and `train --dry-run` both give; with
    `launch`, a refusal is `train`'s own too."""
    root, names = config.parent, [config.parent]  # the config or a file it names
    with no_hang(60):
        checked = sftdoctor(["check", "--config", config], root, names)
        dry = sftdoctor(["train", "--dry-run", "--no-rehearse", config], root, names)
    said = checked.stderr.splitlines()
    assert (checked.exit_code, said) == (dry.exit_code, dry.stderr.splitlines()), (
        checked.stdout[-2000:],
        dry.stdout[-2000:],
    )
    if checked.exit_code == 2 and launch:
        with no_hang(60):
            trained = sftdoctor(["train", "--no-rehearse", config], root, names)
        assert (trained.exit_code, trained.stderr.splitlines()) == (2, said)
    if checked.exit_code != 2:
        assert warnings_of(checked.stdout) == warnings_of(dry.stdout)
    return checked.exit_code, said, warnings_of(checked.stdout)


def refused(config: Path, key: str, message: str) -> None:
    code, said, _ = same_verdict(config)
    assert (code, said) == (2, [f"sftdoctor: error: {config}: {key}: {message}"])


@pytest.mark.parametrize("kind", [k for k in SPECIAL if k != "folder"])
def test_an_output_dir_that_is_not_a_folder(tmp_path, model, kind):
    config = example(tmp_path, model)
    special_file(tmp_path / "out", kind)
    refused(config, "[training].output_dir", f"{tmp_path / 'out'} exists and is not a folder")


def test_an_output_dir_under_a_file(tmp_path, model):
    config = example(tmp_path, model, {"training": {"output_dir": "notes.txt/run"}})
    (tmp_path / "notes.txt").write_text("x")
    refused(
        config,
        "[training].output_dir",
        f"{tmp_path / 'notes.txt'} is not a folder, so {tmp_path / 'notes.txt' / 'run'} cannot be made in it",
    )


@pytest.mark.skipif(MISSING_BACKEND is None, reason="wandb and tensorboard are both installed here")
def test_a_report_backend_that_is_not_installed(tmp_path, model):
    config = example(tmp_path, model, {"report": {"to": MISSING_BACKEND}})
    refused(config, "[report].to", f"{MISSING_BACKEND} is not installed (pip install {MISSING_BACKEND})")


def test_a_hub_model_neither_cached_nor_reachable_offline(tmp_path, model, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path.parent / f"{tmp_path.name}-hub"))
    config = example(tmp_path, model, {"model": {"path": "sftdoctor-tests/not-cached", "tokenizer": "model"}})
    refused(
        config, "[model].path", "sftdoctor-tests/not-cached is not in the local Hugging Face cache and HF_HUB_OFFLINE=1"
    )


def test_a_local_model_without_weights_to_fine_tune_from(tmp_path, bare_model):
    config = example(tmp_path, bare_model, {"model": {"weights": "pretrained"}})
    refused(
        config,
        "[model].path",
        f"{tmp_path / 'model'} holds no weights (model.safetensors, model.safetensors.index.json, "
        'pytorch_model.bin, pytorch_model.bin.index.json) for [model] weights = "pretrained": give the folder '
        'with the checkpoint, or weights = "random" to start from config.json alone',
    )


def test_an_eval_fraction_that_leaves_no_training_row(tmp_path, model):
    config = example(tmp_path, model, {"data": {"eval": None, "eval_fraction": 0.01}}, rows=1)
    refused(
        config,
        "[data].eval_fraction",
        "0.01 of 1 training row holds out 1 for eval and leaves 0 to train on "
        "(datasets' train_test_split holds out ceil(0.01 x 1)): give more rows, or "
        "an eval file ([data] eval)",
    )


@pytest.mark.slow  # the whole gate, twice: 2 s
def test_a_run_directory_of_another_run_is_refused_by_the_dry_run_as_by_train(tmp_path, bare_model):
    """Checkpoints in output_dir: `train` refuses them without --resume, and so does its dry run (`check` has no
    --resume to know)."""
    config = example(tmp_path, bare_model)
    (tmp_path / "out" / "checkpoint-2").mkdir(parents=True)
    line = (
        f"sftdoctor: error: {tmp_path / 'out'}: [training].output_dir: already holds checkpoints; add --resume to "
        "continue, or set another [training] output_dir"
    )
    with no_hang(60):
        dry = sftdoctor(["train", "--dry-run", "--no-rehearse", config], tmp_path, [tmp_path])
        assert (dry.exit_code, dry.stderr.splitlines()) == (2, [line])
        resumed = sftdoctor(["train", "--dry-run", "--no-rehearse", "--resume", config], tmp_path, [tmp_path])
        assert resumed.exit_code == 1  # chat-template, as without the checkpoints


@pytest.mark.slow  # the whole gate, twice: 2-4 s
def test_one_object_and_fewer_rows_than_a_batch_are_the_same_warnings_in_check_and_train(tmp_path, bare_model):
    row = json.loads(LINES[0])
    config = example(tmp_path, bare_model, data=json.dumps(row, indent=2))
    code, _, warned = same_verdict(config)
    assert code == 1  # chat-template: no tokenizer here, in both
    assert warned == {
        f"!  data-rows/one-object        {tmp_path / 'd.json'} is one JSON object: the datasets library "
        "reads it as one row",
        "!  data-rows/fewer-than-batch  1 training row (4 eval), fewer than one global batch of 16 (8 per "
        "device x 2 accumulation x 1): each epoch is one optimizer step on a partial batch of 1",
    }


# ---------------------------------------------------------------- the classes drawn together

OUTPUT_DIRS = st.sampled_from(["fine"] * 12 + ["under-a-file"] + SPECIAL)  # fine often: the verdicts are compared too
BACKENDS = st.sampled_from(["none", "none", "tensorboard", "wandb"])
MODELS = st.sampled_from(["model"] * 6 + ["sftdoctor-tests/not-cached", "org/na me"])
SPLITS = st.sampled_from([None, 0.0, 1e-9, 0.01, 0.5])
DATA = st.sampled_from(["rows", "one-object", "one-line-object", "wrapped", "array"])


def _data(kind: str) -> str | None:
    row = json.loads(LINES[0])
    return {
        "rows": None,
        "one-object": json.dumps(row, indent=2),
        "one-line-object": json.dumps(row),
        "wrapped": json.dumps({"data": [row, row]}, indent=2),
        "array": json.dumps([row, row, row]),
    }[kind]


@pytest.mark.slow
@given(
    out=OUTPUT_DIRS,
    to=BACKENDS,
    model_id=MODELS,
    weights=st.sampled_from(["random"] * 4 + ["pretrained"]),
    fraction=SPLITS,
    data=DATA,
    rows=st.sampled_from([1, 2, 20]),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_check_and_train_agree_on_hostile_configs(
    tmp_path_factory, bare_model, out, to, model_id, weights, fraction, data, rows
):
    """A config mutated with several of the classes above at once: `check --config` and `train --dry-run` give the
    same exit code, the same refusal lines and the same data-rows warnings."""
    root = tmp_path_factory.mktemp("parity")
    sections = {
        "report": {"to": to},
        "model": {"path": model_id, "tokenizer": "model", "weights": weights},
        "training": {"output_dir": "notes.txt/run" if out == "under-a-file" else "out"},
    }
    if fraction is not None:
        sections["data"] = {"eval": None, "eval_fraction": fraction}
    config = example(root, bare_model, sections, rows=rows, data=_data(data))
    if out == "under-a-file":
        (root / "notes.txt").write_text("x")
    elif out != "fine":
        special_file(root / "out", out)
    code, said, _ = same_verdict(config, launch=False)
    event(f"exit {code}")
    train_rows = {"rows": rows, "array": 3}.get(data, 1)
    expect_refusal = (
        out not in ("fine", "folder")
        or model_id != "model"
        or (to != "none" and to == MISSING_BACKEND)
        or data == "wrapped"
        or weights == "pretrained"
        or (fraction and train_rows == 1)
    )
    assert (code == 2) == bool(expect_refusal), said


# ---------------------------------------------------------------- [checks] disable, as --disable


def test_an_unknown_id_in_checks_disable_is_refused_alike(tmp_path, bare_model):
    config = example(tmp_path, bare_model, {"checks": {"disable": ["chat-template", "dsk-full"]}})
    refused(
        config,
        "[checks].disable",
        "no check or message 'dsk-full' (did you mean 'disk-full'?); see `sftdoctor check --list`",
    )


def silenced_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("~  ")]


@pytest.mark.slow  # the whole gate, in check and train --dry-run: 2-4 s
def test_a_silenced_error_lets_check_and_the_dry_run_pass_alike(tmp_path, bare_model):
    """The bare model has no tokenizer: chat-template is an error, in both; silenced in the run config, it is still
    printed, marked silenced, in both, and neither refuses. --disable on the command line does the same."""
    config = example(tmp_path, bare_model, {"checks": {"disable": ["chat-template"]}})
    root = config.parent
    with no_hang(60):
        checked = sftdoctor(["check", "--config", config], root, [root])
        dry = sftdoctor(["train", "--dry-run", "--no-rehearse", config], root, [root])
    assert (checked.exit_code, dry.exit_code) == (0, 0), (checked.stdout[-2000:], dry.stdout[-2000:])
    assert silenced_lines(checked.stdout) == silenced_lines(dry.stdout) != []
    assert all(line.split()[1].startswith("chat-template") for line in silenced_lines(checked.stdout))
    plain = example(tmp_path / "plain", bare_model)
    with no_hang(60):
        option = sftdoctor(["check", "--config", plain, "--disable", "chat-template"], plain.parent, [plain.parent])
        dry = sftdoctor(
            ["train", "--dry-run", "--no-rehearse", "--disable", "chat-template", plain], plain.parent, [plain.parent]
        )
    assert (option.exit_code, dry.exit_code) == (0, 0)
    assert silenced_lines(option.stdout) == silenced_lines(dry.stdout)
    ids = [[line.split()[1] for line in silenced_lines(out)] for out in (option.stdout, checked.stdout)]
    assert ids[0] == ids[1]


DISABLE_VALUES = st.one_of(
    wrong_type(["x"]),
    st.lists(
        st.sampled_from(["", " ", "nccl-env", "nccl-env/port-busy", "nccl-env/", "dsk-full", "x\ny", "☃"]), max_size=3
    ),
)


@pytest.mark.slow  # check --config on 60 drawn configs: about 30 s
@given(value=DISABLE_VALUES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_checks_disable_is_a_verdict_or_one_line_naming_the_file(tmp_path_factory, bare_model, value):
    """tests/hostile.py's vocabulary (wrong types, empty strings, unknown ids) in [checks] disable: check keeps the
    CLI contract, and refuses exactly what is not a list of known ids."""
    root = tmp_path_factory.mktemp("disable")
    config = example(root, bare_model, {"checks": {"disable": value}} if value is not None else None)
    with no_hang(60):
        result = sftdoctor(["check", "--config", config, "--select", "nccl-env"], root, [config])
    known = isinstance(value, list) and all(v in ("nccl-env", "nccl-env/port-busy") for v in value)
    if value == {}:
        known = False
    assert (result.exit_code == 2) == (value is not None and not known), result.stderr
    if result.exit_code == 2 and "not valid TOML" not in result.stderr:  # a null or a table: no TOML for it
        assert "[checks].disable" in result.stderr


def test_an_unknown_disable_option_is_refused_alike(tmp_path, bare_model):
    config = example(tmp_path, bare_model)
    line = (
        "sftdoctor: error: --disable: no check or message 'dsk-full' (did you mean 'disk-full'?); "
        "see `sftdoctor check --list`"
    )
    with no_hang(60):
        checked = sftdoctor(["check", "--config", config, "--disable", "dsk-full"], tmp_path, ["--disable"])
        dry = sftdoctor(["train", "--dry-run", "--disable", "chat-template,dsk-full", config], tmp_path, ["--disable"])
        trained = sftdoctor(["train", "--no-rehearse", "--disable", "dsk-full", config], tmp_path, ["--disable"])
    for result in (checked, dry, trained):
        assert (result.exit_code, result.stderr.splitlines()) == (2, [line])
