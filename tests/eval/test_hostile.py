"""`sftdoctor eval` on issue 40's hostile inputs, each refused in one line before the first sample runs or the
first model loads: completions that are not a file (a named pipe was read twice and blocked), outputs that
name an input (the results overwrote the completions they scored), a --compare result of wrong types (a
traceback after the evaluation), a local task whose data file is missing (the preflight said "known"); and a
fuzzer over every option of `eval`, read from click, drawing from tests/hostile.py."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import click
import pytest
from cli_contract import sftdoctor
from conftest import EXAMPLES
from hostile import NON_FINITE_JSON, OPTION_TEXT, SPECIAL, no_hang, special_file, wrong_type
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sftdoctor.cli import main
from sftdoctor.errors import InputError, one_line
from sftdoctor.eval.command import code_outputs, read_result, table

TASKS = EXAMPLES / "tiny" / "tasks"
PROBLEM = {"task_id": "t/0", "prompt": "def f():\n", "test": "def check(f):\n    assert f() == 1\n", "entry_point": "f"}
SETTINGS = {
    "num_fewshot": None,
    "limit": 2,
    "apply_chat_template": False,
    "generation": {},
    "task_versions": {"mine": 1.0},
    "lm_eval": "0.4.13",
    "tasks": ["mine"],
}


def result_doc(value=0.5, stderr=0.1) -> dict:
    return {"settings": SETTINGS, "metrics": {"mine": {"acc": {"value": value, "stderr": stderr}}}}


def code_inputs(root: Path) -> tuple[Path, Path]:
    problems, completions = root / "problems.jsonl", root / "completions.jsonl"
    problems.write_text(json.dumps(PROBLEM) + "\n")
    completions.write_text(json.dumps({"task_id": "t/0", "completion": "    return 1\n"}) + "\n")
    return problems, completions


def model_folder(root: Path) -> Path:
    """A model folder `eval` resolves (config.json, tokenizer) without weights: a command that got as far as
    loading it would fail there, so a refusal that names something else came before any model loaded."""
    shutil.copytree(EXAMPLES / "tiny" / "model", root / "model")
    return root / "model"


def task_folder(root: Path, data: str = "count.jsonl") -> Path:
    """The tiny example's choice task as 'mine', its data file named `data` (relative to the folder)."""
    folder = root / "tasks"
    folder.mkdir()
    shutil.copy(TASKS / "count.jsonl", folder / "count.jsonl")
    text = (TASKS / "tiny_count_choice.yaml").read_text().replace("tiny_count_choice", "mine")
    (folder / "mine.yaml").write_text(text.replace("test: count.jsonl", f"test: {data}"))
    return folder


# ---- completions that are not a file --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dev-null", "folder"])
def test_completions_that_are_not_a_file_are_refused_in_one_line_before_any_sample(tmp_path, kind):
    """They are read twice (checked and counted, then run): a pipe gave its lines to the first pass and
    blocked the second for ever, deaf to SIGTERM; /dev/zero never ends."""
    problems, _ = code_inputs(tmp_path)
    fake = special_file(tmp_path / f"c-{kind}.jsonl", kind)
    with no_hang(20):
        result = sftdoctor(["eval", "--code", problems, "--completions", fake], tmp_path, [fake])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"sftdoctor: error: {fake}: expected a completions file, got ")


# ---- outputs that destroy inputs ------------------------------------------------------------------------


def aliases(root: Path, target: Path) -> dict[str, Path]:
    """Other names of `target`: itself, a symbolic link, a hard link, a relative path through a folder."""
    (root / "sub").mkdir(exist_ok=True)
    link, hard = root / f"link-{target.name}", root / f"hard-{target.name}"
    link.symlink_to(target)
    os.link(target, hard)
    return {"same": target, "symlink": link, "hardlink": hard, "dotted": root / "sub" / ".." / target.name}


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dotted"])
@pytest.mark.parametrize("which", ["completions", "problems"])
def test_code_out_naming_an_input_is_refused_and_the_input_kept(tmp_path, how, which):
    problems, completions = code_inputs(tmp_path)
    target = completions if which == "completions" else problems
    before = target.read_bytes()
    out = aliases(tmp_path, target)[how]
    result = sftdoctor(["eval", "--code", problems, "--completions", completions, "--out", out], tmp_path, [out])
    assert result.exit_code == 2 and f"{out}: --out: is the {which} file it reads" in result.stderr
    assert target.read_bytes() == before


