"""Complete-or-absent checkpoints (train/checkpoints.py): numeric order, the completion marker, resume and cleanup."""

from __future__ import annotations

from sftdoctor.run.checkpoints import (
    MARKER,
    checkpoints,
    is_complete,
    mark_complete,
    newest_complete,
    remove_incomplete,
)


def saved(output_dir, step, complete=True):
    """A checkpoint folder as transformers leaves it, marked complete or not (a save cut short)."""
    path = output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    if complete:
        mark_complete(path, step)
    return path


def test_checkpoints_are_sorted_by_step_number_not_by_name(tmp_path):
    for step in (10, 9, 100, 2):
        saved(tmp_path, step)
    assert [step for step, _ in checkpoints(tmp_path)] == [2, 9, 10, 100]
    assert [path.name for _, path in checkpoints(tmp_path)][-2:] == ["checkpoint-10", "checkpoint-100"]


def test_other_entries_of_the_run_directory_are_not_checkpoints(tmp_path):
    saved(tmp_path, 5)
    (tmp_path / "checkpoint-6.tmp").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-7").write_text("a file, not a folder")
    (tmp_path / "final").mkdir()
    assert [step for step, _ in checkpoints(tmp_path)] == [5]


def test_a_missing_run_directory_has_no_checkpoints(tmp_path):
    assert checkpoints(tmp_path / "never-ran") == []
    assert newest_complete(tmp_path / "never-ran") is None
    assert remove_incomplete(tmp_path / "never-ran") == []


def test_only_marked_checkpoints_are_complete(tmp_path):
    done, cut = saved(tmp_path, 1), saved(tmp_path, 2, complete=False)
    assert is_complete(done) and not is_complete(cut)
    assert (done / MARKER).read_text() == "1\n"  # the marker records the step it completes


def test_resume_skips_a_newer_checkpoint_left_half_written_by_a_killed_run(tmp_path):
    saved(tmp_path, 9)
    older_complete = saved(tmp_path, 10)
    saved(tmp_path, 20, complete=False)  # killed mid-save: trainer_state.json may be there, the marker is not
    assert newest_complete(tmp_path) == older_complete


def test_no_complete_checkpoint_means_a_fresh_start(tmp_path):
    saved(tmp_path, 3, complete=False)
    assert newest_complete(tmp_path) is None


def test_remove_incomplete_deletes_only_unmarked_checkpoints(tmp_path):
    keep = [saved(tmp_path, 10), saved(tmp_path, 30)]
    cut = [saved(tmp_path, 20, complete=False), saved(tmp_path, 40, complete=False)]
    other = tmp_path / "logs"
    other.mkdir()
    removed = remove_incomplete(tmp_path)
    assert removed == cut
    assert not any(path.exists() for path in cut)
    assert all((path / "trainer_state.json").is_file() for path in keep)
    assert other.is_dir()
    assert newest_complete(tmp_path) == keep[-1]


def test_mark_complete_leaves_only_the_marker_and_no_temp_file(tmp_path):
    path = saved(tmp_path, 7, complete=False)
    mark_complete(path, 7)
    assert sorted(p.name for p in path.iterdir()) == sorted(["trainer_state.json", MARKER])


def test_marking_again_replaces_the_marker_whole(tmp_path):
    path = saved(tmp_path, 7)
    mark_complete(path, 8)
    assert (path / MARKER).read_text() == "8\n"
    assert [p.name for p in path.iterdir() if p.name.startswith(".")] == []


def test_a_temp_marker_left_by_a_crash_mid_mark_does_not_make_a_checkpoint_complete(tmp_path):
    path = saved(tmp_path, 4, complete=False)
    (path / f".{MARKER}.tmp").write_text("4")  # the process died between writing and renaming
    assert not is_complete(path)
    assert newest_complete(tmp_path) is None
    assert remove_incomplete(tmp_path) == [path]
