"""SWEEP.toml read and checked: the defaults, every space key against the run-config schema, one line per
problem; the run configs it writes read back as written."""

from __future__ import annotations

import inspect
import math
import sys
import traceback
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli_fuzz import ODD_JSON, broken_text, mutated_json  # the CLI fuzz's mutations of real inputs

from sftdoctor.cli import main
from sftdoctor.errors import InputErrors
from sftdoctor.run import load_run_config
from sftdoctor.sweep.config import dumps, grid_size, load_sweep, toml_string

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENV = {"SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:  # pragma: no cover (click < 8.2)
    RUNNER = CliRunner(env=ENV, mix_stderr=False)
else:
    RUNNER = CliRunner(env=ENV)
FUZZ = settings(
    deadline=None, max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

BASE = """[model]
path = "org/model"

[data]
train = "train.jsonl"
eval = "eval.jsonl"

[training]
learning_rate = 1e-4
min_lr_rate = 0.1
max_steps = 20
eval_steps = 5
"""


@pytest.fixture
def folder(tmp_path):
    """A base run config (a hub model, local data) and nothing else: sweep files are written beside it."""
    for name in ("train.jsonl", "eval.jsonl"):
        (tmp_path / name).write_text('{"text": "a"}\n')
    (tmp_path / "base.toml").write_text(BASE)
    return tmp_path


def write(folder: Path, text: str, name: str = "sweep.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def sweep_text(space: str, sweep: str = "") -> str:
    return f'[sweep]\nbase = "base.toml"\n{sweep}\n[space]\n{space}\n'


def problems(folder: Path, space: str, sweep: str = "") -> list[str]:
    with pytest.raises(InputErrors) as caught:
        load_sweep(write(folder, sweep_text(space, sweep)))
    return [str(e) for e in caught.value.errors]


def test_every_key_has_choices_so_the_grid_runs_every_point_once(folder):
    path = write(
        folder,
        sweep_text(
            'training.warmup_ratio = {choices = [0.0, 0.03, 0.1]}\n"training.weight_decay" = {choices = [0.0, 0.1]}'
        ),
    )
    sweep = load_sweep(path)
    assert (sweep.sampler, sweep.trials, grid_size(sweep.space)) == ("grid", 6, 6)
    assert (sweep.objective, sweep.direction, sweep.pruner, sweep.study) == ("eval_loss", "minimize", "median", "sweep")
    assert sweep.output_dir == folder / "sweeps" / "sweep"
    assert [d.name for d in sweep.space] == ["training.warmup_ratio", "training.weight_decay"]


def test_the_three_ways_toml_writes_a_dotted_key_are_one_space(folder):
    forms = [
        "training.learning_rate = {log_uniform = [1e-6, 1e-4]}",
        '"training.learning_rate" = {log_uniform = [1e-6, 1e-4]}',
        "[space.training]\nlearning_rate = {log_uniform = [1e-6, 1e-4]}",
    ]
    spaces = set()
    for i, form in enumerate(forms):
        text = sweep_text("", "trials = 4") + form + "\n" if form.startswith("[") else sweep_text(form, "trials = 4")
        spaces.add(load_sweep(write(folder, text, f"s{i}.toml")).space)
    assert len(spaces) == 1
    [(dim,)] = spaces
    assert (dim.kind, dim.low, dim.high, dim.log) == ("log_uniform", 1e-6, 1e-4, True)


def test_a_range_samples_with_tpe_and_the_budget_must_be_given(folder):
    assert problems(folder, "training.learning_rate = {log_uniform = [1e-6, 1e-4]}") == [
        f"{folder / 'sweep.toml'}: [sweep].trials: missing; expected an integer from 1 to 100000 (the budget: how "
        "many trials to run)"
    ]
    sweep = load_sweep(write(folder, sweep_text("training.learning_rate = {log_uniform = [1e-6, 1e-4]}", "trials = 8")))
    assert (sweep.sampler, sweep.trials) == ("tpe", 8)


def test_a_budget_above_the_grid_is_the_grid_and_says_so(folder):
    sweep = load_sweep(write(folder, sweep_text("lora.r = {choices = [8, 16]}", "trials = 10")))
    assert sweep.trials == 2 and sweep.notes == ("the grid has 2 points: the budget is 2, not 10",)


def test_an_lm_eval_objective_is_maximised_without_a_pruner(folder):
    (folder / "tasks").mkdir()
    (folder / "base.toml").write_text(BASE + '\n[eval]\ntasks = ["arc_easy"]\ninclude = "tasks"\n')
    sweep = load_sweep(write(folder, sweep_text("lora.r = {choices = [8, 16]}", 'objective = "eval:arc_easy/acc"')))
    assert (sweep.direction, sweep.pruner, sweep.task_metric) == ("maximize", "none", ("arc_easy", "acc"))


BAD = [
    (
        "training.learnig_rate = {choices = [1e-4]}",
        "[space].training.learnig_rate: unknown key (did you mean 'learning_rate'?)",
    ),
    (
        "trainig.learning_rate = {choices = [1e-4]}",
        "[space].trainig.learning_rate: unknown section; expected one of model, ",
    ),
    ("lora.rank = {choices = [8]}", "[space].lora.rank: unknown key (did you mean 'r'?)"),
    (
        "training.learning_rate = {uniform = [1e-3, 1e-4]}",
        "uniform: empty range [0.001, 0.0001]: LOW must be below HIGH",
    ),
    ("training.learning_rate = {log_uniform = [1e-4, 1e-4]}", "log_uniform: empty range"),
    (
        "training.learning_rate = {log_uniform = [0.0, 1e-3]}",
        "log_uniform: a log range needs bounds above 0, got [0, 0.001]",
    ),
    ("training.per_device_batch_size = {log_int = [0, 8]}", "log_int: a log range needs bounds above 0"),
    (
        "training.learning_rate = {log_uniform = [1e-6, 2.0]}",
        "log_uniform: 2 is not a value of training.learning_rate: expected a number > 0 and <= 1",
    ),
    ("training.warmup_ratio = {choices = [0.0, 1.5]}", "choices: 1.5 is not a value of training.warmup_ratio"),
    ("training.per_device_batch_size = {uniform = [1, 8]}", "which training.per_device_batch_size does not take"),
    ("training.per_device_batch_size = {int = [1.5, 8]}", "int: expected [LOW, HIGH], two integers, got [1.5, 8]"),
    ("training.epochs = {uniform = [1, 3], step = 0.7}", "step 0.7 does not divide the range [1, 3]"),
    (
        "training.learning_rate = {log_uniform = [1e-6, 1e-4], step = 1e-6}",
        "step goes with uniform or int, not log_uniform",
    ),
    (
        "training.learning_rate = {log_uniforn = [1e-6, 1e-4]}",
        "unknown entry 'log_uniforn' (did you mean 'log_uniform'?)",
    ),
    ("training.learning_rate = {choices = []}", "choices: expected a non-empty list of values, got []"),
    ("lora.r = {choices = [8, 8]}", "choices: a value is given twice"),
    ('lora.target_modules = {choices = [["q_proj"], "all-linear"]}', "is not a single value"),
    ('training.output_dir = {choices = ["a", "b"]}', "not searched: the sweep gives each trial its own run directory"),
    (
        "training.learning_rate = 1e-4",
        "expected a table: {choices = [...]}, or a range {uniform|log_uniform|int|log_int",
    ),
    ("learning_rate = {choices = [1e-4]}", "[space].learning_rate: expected a run-config key SECTION.KEY = {choices"),
    (
        'training.lr_scheduler = {choices = ["cosine", "linear"]}',
        "with training.lr_scheduler = cosine, the trial's run config is invalid: "
        "[training]: a learning-rate floor needs "
        'lr_scheduler = "cosine_with_min_lr"',
    ),
]


@pytest.mark.parametrize("space,expected", BAD, ids=[b[1][:40] for b in BAD])
def test_a_bad_space_is_one_line_naming_the_file_and_the_key(folder, space, expected):
    found = problems(folder, space, "trials = 4")
    assert any(expected in line for line in found), found
    assert all(line.startswith(str(folder / "sweep.toml")) and "\n" not in line for line in found), found


BAD_SWEEP = [
    ("trials = 0", "[sweep].trials: expected an integer from 1 to 100000, got 0"),
    ("trails = 4", "[sweep].trails: unknown key (did you mean 'trials'?)"),
    (
        'sampler = "grid"\ntrials = 4',
        "the grid sampler needs choices for every key: training.learning_rate is a log_uniform range",
    ),
    (
        'objective = "eval:mmlu/acc"\ntrials = 4',
        "objective eval:mmlu/acc: the base's [eval] tasks are none (no [eval] table)",
    ),
    (
        'objective = "eval:mmlu/acc"\npruner = "median"\ntrials = 4',
        "is measured once, after the run: a pruner has nothing",
    ),
    ('objective = "loss"\ntrials = 4', '[sweep].objective: expected "eval_loss" or "eval:TASK/METRIC", got \'loss\''),
    ('direction = "down"\ntrials = 4', "[sweep].direction: expected one of minimize, maximize"),
]


@pytest.mark.parametrize("sweep,expected", BAD_SWEEP, ids=[b[1][:40] for b in BAD_SWEEP])
def test_a_bad_sweep_table_is_one_line(folder, sweep, expected):
    found = problems(folder, "training.learning_rate = {log_uniform = [1e-6, 1e-4]}", sweep)
    assert any(expected in line for line in found), found


def test_eval_loss_needs_eval_data_and_an_evaluation_inside_the_run(folder):
    (folder / "base.toml").write_text(
        BASE.replace('eval = "eval.jsonl"\n', "").replace("eval_steps = 5", "eval_steps = 50")
    )
    found = problems(folder, "lora.r = {choices = [8]}")
    needs = "objective eval_loss needs eval data: [data] eval, eval_fraction or eval_split"
    assert any(needs in line for line in found), found
    (folder / "base.toml").write_text(  # a hub dataset's own eval split is eval data
        BASE.replace('train = "train.jsonl"\neval = "eval.jsonl"\n', 'train = "org/rows"\neval_split = "test"\n')
    )
    load_sweep(write(folder, sweep_text("lora.r = {choices = [8]}", "trials = 1")))
    (folder / "base.toml").write_text(BASE.replace("eval_steps = 5", "eval_steps = 50"))
    found = problems(folder, "lora.r = {choices = [8]}")
    assert any(
        "evaluates every 50 steps (eval_steps) and stops at step 20: no evaluation would run" in line for line in found
    )


def test_the_base_is_checked_as_train_checks_it_its_errors_naming_its_own_file(folder):
    (folder / "base.toml").write_text(BASE.replace("learning_rate = 1e-4", "learnig_rate = 1e-4"))
    found = problems(folder, "lora.r = {choices = [8]}")
    assert found == [
        f"{folder / 'base.toml'}: [training].learnig_rate: unknown key (did you mean 'learning_rate'?); "
        "known keys: " + found[0].split("known keys: ")[1]
    ]
    with pytest.raises(InputErrors) as caught:
        load_sweep(write(folder, '[sweep]\nbase = "nope.toml"\n[space]\nlora.r = {choices = [8]}\n'))
    assert [str(e) for e in caught.value.errors] == [
        f"{folder / 'sweep.toml'}: [sweep].base: file not found: nope.toml (looked for {folder / 'nope.toml'})"
    ]


def test_every_problem_is_reported_at_once(folder):
    found = problems(folder, "training.learnig_rate = {choices = [1e-4]}\nlora.r = {int = [8, 4]}", "trials = 0")
    assert len(found) == 3, found


# ---------------------------------------------------------------- the command


def cli(args):
    result = RUNNER.invoke(main, [str(a) for a in args])
    shown = f"[exit {result.exit_code}]\n{result.stdout}\n{result.stderr}"
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        shown += "".join(traceback.format_exception(*result.exc_info))
    assert result.exception is None or isinstance(result.exception, SystemExit), shown
    assert "Traceback" not in result.stdout + result.stderr, shown
    return result, shown


@pytest.mark.parametrize("space,expected", BAD[:8], ids=[b[1][:40] for b in BAD[:8]])
def test_the_command_refuses_bad_input_in_one_line_with_exit_2(folder, space, expected):
    result, shown = cli(["sweep", write(folder, sweep_text(space, "trials = 4")), "--dry-run"])
    assert result.exit_code == 2, shown
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("sftdoctor: error: ") for line in lines), shown
    assert any(expected in line for line in lines), shown


def test_a_dry_run_shows_the_space_and_runs_nothing(folder):
    path = write(
        folder,
        sweep_text("training.learning_rate = {log_uniform = [1e-6, 1e-4]}\nlora.r = {choices = [8, 16]}", "trials = 4"),
    )
    before = sorted(p.name for p in folder.rglob("*"))
    result, shown = cli(["sweep", path, "--dry-run"])
    assert result.exit_code == 0, shown
    assert "tpe sampler, median pruner, a budget of 4 trials; objective eval_loss (minimize)" in result.stdout
    assert "training.learning_rate  log-uniform 1e-06 to 0.0001" in result.stdout
    assert "lora.r                  choices 8, 16" in result.stdout
    assert "no study yet" in result.stdout
    assert sorted(p.name for p in folder.rglob("*")) == before


# ---------------------------------------------------------------- writing TOML back

SCALARS = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=20),
)
TABLES = st.dictionaries(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8),
    st.dictionaries(
        st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8),
        SCALARS | st.lists(SCALARS, max_size=3),
        max_size=4,
    ),
    max_size=4,
)