@pytest.mark.parametrize(
    "kind, says", [("folder", "is a folder"), ("fifo", "is a named pipe"), ("dev-null", "is a character device")]
)
def test_code_out_that_cannot_be_a_results_file_is_refused_before_any_sample(tmp_path, kind, says):
    """A folder failed after every sample had run, leaving its temporary file."""
    problems, completions = code_inputs(tmp_path)
    out = special_file(tmp_path / "out", kind)
    result = sftdoctor(["eval", "--code", problems, "--completions", completions, "--out", out], tmp_path, [out])
    assert result.exit_code == 2 and result.stderr.startswith(f"sftdoctor: error: {out}: --out: {says}")


def test_code_out_under_a_file_is_refused(tmp_path):
    problems, completions = code_inputs(tmp_path)
    out = completions / "results.jsonl"
    result = sftdoctor(["eval", "--code", problems, "--completions", completions, "--out", out], tmp_path, [out])
    assert result.exit_code == 2 and "is not a folder" in result.stderr


def test_generated_completions_never_land_on_the_results_file(tmp_path):
    """--out without "_results" in its name made the generated completions' file the results file itself."""
    problems, _ = code_inputs(tmp_path)
    out, written = code_outputs(problems, None, tmp_path / "scores.jsonl", generate=True)
    assert (out.name, written.name) == ("scores.jsonl", "scores_completions.jsonl")
    out, written = code_outputs(problems, None, tmp_path / "x_results.jsonl", generate=True)
    assert written.name == "x_completions.jsonl"
    (tmp_path / "p_completions.jsonl").symlink_to(problems)
    with pytest.raises(InputError, match="p_completions.jsonl: --out: is the problems file it reads"):
        code_outputs(problems, None, tmp_path / "p_results.jsonl", generate=True)


# ---- --compare, checked before any model loads ---------------------------------------------------------


@given(bad=wrong_type(0.5))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_score_of_another_type_is_one_line_naming_its_key(tmp_path, bad):
    path = tmp_path / "cmp.json"
    path.write_text(json.dumps(result_doc(value=bad)))
    with pytest.raises(InputError) as caught:
        read_result(path)
    assert str(caught.value).startswith(f"{path}: metrics.mine.acc.value: a JSON ")
    assert str(caught.value).endswith("; expected a number")


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"settings": SETTINGS, "metrics": {"mine": [1]}}, "metrics.mine: a JSON list"),
        ({"settings": SETTINGS, "metrics": {"mine": {"acc": 0.5}}}, "metrics.mine.acc: a JSON number"),
        ({"settings": SETTINGS, "metrics": {"mine": {"acc": {"stderr": 0.1}}}}, "metrics.mine.acc.value: missing"),
        (result_doc(stderr="0.1"), "metrics.mine.acc.stderr: a JSON string"),
        ({"settings": [], "metrics": {}}, r"--compare: not a result written by sftdoctor eval \(no settings"),
    ],
)
def test_a_compare_file_of_wrong_shape_is_named_at_its_key(tmp_path, doc, key):
    path = tmp_path / "cmp.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=f"^{path}: {key}"):
        read_result(path)


@pytest.mark.parametrize(
    "doc, says",
    [
        (result_doc(value="0.5"), "metrics.mine.acc.value: a JSON string; expected a number"),
        (
            {**result_doc(), "settings": {**SETTINGS, "limit": 5}},
            "evaluated with other settings, so the numbers do not compare: limit: 5 vs 2",
        ),
    ],
)
def test_a_compare_file_that_cannot_compare_is_refused_before_any_model_loads(tmp_path, doc, says):
    """Both were found after the evaluation: the string with a traceback in the table, the settings after
    minutes of work."""
    model, include = model_folder(tmp_path), task_folder(tmp_path)
    path = tmp_path / "cmp.json"
    path.write_text(json.dumps(doc))
    result = sftdoctor(
        [
            "eval",
            model,
            "--tasks",
            "mine",
            "--include",
            include,
            "--limit",
            2,
            "--compare",
            path,
            "--out",
            tmp_path / "new.json",
        ],
        tmp_path,
        [path],
    )
    assert result.exit_code == 2 and f"{path}: " in result.stderr and says in result.stderr
    assert "evaluating" not in result.stdout


