"""The file seam: every file operation the journal makes goes through a `Files`.

`OS_FILES` is the operating system's. Tests pass a simulated disk instead
(`sluiceway.persist.simulated`) that remembers what was fsynced, so that a crash can keep what a
real disk might keep after a power cut, and that fails an operation on demand (a failed fsync, a
full disk).

Files are named by `Path` and opened as integer descriptors, as `os` does; errors are `OSError`s
with the `errno` the operating system would give.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

Data = bytes | bytearray | memoryview


class Files(Protocol):
    """What the journal needs of a file system."""

    def open(self, path: Path, flags: int) -> int:
        """`os.open(path, flags, 0o644)`."""
        ...

    def close(self, fd: int) -> None: ...

    def write(self, fd: int, data: Data) -> int:
        """Write at the end (files are opened with O_APPEND) or at the position; may be short."""
        ...

    def writev(self, fd: int, parts: Sequence[Data]) -> int:
        """Write `parts` one after the other in one call, as `write` writes one (at most
        IOV_MAX of them); may be short."""
        ...

    def pread(self, fd: int, size: int, offset: int) -> bytes: ...

    def fsync(self, fd: int) -> None:
        """Make the file's data (or a directory's entries, for a directory) durable."""
        ...

    def truncate(self, fd: int, length: int) -> None: ...

    def size(self, fd: int) -> int: ...

    def replace(self, source: Path, target: Path) -> None:
        """Rename `source` over `target` (atomic; durable once the directory is fsynced)."""
        ...

    def remove(self, path: Path) -> None:
        """Unlink a file; FileNotFoundError when there is none."""
        ...

    def names(self, directory: Path) -> list[str]:
        """The names in `directory`, which is created (with its parents) when missing."""
        ...

    def make_directory(self, directory: Path) -> None:
        """Create `directory` (not its parents); nothing when it exists."""
        ...

    def exists(self, path: Path) -> bool: ...

    def free_space(self, path: Path) -> tuple[int, int]:
        """(bytes free for this process, bytes in all) on the file system holding `path`."""
        ...


class OsFiles:
    """The operating system's files."""

    def open(self, path: Path, flags: int) -> int:
        return os.open(path, flags, 0o644)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: Data) -> int:
        return os.write(fd, data)

    def writev(self, fd: int, parts: Sequence[Data]) -> int:
        return os.writev(fd, parts)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def replace(self, source: Path, target: Path) -> None:
        os.replace(source, target)

    def remove(self, path: Path) -> None:
        os.unlink(path)

    def names(self, directory: Path) -> list[str]:
        directory.mkdir(parents=True, exist_ok=True)
        return os.listdir(directory)

    def make_directory(self, directory: Path) -> None:
        directory.mkdir(exist_ok=True)

    def exists(self, path: Path) -> bool:
        return path.exists()

    def free_space(self, path: Path) -> tuple[int, int]:
        # f_bavail, not f_bfree: the blocks reserved for root are not the broker's to use.
        stat = os.statvfs(path)
        return stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize


OS_FILES = OsFiles()