@FUZZ
@given(TABLES)
def test_a_run_config_written_back_reads_back_equal(tables):
    assert tomllib.loads(dumps(tables, header="a header\nin two lines")) == tables


def test_a_trials_run_config_is_a_run_config_train_loads(folder, tmp_path):
    sweep = load_sweep(
        write(
            folder,
            sweep_text(
                "lora.r = {choices = [8, 16]}\ntraining.learning_rate = {log_uniform = [1e-6, 1e-4]}", "trials = 2"
            ),
        )
    )
    run_dir = tmp_path / "elsewhere" / "trial-0003"
    run_dir.mkdir(parents=True)
    (run_dir / "run.toml").write_text(dumps(sweep.trial_raw({"lora.r": 16, "training.learning_rate": 3e-5}, run_dir)))
    run = load_run_config(run_dir / "run.toml")  # its paths absolute: it loads from any folder
    assert (run.lora.r, run.training.learning_rate, run.training.output_dir) == (16, 3e-5, str(run_dir))
    assert run.data.train == (str(folder / "train.jsonl"),) and run.training.min_lr_rate == 0.1


def test_a_string_with_every_kind_of_character_is_a_toml_string():
    text = 'a"b\\c\nd\te\x00f\x7fg\u2028ü😀'
    assert tomllib.loads(f"k = {toml_string(text)}")["k"] == text