@pytest.mark.parametrize("literal", NON_FINITE_JSON)
def test_a_non_finite_score_is_never_a_difference(tmp_path, literal):
    """NaN minus anything is NaN: the table said "+nan" as if it were a result."""
    path = tmp_path / "cmp.json"
    path.write_text(json.dumps(result_doc()).replace("0.5", literal))
    previous = read_result(path)
    doc = {**result_doc(0.75), "compared": {"file": str(path), "metrics": previous["metrics"]}}
    shown = table(doc)
    assert "nan" not in shown.split("\n")[1].split()[-1] and "not compared" in shown.split("\n")[1]
    assert "not compared: mine acc: a value is not a number" in shown
    assert not math.isfinite(previous["metrics"]["mine"]["acc"]["value"])


@pytest.mark.parametrize("which", ["compare", "config.json", "task yaml", "task data"])
def test_out_naming_an_input_of_lm_eval_is_refused_before_any_model_loads(tmp_path, which):
    model, include = model_folder(tmp_path), task_folder(tmp_path)
    compare = tmp_path / "cmp.json"
    compare.write_text(json.dumps(result_doc()))
    out = {
        "compare": compare,
        "config.json": model / "config.json",
        "task yaml": include / "mine.yaml",
        "task data": include / "count.jsonl",
    }[which]
    link = tmp_path / "out-link.json"
    link.symlink_to(out)
    result = sftdoctor(
        ["eval", model, "--tasks", "mine", "--include", include, "--limit", 2, "--compare", compare, "--out", link],
        tmp_path,
        [link],
    )
    assert result.exit_code == 2 and f"{link}: --out: is the " in result.stderr


# ---- a local task whose data is not there ----------------------------------------------------------------


@pytest.mark.parametrize(
    "data, says",
    [
        ("gone.jsonl", "no file {include}/gone.jsonl"),
        ("pipe.jsonl", "{include}/pipe.jsonl is a named pipe, not a data file"),
    ],
)
def test_eval_names_the_yaml_the_key_and_the_missing_file_before_any_model_loads(tmp_path, data, says):
    model, include = model_folder(tmp_path), task_folder(tmp_path, data)
    os.mkfifo(include / "pipe.jsonl")
    with no_hang(30):
        result = sftdoctor(
            ["eval", model, "--tasks", "mine", "--include", include, "--out", tmp_path / "r.json"],
            tmp_path,
            [include / "mine.yaml"],
        )
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"sftdoctor: error: {include / 'mine.yaml'}: dataset_kwargs.data_files.test: "
        f"{says.format(include=include)} (task 'mine'"
    )


def test_the_preflight_names_a_missing_data_file_of_a_known_task(tmp_path):
    """The eval-tasks fact (the probe's child, here in-process) and its check: the task is known by name and
    was called so; its data file is not there."""
    from lm_eval.tasks import TaskManager

    from sftdoctor.checks.evaluation import eval_tasks
    from sftdoctor.facts.eval_tasks import data_problems, task_data

    include = task_folder(tmp_path, "sub/gone.jsonl")
    found = task_data(TaskManager(include_path=str(include), include_defaults=False), ["mine"], include)
    assert found == [
        {
            "task": "mine",
            "yaml": "mine.yaml",
            "key": "dataset_kwargs.data_files.test",
            "pattern": "sub/gone.jsonl",
            "base": ".",
        }
    ]
    problems = data_problems(found, include)
    assert [p["problem"] for p in problems] == [f"no file {include}/sub/gone.jsonl"]
    fact = {"installed": True, "unknown": {}, "indexed": 2, "data_files": found, "data_problems": problems}
    finding = eval_tasks(fact)
    assert finding.severity.value == "error"
    assert finding.title == (
        f"[eval] task 'mine' cannot read its data: {include}/mine.yaml: "
        f"dataset_kwargs.data_files.test: no file {include}/sub/gone.jsonl"
    )
    assert eval_tasks({**fact, "data_problems": []}).severity.value == "ok"


