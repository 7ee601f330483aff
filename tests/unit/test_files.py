"""fedx.files: atomic writes that leave a whole file, readable by others, or nothing."""

import json
import stat

import pytest

from fedx.files import write_atomically, write_json_atomically


def test_written_files_are_whole_and_readable_by_other_users(tmp_path):
    """Results and checkpoints are 0644, not the 0600 of a temporary file: a
    ServerApp in a container writes them as uid 49999 and the user on the host
    reads them (tests/system/test_containers.py)."""
    path = tmp_path / "metrics.json"
    write_json_atomically(path, {"round": 3, "accuracy": [0.5, 0.75]})
    assert json.loads(path.read_text()) == {"round": 3, "accuracy": [0.5, 0.75]}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "checkpoint.json"
    path.write_text("old")

    def fail(handle):
        handle.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]
