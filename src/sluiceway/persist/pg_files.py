"""The jdbc store: the journal's files kept in PostgreSQL, behind the file seam.

`PgFiles` implements `persist.files.Files` on the tables sluiceway_file (one row per file: its
name and size) and sluiceway_chunk (its bytes, one row per run of bytes written, keyed by the
file offset they start at), both keyed by (cluster_id, broker_id), so that one database holds
the journals of every broker of every cluster, and any broker can open another's.

Why the seam is here, under the journal, and not a table per kind of record: everything above it
(records, recovery, liveness, compaction, the extensions' records) stays exactly as it is, with
one recovery path, proven by the same model-based tests that prove it on a disk
(tests/persistence/test_store_model.py runs over both). The cost: the records are opaque bytea,
not rows a query could read; what a broker keeps is read back by its journal, not by SQL.

What a write does, and what a crash keeps:

- Writes, creations, truncations, renames (`replace`) and removals are kept in memory as a list
  of pending operations, and every read (`pread`, `size`, `names`, `exists`) sees the committed
  tables plus that list. An `fsync` of any descriptor (file or directory) commits, in ONE
  transaction and in order, every operation made since the last commit. So what survives a crash
  is always a prefix of the operations, never a torn write nor a rename without the writes
  before it: stronger than a disk, which the journal already handles.
- Group commit falls out of the journal's group sync policy: its sync thread calls fsync, and
  every write made while one commit runs shares the next; a RECEIPT waits for it, as on disk.
  The writes of one commit to one file go in as few rows as they fit (persist.pg_rows).
- The pending list is bounded by the journal: it holds what the journal wrote since its last
  fsync, which is one group of writes under the `group` and `always` policies, and at most one
  segment (imq.persist.file.segment.size, or the copy compaction makes of one) under `os`, which
  fsyncs a segment when it is full. A clean `shutdown` commits what is pending, as the operating
  system writes its page cache after a process ends; a crash (`abandon`) loses it.
- Reads never load more than `pread` asks for: the database cuts each row to the range asked.
- A commit that fails (the connection lost in the middle, the database refusing it) is a failed
  fsync, OSError EIO: the journal stops for good, as it does after a disk's failed fsync, and
  the broker must be restarted (its recovery reads what was committed). Whether a commit cut by a
  lost connection took effect cannot be known, and need not be: both outcomes are a prefix.
- Fencing: a `Fence` runs inside every commit's transaction, before the writes; when it raises
  `Fenced` (this broker no longer owns its store: its lease ran out, another broker took it over)
  the transaction is rolled back and fsync raises OSError EIO saying so; the journal then refuses
  every later write.
- One writer per store: PgFiles holds a session-level advisory lock, keyed by (cluster_id,
  broker_id), on its connection for its whole life; a second PgFiles for the same broker (a
  second broker process started with the same imq.brokerid) is refused (StoreInUse).

There is no free-space figure in a database: `free_space` reports a fixed, very large pair, so
the broker's low-disk alarm (core.features.disk) never fires for the jdbc store; watching the
database's disk is PostgreSQL's administrator's work.

Paths are named relative to `root` (the broker's data directory): another broker taking over
opens the same names under its own directory. Directories live in memory only: they are created
by `names` and `make_directory` (as for the simulated disk) and implied by the files in them.

For the model-based tests, `arm` stops the store at its n-th changing operation (raising
persist.simulated.SimulatedCrash, as SimulatedDisk.arm does; a commit it stops may or may not
have taken effect) and `abandon` drops the pending operations as a killed process would.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sluiceway.core.model.store import StoreError
from sluiceway.persist.database import Database, DatabaseError
from sluiceway.persist.files import Data
from sluiceway.persist.pg_rows import (
    Change,
    Kind,
    apply_changes,
    list_files,
    read_files,
    select_range,
)
from sluiceway.persist.simulated import SimulatedCrash

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[object, ...]]

LOCK_POLL: Final = 0.05  # seconds between two tries of the store's lock
FREE_SPACE: Final = 1 << 50  # bytes: what free_space reports, free and in all (see above)

# Run inside each commit's transaction, on its connection, before the writes: raises Fenced when
# this broker no longer owns its store (the membership supplies it).
Fence = Callable[["Connection"], None]


class Fenced(StoreError):
    """This broker no longer owns its store: raised by a `Fence`, the message says why (its
    lease ran out, another broker took it over)."""


class StoreInUse(DatabaseError):
    """Another live process writes this broker's store."""