@pytest.mark.slow  # 40 tasks built by lm-eval: about 5 s
@given(data=st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_data_files_are_built_or_refused_in_one_line(tmp_path_factory, data):
    """A task's data_files (or data_dir) of any JSON type, or naming a file that is not a file: the task is
    built, or one InputError names its task folder or YAML; never a block on a pipe or a traceback."""
    import yaml as pyyaml

    from sftdoctor.eval.harness import task_manager

    root = tmp_path_factory.mktemp("data")
    include = task_folder(root)
    kind = data.draw(st.sampled_from(SPECIAL), label="kind")
    special_file(include / "special.jsonl", kind)
    key = data.draw(st.sampled_from(["data_files", "data_dir"]), label="key")
    value = data.draw(
        st.sampled_from(
            [
                "special.jsonl",
                "count.jsonl",
                {"test": "special.jsonl"},
                ["special.jsonl"],
                "*.jsonl",
                {"test": ["count.jsonl", "special.jsonl"]},
                ".",
            ]
        )
        | wrong_type({"test": "count.jsonl"}),
        label="value",
    )
    text = (
        (include / "mine.yaml")
        .read_text()
        .replace(
            "  data_files:\n    test: count.jsonl\n",
            pyyaml.safe_dump({key: value}, default_flow_style=True).replace("{", "  ", 1).rsplit("}", 1)[0] + "\n",
        )
    )
    (include / "mine.yaml").write_text(text)
    with no_hang(20):
        try:
            task_manager(["mine"], include)
        except InputError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(str(include))


@pytest.mark.slow  # lm-eval's 14,000 task files indexed in the probe's child: about 10 s
def test_check_config_refuses_a_run_whose_eval_task_has_no_data(tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SFTDOCTOR_CACHE", str(tmp_path_factory.mktemp("cache")))
    include = task_folder(tmp_path, "gone.jsonl")
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    config = tmp_path / "run.toml"
    config.write_text(
        f'[model]\npath = "{EXAMPLES / "tiny" / "model"}"\nweights = "random"\n[data]\ntrain = "d.jsonl"\n'
        f'[eval]\ntasks = ["mine"]\ninclude = "tasks"\n'
    )
    for _ in range(2):  # the second answer comes from the probe cache; the file is still looked for
        result = sftdoctor(["check", "--config", config, "--select", "eval-tasks"], tmp_path, [config])
        assert result.exit_code == 1 and "dataset_kwargs.data_files.test: no file" in result.stdout
        assert "gone.jsonl" in result.stdout
    (include / "gone.jsonl").write_text((include / "count.jsonl").read_text())
    result = sftdoctor(["check", "--config", config, "--select", "eval-tasks"], tmp_path, [config])
    assert result.exit_code == 0 and "its data files are there" in result.stdout


# ---- the fuzzer ------------------------------------------------------------------------------------------

PATH_OPTIONS = {"--include", "--compare", "--out", "--code", "--completions"}
TEXT = [
    *OPTION_TEXT,
    "nan",
    "inf",
    "1e400",
    "abc",
    "a,,b",
    ",",
    "auto",
    "1,0",
    "x\ny",
    "mine",
    "mine,mine",
    "nope",
]


def files(root: Path) -> dict[str, Path]:
    """Every file an option may name: good ones, outputs aliasing inputs, tests/hostile.py's special files,
    results with wrong types and non-finite scores, a task whose data is missing."""
    model, include = model_folder(root), task_folder(root, "gone.jsonl")
    problems, completions = code_inputs(root)
    found = {
        "model": model,
        "include": include,
        "problems": problems,
        "completions": completions,
        "yaml": include / "mine.yaml",
        "config": model / "config.json",
    }
    for name, doc in {
        "result": result_doc(),
        "string": result_doc(value="0.5"),
        "list": result_doc(value=[1]),
        "null": result_doc(value=None),
        "object": result_doc(value={}),
        "bool": result_doc(value=True),
        "shape": {"metrics": []},
    }.items():
        found[f"cmp-{name}"] = root / f"cmp-{name}.json"
        found[f"cmp-{name}"].write_text(json.dumps(doc))
    for literal in NON_FINITE_JSON:
        found[f"cmp-{literal}"] = root / f"cmp-{literal}.json"
        found[f"cmp-{literal}"].write_text(json.dumps(result_doc()).replace("0.5", literal))
    for kind in SPECIAL:
        found[kind] = special_file(root / f"special-{kind}", kind)
    for target in ("completions", "problems", "cmp-result"):
        for how, path in aliases(root, found[target]).items():
            found[f"{how}-{target}"] = path
    found["under-file"] = completions / "x.jsonl"
    found["new"] = root / "new" / "out.json"
    found["missing"] = root / "missing.jsonl"
    return found


GOOD = {
    "--limit": ["1", "2"],
    "--num-fewshot": ["0", "1"],
    "--batch-size": ["1", "auto"],
    "--samples": ["1", "2"],
    "--k": ["1", "1,2"],
    "--workers": ["1", "2"],
    "--timeout": ["0.5", "5"],
    "--max-new-tokens": ["4"],
    "--temperature": ["0", "0.8"],
    "--tasks": ["mine"],
    "--base": ["model"],
}
LOCAL_TASKS = ["mine", "mine,mine", "", " ", ","]  # another name would index lm-eval's 14,000 tasks: seconds each


@st.composite
def eval_lines(draw, found: dict[str, Path]):
    """`eval` in one of its two modes (lm-eval on TARGET, or --code), with a few more of its options (every one
    of click's may come), each given a value of its kind: mostly good, else hostile."""
    command = main.commands["eval"]
    options = [p for p in command.params if isinstance(p, click.Option) and "--help" not in p.opts]
    path = st.sampled_from(sorted(found)).map(lambda k: str(found[k]))
    argv, names = ["eval"], {"eval"} | {str(p) for p in found.values()}

    def value(flag: str, option) -> str:
        if flag in PATH_OPTIONS:
            return draw(path)
        if flag == "--tasks":
            return draw(st.sampled_from(LOCAL_TASKS))
        good = [str(found[g]) if g in found else g for g in GOOD.get(flag, [])]
        good += list(getattr(option.type, "choices", []))
        hostile = st.sampled_from(TEXT) | path if flag in ("--model", "--base") else st.sampled_from(TEXT)
        return draw(st.sampled_from(good) | hostile if good else hostile)

    if draw(st.booleans()):
        argv += ["--code", draw(st.sampled_from([str(found["problems"])]) | path)]
        argv += ["--completions", draw(st.sampled_from([str(found["completions"])]) | path)]
    else:
        argv += [draw(st.sampled_from([str(found["model"])]) | path), "--tasks", draw(st.sampled_from(LOCAL_TASKS))]
    for option in draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda p: p.name)):
        flag = option.opts[-1] if option.opts[-1].startswith("--") else option.opts[0]
        names.update(option.opts)
        argv += [flag] if option.is_flag else [flag, value(flag, option)]
    if "--code" in argv:
        argv += ["--sandbox", "docker"]  # no daemon here: refused before any sample runs or any model loads
    elif "--include" not in argv:
        argv += ["--include", str(found["include"])]  # never lm-eval's 14,000 tasks: its task has no data
    return argv, names | {one_line(v) for v in argv[1:] if v.strip()}