# ---------------------------------------------------------------- fuzz: broken sweep files, one line each

VALID = {
    "sweep": {"base": "base.toml", "trials": 3, "sampler": "tpe", "pruner": "median", "seed": 0},
    "space": {
        "training": {"learning_rate": {"log_uniform": [1e-6, 1e-4]}, "warmup_ratio": {"choices": [0.0, 0.1]}},
        "lora.r": {"int": [4, 16], "step": 4},
    },
}


def as_toml(doc) -> str:
    """Any JSON-like tree as TOML: tables of tables, inline tables below; None left out; nan and inf as TOML
    writes them."""

    def value(v):
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return toml_string(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v if x is not None) + "]"
        return "{" + ", ".join(f"{toml_string(k)} = {value(x)}" for k, x in v.items() if x is not None) + "}"

    lines = []
    for name, body in doc.items():
        if isinstance(body, dict):
            lines.append(f"[{toml_string(name)}]")
            lines += [f"{toml_string(k)} = {value(v)}" for k, v in body.items() if v is not None]
        elif body is not None:
            lines.insert(0, f"{toml_string(name)} = {value(body)}")
    return "\n".join(lines) + "\n"


NAMES = st.sampled_from(
    [
        "base",
        "trials",
        "sampler",
        "pruner",
        "objective",
        "direction",
        "narrow",
        "study",
        "space",
        "training",
        "learning_rate",
        "choices",
        "uniform",
        "log_uniform",
        "int",
        "log_int",
        "step",
        "lora",
        "r",
        "data",
        "max_length",
        "output_dir",
        "eval:x/acc",
    ]
)


