"""files: atomic, durable writes that leave the old file or the new one, never half of one."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from megapilot.files import DiskFullError, atomic_write_bytes, atomic_write_text, free_bytes, is_disk_full


def test_a_write_replaces_the_file_whole_with_its_mode_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "suite.json"
    target.write_text("old")
    assert atomic_write_text(target, "new ünïcode", mode=0o600) == target
    assert target.read_text(encoding="utf-8") == "new ünïcode"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["suite.json"]


def test_a_failed_write_keeps_the_old_target_and_removes_its_temporary(tmp_path):
    target = tmp_path / "deck"
    target.mkdir()  # a rename cannot replace a directory with a file
    (target / "inside").write_text("kept")
    with pytest.raises(OSError) as caught:
        atomic_write_bytes(target, b"x" * 100)
    assert not isinstance(caught.value, DiskFullError)
    assert (target / "inside").read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["deck"]


def test_a_full_disk_names_the_path_the_free_space_and_the_size(tmp_path):
    error = DiskFullError(tmp_path / "report.html", 3 * (1 << 20))
    assert error.errno == errno.ENOSPC and is_disk_full(error)
    assert str(error).startswith(f"no space left on the device of {tmp_path}/report.html: ")
    assert str(error).endswith(" free, 3.0 MiB to write")
    assert DiskFullError(tmp_path, 512).args[1].endswith("512 B to write")


def test_only_no_space_and_quota_errors_count_as_a_full_disk():
    assert is_disk_full(OSError(errno.EDQUOT, "quota"))
    assert not is_disk_full(OSError(errno.EACCES, "denied")) and not is_disk_full(ValueError("x"))


def test_free_space_is_read_from_the_nearest_existing_parent(tmp_path):
    expected = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    measured = free_bytes(tmp_path / "not" / "yet" / "made")
    assert abs(measured - expected) < 64 << 20  # the same file system, give or take other writers
