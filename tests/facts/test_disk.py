"""facts.disk: the free space of the filesystem output_dir will be on, measured on this machine's real disk."""

import os

from conftest import make_run

from sftdoctor.facts import Facts
from sftdoctor.facts.disk import nearest_existing, probe_disk_space


def test_an_output_dir_not_yet_created_is_measured_on_its_nearest_existing_folder(tmp_path):
    run = make_run(tmp_path, training={"output_dir": str(tmp_path / "runs" / "a" / "b")})
    found = probe_disk_space(Facts.replay({"run": run}))
    assert found["probed"] == str(tmp_path) and found["output_dir"] == str(tmp_path / "runs" / "a" / "b")
    st = os.statvfs(tmp_path)
    assert found["total_bytes"] == st.f_blocks * st.f_frsize
    # another process may write meanwhile: the same filesystem's free space, within 64 MiB
    assert abs(found["free_bytes"] - st.f_bavail * st.f_frsize) < 64 * 2**20


def test_without_a_run_config_there_is_no_output_dir_to_measure():
    assert probe_disk_space(Facts.replay({})) is None


def test_the_nearest_existing_folder_of_a_relative_path_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert nearest_existing(tmp_path.relative_to(tmp_path) / "x" / "y") == tmp_path