def lock_key(cluster_id: str, broker_id: str) -> int:
    """The advisory lock key of one broker's store: 64 bits of a hash of its ids."""
    digest = hashlib.sha256(f"sluiceway store\0{cluster_id}\0{broker_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass(eq=False)
class _File:
    """One file as this process sees it: what is committed, and what is pending on top."""

    stored: str | None = None  # the name its committed rows have; None: nothing committed
    durable: int = 0  # bytes committed under `stored`
    size: int = 0  # bytes now, the pending operations included
    # Pending writes (operation number, position, bytes) and truncations (number, length).
    writes: list[tuple[int, int, bytes]] = field(default_factory=list)
    cuts: list[tuple[int, int]] = field(default_factory=list)
    moving: bool = False  # a commit under way renames it: reads wait for that commit
    unlinked: bool = False  # removed, or replaced by another: no more reads or writes

    @property
    def committed_visible(self) -> int:
        """Bytes of the committed rows a read may use: pending truncations hide the rest."""
        return min([self.durable, *(length for _, length in self.cuts)])


@dataclass(eq=False)
class _Open:
    name: str
    file: _File | None  # None: a directory, opened to fsync it
    append: bool
    position: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class _Op(Change):
    """One pending operation, numbered in the order it was made, and the file it changes."""

    number: int
    file: _File


class PgFiles:
    """A broker's journal files in PostgreSQL (see the module docstring)."""

    def __init__(
        self,
        database: Database,
        cluster_id: str,
        broker_id: str,
        root: Path,
        *,
        fence: Fence | None = None,
        exclusive: bool = True,
    ) -> None:
        """`root`: the directory the journal's paths are under (names are relative to it).
        `exclusive`: hold the store's advisory lock (StoreInUse when another process does)."""
        self.database, self.cluster_id, self.broker_id = database, cluster_id, broker_id
        self.root = Path(root)
        self.fence = fence
        self.commits = 0  # transactions committed
        self._lock = threading.Condition(threading.Lock())  # the view and the pending list
        self._commit_lock = threading.Lock()  # one commit at a time, in order
        self._read_lock = threading.Lock()  # the reading connection
        self._files: dict[str, _File] = {}
        self._directories: set[str] = {""}
        self._open: dict[int, _Open] = {}
        self._next_fd = 3
        self._ops: list[_Op] = []
        self._numbers = 0  # operations made, ever
        self._broken: str | None = None  # why nothing more is written (a failed commit)
        self._countdown: int | None = None  # changing operations left before an armed crash
        self._dead = False
        self._rng = random.Random(0)  # noqa: S311  (whether a commit a crash stops took effect)
        self._writer = database.connect()
        try:
            if exclusive:
                self._take_lock()
            self._reader = database.connect(autocommit=True)
        except BaseException:
            self._writer.close()
            raise
        try:
            self._load()
        except BaseException:
            self.abandon()
            raise

    @property
    def _key(self) -> tuple[str, str]:
        return self.cluster_id, self.broker_id

    def _take_lock(self) -> None:
        """The store's advisory lock, waited for up to the connect timeout: the server lets it
        go only once it has seen the last holder's connection end (a process just killed)."""
        key = lock_key(*self._key)
        deadline = time.monotonic() + self.database.connect_timeout
        while True:
            row = self._writer.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            self._writer.commit()  # (the lock is the session's: it outlives this transaction)
            if (row and row[0]) or time.monotonic() >= deadline:
                break
            time.sleep(LOCK_POLL)
        if not row or not row[0]:
            raise StoreInUse(
                f"the store of broker {self.broker_id!r} (cluster {self.cluster_id!r}) in "
                f"{self.database.shown} is in use by another broker process: stop it, or give "
                "this broker another imq.brokerid"
            )

    def _load(self) -> None:
        for name, size in list_files(self._reader, self._key).items():
            self._files[name] = _File(stored=name, durable=size, size=size)
            self._directories.update(_parents(name))

    # -- the file seam ---------------------------------------------------------------------------

    def open(self, path: Path, flags: int) -> int:
        name = self._name(path)
        with self._lock:
            if name in self._directories:
                opened = _Open(name, None, append=False)
            else:
                file = self._files.get(name)
                if file is None:
                    if not flags & os.O_CREAT:
                        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
                    if _parent(name) not in self._directories:
                        raise FileNotFoundError(errno.ENOENT, "no such directory", str(path))
                    self._step("open", path)
                    file = self._files[name] = _File()
                    self._pending(Kind.CREATE, file, name)
                elif flags & os.O_CREAT and flags & os.O_EXCL:
                    raise FileExistsError(errno.EEXIST, "file exists", str(path))
                elif flags & os.O_TRUNC and file.size:
                    self._step("open", path)
                    self._cut(file, name, 0)
                opened = _Open(name, file, append=bool(flags & os.O_APPEND))
            fd, self._next_fd = self._next_fd, self._next_fd + 1
            self._open[fd] = opened
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._descriptor(fd)
            del self._open[fd]

    def writev(self, fd: int, parts: Sequence[Data]) -> int:
        return self.write(fd, b"".join(parts))

    def write(self, fd: int, data: Data) -> int:
        with self._lock:
            opened = self._descriptor(fd)
            file = self._regular(opened, changing=True)
            position = file.size if opened.append else opened.position
            if position != file.size:
                # The journal only appends; overwriting committed rows is not supported.
                raise OSError(errno.EINVAL, "the jdbc store only appends to a file", opened.name)
            self._step("write", self.root / opened.name)
            if data:
                self._append(file, opened.name, bytes(data))
            opened.position = file.size
            return len(data)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._lock:
            file = self._regular(self._descriptor(fd), changing=True)
            self._lock.wait_for(lambda: not file.moving)
            end = min(offset + size, file.size)
            if end <= offset:
                return b""
            stored, visible, writes = file.stored, file.committed_visible, list(file.writes)
        buffer = bytearray(end - offset)
        if stored is not None and visible > offset:
            for position, data in self._select(stored, offset, min(end, visible)):
                start = max(position, offset) - offset
                buffer[start : start + len(data)] = data
        for _, position, data in writes:
            low, high = max(position, offset), min(position + len(data), end)
            if low < high:
                buffer[low - offset : high - offset] = data[low - position : high - position]
        return bytes(buffer)

    def fsync(self, fd: int) -> None:
        with self._lock:
            path = self.root / self._descriptor(fd).name
            down = self._dead
            stops = self._stops_here()
        if stops:
            if not down and self._rng.random() < 0.5:
                self.commit()  # the crash came after COMMIT reached the database
            raise SimulatedCrash(f"the store stopped at fsync {path}")
        self.commit()

    def truncate(self, fd: int, length: int) -> None:
        with self._lock:
            opened = self._descriptor(fd)
            file = self._regular(opened, changing=True)
            self._step("truncate", self.root / opened.name)
            if length < file.size:
                self._cut(file, opened.name, length)
            elif length > file.size:  # as ftruncate: the file grows with zeros
                self._append(file, opened.name, bytes(length - file.size))

    def size(self, fd: int) -> int:
        with self._lock:
            return self._regular(self._descriptor(fd)).size

    def replace(self, source: Path, target: Path) -> None:
        old, new = self._name(source), self._name(target)
        with self._lock:
            file = self._files.get(old)
            if file is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", str(source))
            if new in self._directories:
                raise IsADirectoryError(errno.EISDIR, "is a directory", str(target))
            self._step("replace", source)
            if old != new:
                replaced = self._files.get(new)
                if replaced is not None:
                    replaced.unlinked = True
                self._files[new] = self._files.pop(old)
                self._pending(Kind.REPLACE, file, old, target=new)
                for opened in self._open.values():
                    if opened.file is file:
                        opened.name = new

    def remove(self, path: Path) -> None:
        name = self._name(path)
        with self._lock:
            file = self._files.get(name)
            if file is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
            self._step("remove", path)
            del self._files[name]
            file.unlinked = True
            self._pending(Kind.REMOVE, file, name)

    def names(self, directory: Path) -> list[str]:
        name = self._name(directory)
        with self._lock:
            if name in self._files:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(directory))
            self._directories.update((name, *_parents(name)))
            inside = [*self._files, *self._directories]
            return sorted({n.rpartition("/")[2] for n in inside if n and _parent(n) == name})

    def make_directory(self, directory: Path) -> None:
        name = self._name(directory)
        with self._lock:
            if _parent(name) not in self._directories:
                raise FileNotFoundError(errno.ENOENT, "no such directory", str(directory.parent))
            if name in self._files:
                raise FileExistsError(errno.EEXIST, "file exists", str(directory))
            self._directories.add(name)

    def exists(self, path: Path) -> bool:
        name = self._name(path)
        with self._lock:
            return name in self._files or name in self._directories

    def free_space(self, path: Path) -> tuple[int, int]:
        """A fixed, very large pair: a database has no such figure (see the module docstring)."""
        return FREE_SPACE, FREE_SPACE

    # -- committing ------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Operations made and not committed yet."""
        with self._lock:
            return len(self._ops)

    def commit(self) -> None:
        """Commit every pending operation in one transaction (what fsync does); OSError EIO
        when it failed or the fence refused it, and on every later call."""
        with self._commit_lock:
            with self._lock:
                self._check_broken()
                ops, self._ops = self._ops, []
                for op in ops:
                    if op.kind is Kind.REPLACE:
                        op.file.moving = True
            if not ops:
                return
            try:
                with self._writer.transaction():
                    if self.fence is not None:
                        self.fence(self._writer)
                    apply_changes(self._writer, self._key, ops)
            except Fenced as fenced:
                raise self._break(
                    f"broker {self.broker_id!r} no longer owns its store ({fenced}): nothing more "
                    "is written to it"
                ) from fenced
            except Exception as error:
                reason = " ".join(str(error).split()) or type(error).__name__
                raise self._break(
                    f"committing to the database {self.database.shown} failed ({reason}): whether "
                    "the last group of writes was kept is unknown"
                ) from error
            finally:
                with self._lock:
                    for op in ops:
                        op.file.moving = False
                    self._lock.notify_all()
            with self._lock:
                self._committed(ops)
                self.commits += 1

    def _committed(self, ops: list[_Op]) -> None:
        """The committed rows now hold `ops`: what each file's reads take from them, and what
        is still pending on top."""
        last = ops[-1].number
        for op in ops:
            file = op.file
            if op.kind is Kind.CREATE:
                file.stored, file.durable = op.name, 0
            elif op.kind is Kind.WRITE:
                file.durable = op.position + len(op.data)
            elif op.kind is Kind.TRUNCATE:
                file.durable = min(file.durable, op.position)
            elif op.kind is Kind.REPLACE:
                file.stored = op.target
            else:
                file.stored, file.durable = None, 0
            file.writes = [write for write in file.writes if write[0] > last]
            file.cuts = [cut for cut in file.cuts if cut[0] > last]

    def _break(self, message: str) -> OSError:
        with self._lock:
            self._broken = message
        return OSError(errno.EIO, message)

    def _check_broken(self) -> None:
        if self._broken is not None:
            raise OSError(errno.EIO, self._broken)

    def shutdown(self) -> None:
        """Commit what is pending (a clean end: see the module docstring), then let the
        connections go, and the store's lock with them."""
        try:
            with self._lock:
                commit = self._broken is None and not self._dead and bool(self._ops)
            if commit:
                self.commit()
        finally:
            self.abandon()

    # -- what tests do with it -------------------------------------------------------------------

    def abandon(self) -> None:
        """The process died: what is pending is lost; the connections (and the lock) go."""
        with self._lock:
            self._ops.clear()
            self._open.clear()
            self._broken = self._broken or "the store was closed"
        for connection in (self._writer, getattr(self, "_reader", None)):
            if connection is not None and not connection.closed:
                connection.close()

    def arm(self, operations: int, rng: random.Random) -> None:
        """Stop at the `operations`-th changing operation from now, as SimulatedDisk.arm: that
        operation and every later one raise SimulatedCrash; a commit stopped so took effect or
        not, as `rng` decides (a crash while COMMIT was on its way)."""
        if operations < 1:
            raise ValueError(f"operations must be 1 or more, not {operations}")
        self._countdown, self._rng = operations, rng

    def disarm(self) -> None:
        self._countdown = None

    @property
    def down(self) -> bool:
        """The armed crash happened."""
        return self._dead

    def committed(self) -> dict[str, bytes]:
        """Every file's committed content, by name, read from the tables (for tests)."""
        with self._read_lock:
            return read_files(self._reader, self._key)

    # -- inside ----------------------------------------------------------------------------------

    def _name(self, path: Path) -> str:
        try:
            relative = Path(path).relative_to(self.root)
        except ValueError:
            raise OSError(
                errno.EXDEV, f"outside the jdbc store's directory {self.root}", str(path)
            ) from None
        return "" if relative == Path() else relative.as_posix()

    def _descriptor(self, fd: int) -> _Open:
        opened = self._open.get(fd)
        if opened is None:
            raise OSError(errno.EBADF, "bad file descriptor")
        return opened

    @staticmethod
    def _regular(opened: _Open, *, changing: bool = False) -> _File:
        if opened.file is None:
            raise IsADirectoryError(errno.EISDIR, "is a directory", opened.name)
        if changing and opened.file.unlinked:
            # A disk keeps an unlinked file while it is open; the jdbc store keeps files by name
            # only (the journal never uses a file it removed or replaced).
            raise OSError(errno.ESTALE, "the file was removed or replaced", opened.name)
        return opened.file

    def _step(self, operation: str, path: Path) -> None:
        """Every changing operation: the armed crash. (After a failed commit operations go on
        in memory, as a disk's page cache takes them after a failed fsync; no commit does.)"""
        if self._stops_here():
            raise SimulatedCrash(f"the store stopped at {operation} {path}")

    def _stops_here(self) -> bool:
        """Whether the armed crash stops this operation (or came already)."""
        if self._countdown is not None:
            self._countdown -= 1
            if self._countdown <= 0:
                self._dead, self._countdown = True, None
        return self._dead

    def _pending(
        self,
        kind: Kind,
        file: _File,
        name: str,
        *,
        target: str = "",
        position: int = 0,
        data: bytes = b"",
    ) -> int:
        self._numbers += 1
        self._ops.append(_Op(kind, name, target, position, data, number=self._numbers, file=file))
        return self._numbers

    def _append(self, file: _File, name: str, data: bytes) -> None:
        number = self._pending(Kind.WRITE, file, name, position=file.size, data=data)
        file.writes.append((number, file.size, data))
        file.size += len(data)

    def _cut(self, file: _File, name: str, length: int) -> None:
        number = self._pending(Kind.TRUNCATE, file, name, position=length)
        file.cuts.append((number, length))
        kept: list[tuple[int, int, bytes]] = []
        for written, position, data in file.writes:
            if position < length:
                kept.append((written, position, data[: length - position]))
        file.writes, file.size = kept, length

    def _select(self, name: str, start: int, end: int) -> list[tuple[int, bytes]]:
        try:
            with self._read_lock:
                return select_range(self._reader, self._key, name, start, end)
        except Exception as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            raise OSError(
                errno.EIO, f"reading {name} from the database {self.database.shown}: {reason}"
            ) from error


def _parent(name: str) -> str:
    return name.rpartition("/")[0]


def _parents(name: str) -> list[str]:
    """Every directory `name` is in, up to the root ("")."""
    parents, current = [], name
    while current:
        current = _parent(current)
        parents.append(current)
    return parents
