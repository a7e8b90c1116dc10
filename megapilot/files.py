"""Files written so that a crash, a signal or a full disk never leaves half of one.

`atomic_write_text` writes a temporary file next to the target, flushes it to the disk (fsync), renames
it over the target and syncs the directory: a reader (or a resume after a reboot) sees the old file or
the new one, never a mix. On any failure the temporary file is removed and the old file stays as it was.
A full disk is one `DiskFullError` naming the path, the free space and how much was to be written.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path


class DiskFullError(OSError):
    """No space left where megapilot had to write: names the path, the free space and what was to be written."""

    def __init__(self, path: Path, size_bytes: int):
        self.path = path
        self.size_bytes = size_bytes
        self.free_bytes = free_bytes(path)
        super().__init__(errno.ENOSPC, f"no space left on the device of {path}: {human_size(self.free_bytes)} free, "
                                       f"{human_size(size_bytes)} to write")

    def __str__(self) -> str:
        return str(self.strerror)


def is_disk_full(exc: BaseException) -> bool:
    """An OSError that says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int:
    """Free bytes on the file system of `path` (or of its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return 0


def human_size(count: float) -> str:
    """A byte count as people read it: the largest binary unit it reaches, one decimal."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def atomic_write_text(target: Path, text: str, *, mode: int = 0o644) -> Path:
    """Replace `target` with `text` (UTF-8) atomically and durably; see the module's docstring."""
    return atomic_write_bytes(target, text.encode("utf-8"), mode=mode)


def atomic_write_bytes(target: Path, data: bytes, *, mode: int = 0o644) -> Path:
    target = Path(target)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if is_disk_full(exc):
            raise DiskFullError(target, len(data)) from None
        raise
    _sync_directory(target.parent)
    return target


def _sync_directory(directory: Path) -> None:
    """The rename itself reaches the disk (a reboot right after keeps the new name)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["DiskFullError", "atomic_write_bytes", "atomic_write_text", "free_bytes", "is_disk_full"]