@FUZZ
@given(st.data())
def test_a_broken_sweep_file_is_refused_in_one_line_per_problem_never_a_traceback(folder, data):
    text = as_toml(VALID)
    if data.draw(st.booleans()):
        try:
            text = as_toml(data.draw(mutated_json(VALID, values=ODD_JSON, names=NAMES)))
        except (AttributeError, TypeError):  # the root made something that is not a table of tables
            text = data.draw(broken_text(text))
    else:
        text = data.draw(broken_text(text))
    path = write(folder, text)
    before = sorted(p.name for p in folder.rglob("*"))
    result, shown = cli(["sweep", path, "--dry-run"])
    shown = f"--- sweep.toml\n{text}\n" + shown
    assert result.exit_code in (0, 2), shown
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert lines, shown
        for line in lines:
            assert line.startswith("sftdoctor: error: "), shown
            assert str(path) in line or str(folder / "base.toml") in line, shown
    assert sorted(p.name for p in folder.rglob("*")) == before, shown


def test_every_shipped_sweep_example_reads_and_narrows():
    examples = sorted((Path(__file__).parents[2] / "examples" / "sweep").glob("*.toml"))
    assert examples
    for example in examples:
        result, shown = cli(["sweep", example, "--dry-run"])
        assert result.exit_code == 0, (example, shown)


def test_reading_a_sweep_file_imports_neither_optuna_nor_torch():
    import subprocess

    code = (
        "import sys, sftdoctor.sweep.config; "
        "print(sorted(m for m in ('optuna', 'torch', 'transformers') if m in sys.modules))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )
