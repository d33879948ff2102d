"""Files written whole or not at all."""

import pytest

from sftdoctor.files import write_atomic


def test_a_file_is_replaced_whole_with_its_mode(tmp_path):
    path = tmp_path / "sbatch.sh"
    path.write_text("old")
    write_atomic(path, "#!/bin/bash\n", mode=0o755)
    assert path.read_text() == "#!/bin/bash\n" and path.stat().st_mode & 0o777 == 0o755
    write_atomic(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"
    assert [p.name for p in tmp_path.iterdir()] == ["sbatch.sh"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "resolved.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        write_atomic(path, None)  # neither text nor bytes: fails while writing the temporary file
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "folder", "x")  # fails at the rename
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["folder", "resolved.json"]
