"""A simulated disk for tests: the journal's files in memory, crashes, and failures on demand.

`SimulatedDisk` implements the file seam (`persist.files.Files`) the way a disk behind a page cache
behaves, so that a test can crash the journal anywhere and check what recovery makes of it:

- What a write hands over is visible to every later read at once (it sits in the "page cache").
- What is durable is what an fsync covered: a file's bytes as of its last fsync, and a
  directory's entries (files created, renamed, removed) as of the directory's last fsync.
- `crash(power=False)` is a process crash (SIGKILL): the operating system keeps everything that
  was handed to it, durable or not. `crash(power=True)` is a power cut: each file keeps what was
  fsynced plus an arbitrary prefix of what was written after it (a torn write), and each
  directory the entries of its last fsync plus an arbitrary prefix of the changes made since
  (a journalling file system commits metadata in order). The choices come from a
  `random.Random`, so a test driven by a seed (or by Hypothesis) replays exactly.
- `arm(n)` stops the machine at the n-th operation that changes something (a write stopped there
  keeps a random prefix): it and every later operation raise `SimulatedCrash` until `crash` is
  called, so a test can crash the journal in the middle of a flush, a rotation, a compaction or
  recovery itself.
- `fault` makes operations raise the `OSError` a disk gives: a failed fsync (EIO), a full disk
  (ENOSPC), a failed write (EIO). `capacity` is the disk's size in bytes, counted over every
  file's current content: a write stores what fits (a short write), the next one fails; what
  is left is what `free_space` reports, as statvfs would.

Directories are created by `names` and `make_directory` and are never lost in a crash.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sluiceway.persist.files import Data

UNLIMITED = 1 << 50  # bytes: the size free_space reports for a disk without a capacity

# A fault hook: (operation, path) -> the error to raise, or None. Operations: "open", "write",
# "fsync", "truncate", "replace", "remove".
Fault = Callable[[str, Path], OSError | None]


class SimulatedCrash(BaseException):
    """The simulated machine stopped (`SimulatedDisk.arm`). Not an Exception: nothing in the
    broker may catch it and go on, as nothing runs on after a real crash."""


@dataclass(eq=False)
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""  # the content as of the last fsync


@dataclass(eq=False)
class _Directory:
    entries: dict[str, _Inode] = field(default_factory=dict)
    durable: dict[str, _Inode] = field(default_factory=dict)  # as of the last fsync
    # Changes since the last fsync, in order, each all or nothing (a rename is two entries):
    # (name, inode), inode None for a removal.
    changes: list[list[tuple[str, _Inode | None]]] = field(default_factory=list)


@dataclass(eq=False)
class _Open:
    path: Path
    inode: _Inode | None  # None: a directory, opened to fsync it
    append: bool
    position: int = 0


class SimulatedDisk:
    """An in-memory file system that can crash and fail (see the module docstring)."""

    def __init__(self, *, capacity: int | None = None) -> None:
        self.capacity = capacity  # bytes; None: unlimited
        self.fault: Fault | None = None
        self.fsyncs = 0  # fsyncs that succeeded, files and directories
        self._directories: dict[Path, _Directory] = {}
        self._open: dict[int, _Open] = {}
        self._next_fd = 3
        self._lock = threading.Lock()
        self._countdown: int | None = None  # operations left before an armed crash
        self._dead = False  # the armed crash happened
        self._rng = random.Random(0)  # noqa: S311  (where a write stopped by a crash ends)

    # -- the file seam ---------------------------------------------------------------------------

    def open(self, path: Path, flags: int) -> int:
        with self._lock:
            self._step("open", path)
            if path in self._directories:
                opened = _Open(path, None, append=False)
            else:
                directory = self._parent(path)
                inode = directory.entries.get(path.name)
                if inode is None:
                    if not flags & os.O_CREAT:
                        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
                    inode = _Inode()
                    self._link(directory, path.name, inode)
                elif flags & os.O_CREAT and flags & os.O_EXCL:
                    raise FileExistsError(errno.EEXIST, "file exists", str(path))
                elif flags & os.O_TRUNC:
                    del inode.data[:]
                opened = _Open(path, inode, append=bool(flags & os.O_APPEND))
            fd, self._next_fd = self._next_fd, self._next_fd + 1
            self._open[fd] = opened
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._file(fd)
            del self._open[fd]

    def writev(self, fd: int, parts: Sequence[Data]) -> int:
        # One write of the parts together: torn, short or refused as that write would be.
        return self.write(fd, b"".join(parts))

    def write(self, fd: int, data: Data) -> int:
        with self._lock:
            opened = self._file(fd)
            inode = opened.inode
            if inode is None:
                raise IsADirectoryError(errno.EISDIR, "is a directory", str(opened.path))
            torn = self._countdown == 1 and not self._dead
            try:
                self._step("write", opened.path)
            except SimulatedCrash:
                if torn:  # the machine stops in the middle of the write
                    start = len(inode.data) if opened.append else opened.position
                    kept = bytes(data[: self._rng.randint(0, len(data))])
                    inode.data[start : start + len(kept)] = kept
                raise
            size = len(data)
            if self.capacity is not None and size:
                room = max(0, self.capacity - self.used())
                if not room:
                    raise OSError(errno.ENOSPC, "no space left on device", str(opened.path))
                size = min(size, room)  # a short write; the next one fails
            start = len(inode.data) if opened.append else opened.position
            inode.data[start : start + size] = bytes(data[:size])
            opened.position = start + size
            return size

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._lock:
            inode = self._file(fd).inode
            assert inode is not None
            return bytes(inode.data[offset : offset + size])

    def fsync(self, fd: int) -> None:
        with self._lock:
            opened = self._file(fd)
            self._step("fsync", opened.path)
            if opened.inode is None:
                directory = self._directories[opened.path]
                directory.durable = dict(directory.entries)
                directory.changes.clear()
            else:
                opened.inode.durable = bytes(opened.inode.data)
            self.fsyncs += 1

    def truncate(self, fd: int, length: int) -> None:
        with self._lock:
            opened = self._file(fd)
            self._step("truncate", opened.path)
            assert opened.inode is not None
            del opened.inode.data[length:]

    def size(self, fd: int) -> int:
        with self._lock:
            inode = self._file(fd).inode
            assert inode is not None
            return len(inode.data)

    def replace(self, source: Path, target: Path) -> None:
        with self._lock:
            self._step("replace", source)
            directory = self._parent(source)
            inode = directory.entries.get(source.name)
            if inode is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", str(source))
            if self._parent(target) is not directory:
                raise OSError(errno.EXDEV, "renames stay in their directory here", str(target))
            directory.entries[target.name] = inode
            del directory.entries[source.name]
            directory.changes.append([(target.name, inode), (source.name, None)])

    def remove(self, path: Path) -> None:
        with self._lock:
            self._step("remove", path)
            directory = self._parent(path)
            if path.name not in directory.entries:
                raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
            self._unlink(directory, path.name)

    def names(self, directory: Path) -> list[str]:
        with self._lock:
            for path in (*reversed(directory.parents), directory):
                self._directories.setdefault(path, _Directory())
            files = list(self._directories[directory].entries)
            subdirectories = [p.name for p in self._directories if p.parent == directory != p]
            return files + subdirectories

    def make_directory(self, directory: Path) -> None:
        with self._lock:
            if directory.parent not in self._directories:
                raise FileNotFoundError(errno.ENOENT, "no such directory", str(directory.parent))
            self._directories.setdefault(directory, _Directory())

    def exists(self, path: Path) -> bool:
        with self._lock:
            if path in self._directories:
                return True
            directory = self._directories.get(path.parent)
            return directory is not None and path.name in directory.entries

    def free_space(self, path: Path) -> tuple[int, int]:
        """What `capacity` leaves; without one, a disk far larger than any test writes."""
        with self._lock:
            capacity = UNLIMITED if self.capacity is None else self.capacity
            return max(0, capacity - self.used()), capacity

    # -- what tests do with it -------------------------------------------------------------------

    def used(self) -> int:
        """Bytes held by every file, as the operating system sees them now."""
        inodes = {id(i): i for d in self._directories.values() for i in d.entries.values()}
        inodes.update({id(o.inode): o.inode for o in self._open.values() if o.inode is not None})
        return sum(len(inode.data) for inode in inodes.values())

    def arm(self, operations: int, rng: random.Random) -> None:
        """Stop the machine at the `operations`-th operation that changes something from now
        (a write stopped in its middle keeps a random prefix): that operation and every later
        one raise SimulatedCrash until `crash` is called."""
        if operations < 1:
            raise ValueError(f"operations must be 1 or more, not {operations}")
        self._countdown, self._rng = operations, rng

    def disarm(self) -> None:
        self._countdown = None

    @property
    def down(self) -> bool:
        """The armed crash happened (every operation fails until `crash`)."""
        return self._dead

    def crash(self, rng: random.Random, *, power: bool) -> None:
        """The process dies (every descriptor closes); with `power`, so does the machine, and
        only what was fsynced is sure to survive (see the module docstring)."""
        with self._lock:
            self._open.clear()
            self._dead, self._countdown = False, None
            for directory in self._directories.values():
                if power:
                    kept = rng.randint(0, len(directory.changes))
                    entries = dict(directory.durable)
                    for change in directory.changes[:kept]:
                        for name, inode in change:
                            if inode is None:
                                entries.pop(name, None)
                            else:
                                entries[name] = inode
                    directory.entries = entries
                directory.durable = dict(directory.entries)
                directory.changes.clear()
            inodes = {id(i): i for d in self._directories.values() for i in d.entries.values()}
            for inode in inodes.values():
                if power:
                    inode.data = bytearray(_survivor(inode, rng))
                inode.durable = bytes(inode.data)

    def files(self, directory: Path) -> dict[str, bytes]:
        """The current content of every file in `directory`, by name."""
        with self._lock:
            found = self._directories.get(directory)
            if found is None:
                return {}
            return {name: bytes(inode.data) for name, inode in found.entries.items()}

    def cut(self, path: Path, length: int) -> None:
        """Cut a file to `length` bytes, durably (what a crash left of it)."""
        with self._lock:
            inode = self._parent(path).entries[path.name]
            del inode.data[length:]
            inode.durable = bytes(inode.data)

    def corrupt(self, path: Path, offset: int, data: bytes) -> None:
        """Overwrite bytes of a file in place, durably (damage on the disk)."""
        with self._lock:
            inode = self._parent(path).entries[path.name]
            inode.data[offset : offset + len(data)] = data
            inode.durable = bytes(inode.data)

    # -- inside ----------------------------------------------------------------------------------

    def _step(self, operation: str, path: Path) -> None:
        """Every operation that changes something: the armed crash, then the fault hook."""
        if self._dead:
            raise SimulatedCrash(f"the machine is down ({operation} {path})")
        if self._countdown is not None:
            self._countdown -= 1
            if self._countdown <= 0:
                self._dead, self._countdown = True, None
                raise SimulatedCrash(f"the machine stopped at {operation} {path}")
        if self.fault is not None:
            error = self.fault(operation, path)
            if error is not None:
                raise error

    def _file(self, fd: int) -> _Open:
        opened = self._open.get(fd)
        if opened is None:
            raise OSError(errno.EBADF, "bad file descriptor")
        return opened

    def _parent(self, path: Path) -> _Directory:
        directory = self._directories.get(path.parent)
        if directory is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(path.parent))
        return directory

    @staticmethod
    def _link(directory: _Directory, name: str, inode: _Inode) -> None:
        directory.entries[name] = inode
        directory.changes.append([(name, inode)])

    @staticmethod
    def _unlink(directory: _Directory, name: str) -> None:
        del directory.entries[name]
        directory.changes.append([(name, None)])


def _survivor(inode: _Inode, rng: random.Random) -> bytes:
    """What a power cut leaves of a file: what was fsynced, then a prefix of what came after."""
    data, durable = bytes(inode.data), inode.durable
    if data.startswith(durable):
        return data[: rng.randint(len(durable), len(data))]
    # Truncated since the last fsync: the truncation may not have reached the disk.
    if rng.random() < 0.5:
        return durable
    common = min(len(data), len(durable))
    common = next((i for i in range(common) if data[i] != durable[i]), common)
    return data[: rng.randint(common, len(data))]