@pytest.mark.slow  # about 15 s: 120 command lines in-process, each refused before any work
@given(data=st.data())
@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
def test_every_option_of_eval_on_hostile_files(tmp_path_factory, data):
    """Never a traceback, a block, a file left behind or a verdict on work not done: whatever the mix, `eval`
    is refused (exit 2, one line naming what is at fault) before any sample runs or any model loads."""
    root = tmp_path_factory.mktemp("eval")
    found = files(root)
    argv, names = data.draw(eval_lines(found), label="argv")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        with no_hang(60):
            result = sftdoctor(argv, root, sorted(names))
    assert result.exit_code == 2, result.output
    assert "evaluating" not in result.stdout  # no model loaded


# ---- SIGTERM ------------------------------------------------------------------------------------------------


@pytest.mark.slow  # a real model loaded and lm-eval started in a child: about 20 s
def test_sigterm_stops_an_lm_eval_evaluation_promptly_and_leaves_nothing(tmp_path):
    """A scheduler's SIGTERM unwinds like Ctrl-C: exit 143, no result and no temporary file."""
    import signal
    import subprocess
    import sys
    import time

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = tmp_path / "model"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(EXAMPLES / "tiny" / "model")).save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EXAMPLES / "tiny" / "model" / name, model / name)
    assert torch  # the stack is here
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sftdoctor",
            "eval",
            str(model),
            "--tasks",
            "tiny_count_gen",
            "--include",
            str(TASKS),
            "--out",
            str(tmp_path / "r.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "sftdoctor: evaluating" in proc.stdout.readline()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 128 + signal.SIGTERM and time.monotonic() - began < 15
    assert "interrupted; no result was written" in proc.stderr.read()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
