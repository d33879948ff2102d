"""The user's own lm-eval tasks (--include) are built before any model loads: a mistake in one is one line
naming the folder and the task, not a traceback from lm-eval, datasets or jinja after the model loaded."""

import shutil

import pytest
from conftest import EXAMPLES
from hostile import no_hang

from sftdoctor.errors import InputError
from sftdoctor.eval.harness import task_manager, unreadable_yamls

TASKS = EXAMPLES / "tiny" / "tasks"
CHOICE = (TASKS / "tiny_count_choice.yaml").read_text().replace("tiny_count_choice", "mine")


def folder(tmp_path, yaml: str | bytes, data: bytes | None = None):
    shutil.copy(TASKS / "count.jsonl", tmp_path / "count.jsonl")
    if data is not None:
        (tmp_path / "count.jsonl").write_bytes(data)
    path = tmp_path / "mine.yaml"
    path.write_bytes(yaml if isinstance(yaml, bytes) else yaml.encode())
    return tmp_path


@pytest.mark.parametrize(
    "yaml, data, says",
    [
        (CHOICE, b"not json\n", "(ValueError: "),
        (CHOICE, b"", "(StopIteration: no documents in its split)"),
        (CHOICE.replace("{{choices}}", "{{no_such_field}}"), None, "(UndefinedError: 'no_such_field' is undefined)"),
        (
            CHOICE.replace("output_type: multiple_choice", "output_type: choose"),
            None,
            "Got invalid output_type 'choose'",
        ),
        (
            CHOICE.replace('doc_to_text: "', "doc_to_text: !function utils.nope\n#"),
            None,
            "(ModuleNotFoundError: No module named 'utils')",
        ),
    ],
)
def test_a_task_of_ones_own_that_cannot_be_built_is_named_before_the_model_loads(tmp_path, yaml, data, says):
    include = folder(tmp_path, yaml, data)
    with pytest.raises(InputError) as caught:
        task_manager(["mine"], include)
    message = str(caught.value)
    assert message.startswith(f"{include}: --include: task 'mine' cannot be built by lm-eval (") and says in message


@pytest.mark.parametrize(
    "data_files, says",
    [
        ("{test: gone.jsonl}", "dataset_kwargs.data_files.test: no file {include}/gone.jsonl"),
        ("[count.jsonl, sub/gone.jsonl]", "dataset_kwargs.data_files[1]: no file {include}/sub/gone.jsonl"),
        ("{test: 'nothing*.jsonl'}", "dataset_kwargs.data_files.test: no file matches {include}/nothing*.jsonl"),
        ("{test: pipe.jsonl}", "dataset_kwargs.data_files.test: {include}/pipe.jsonl is a named pipe, not a data file"),
    ],
)
def test_a_data_file_that_is_not_there_is_named_with_its_yaml_and_key_before_lm_eval_reads(tmp_path, data_files, says):
    """lm-eval knows the task by its YAML alone; its data is read only when the task is built, and datasets
    then says "Unable to find" without the YAML or the key (a named pipe it skips as if it were missing)."""
    import os

    include = folder(tmp_path, CHOICE.replace("  data_files:\n    test: count.jsonl", f"  data_files: {data_files}"))
    os.mkfifo(include / "pipe.jsonl")
    with no_hang(20), pytest.raises(InputError) as caught:
        task_manager(["mine"], include)
    assert str(caught.value).startswith(f"{include / 'mine.yaml'}: {says.format(include=include)} (task 'mine'")


def test_data_files_are_found_as_datasets_finds_them(tmp_path):
    """Relative to data_dir when it is given, a glob that matches, a group's tasks: all there, all built."""
    (tmp_path / "data").mkdir()
    shutil.copy(TASKS / "count.jsonl", tmp_path / "data" / "part-1.jsonl")
    yaml = CHOICE.replace(
        "  data_files:\n    test: count.jsonl", "  data_dir: data\n  data_files: {test: 'part-*.jsonl'}"
    )
    (tmp_path / "mine.yaml").write_text(yaml)
    (tmp_path / "both.yaml").write_text("group: both\ntask: [mine]\n")
    assert "mine" in task_manager(["both"], tmp_path).all_tasks


@pytest.mark.slow  # a name not in the folder indexes lm-eval's 14,000 bundled tasks: 7 s
@pytest.mark.parametrize(
    "yaml, says",
    [
        (b"\xff\xfe task: mine", "mine.yaml: not UTF-8"),
        ("task: mine\n  bad: [indent\n", "mine.yaml: not YAML (line 2)"),
    ],
)
def test_a_yaml_lm_eval_skips_in_silence_is_named_with_the_unknown_task(tmp_path, yaml, says):
    with pytest.raises(InputError) as caught:
        task_manager(["mine"], folder(tmp_path, yaml))
    assert str(caught.value) == f"--tasks: no lm-eval task 'mine'; --include holds YAML lm-eval cannot read: {says}"


def test_the_bundled_tasks_build():
    assert {"tiny_count_choice", "tiny_count_gen"} <= set(
        task_manager(["tiny_count_choice", "tiny_count_gen"], TASKS).all_tasks
    )


def test_only_yaml_that_cannot_be_read_is_listed(tmp_path):
    (tmp_path / "a.yaml").write_text("task: a\ndoc_to_text: !function utils.prompt\n")  # lm-eval's tag: fine
    (tmp_path / "b.yaml").write_bytes(b"\xff\xfe")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yml").write_text("task: [c\n")
    assert unreadable_yamls(tmp_path) == ["b.yaml: not UTF-8", "c.yml: not YAML (line 2)"]
