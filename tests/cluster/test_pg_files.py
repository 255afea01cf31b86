"""The journal's files in PostgreSQL (persist.pg_files) on a real database: the same answers as
the operating system's files for random sequences of operations, what a crash keeps (exactly
what the last commit held), the fence, the one-writer lock, and reads that take only the range
asked for."""

from __future__ import annotations

import errno
import itertools
import os
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluiceway.persist.database import Database
from sluiceway.persist.files import OS_FILES, Files
from sluiceway.persist.pg_files import Fenced, PgFiles, StoreInUse
from sluiceway.persist.pg_rows import ROW_BYTES
from sluiceway.persist.schema import ensure_schema
from sluiceway.persist.simulated import SimulatedCrash

ROOT = Path("/srv/broker")
NAMES = ("a", "b", "sub/c")
_BROKERS = itertools.count()


@pytest.fixture
def database(pg_url: str) -> Database:
    database = Database(pg_url)
    ensure_schema(database)
    return database


@pytest.fixture
def opened(database: Database) -> Iterator[Callable[..., PgFiles]]:
    """PgFiles for fresh broker ids; every one still open is let go after the test."""
    made: list[PgFiles] = []

    def make(broker: str | None = None, **options: object) -> PgFiles:
        files = PgFiles(database, "c1", broker or f"b{next(_BROKERS)}", ROOT, **options)  # type: ignore[arg-type]
        made.append(files)
        return files

    yield make
    for files in made:
        files.abandon()


def outcome(call: Callable[[], object]) -> object:
    """What an operation returned, or the errno it failed with."""
    try:
        return call()
    except OSError as error:
        return ("error", error.errno)


class Pair:
    """The same operations on the operating system's files and on PgFiles, answers compared."""

    def __init__(self, pg: PgFiles, directory: Path) -> None:
        self.pg, self.directory = pg, directory
        self.fds: list[tuple[int, int]] = []  # (OS descriptor, PgFiles descriptor)
        self.committed: dict[str, bytes] = {}  # the OS files' content at the last fsync

    def both(self, name: str, call: Callable[[Files, Path, int], object], fd: int = 0) -> object:
        os_fd, pg_fd = self.fds[fd] if self.fds else (-1, -1)
        here = outcome(lambda: call(OS_FILES, self.directory / name, os_fd))
        there = outcome(lambda: call(self.pg, ROOT / name, pg_fd))
        if there == ("error", errno.ESTALE):
            # Reading or writing a file removed since it was opened: a disk can, the jdbc store
            # refuses (the journal never does it).
            assert os.fstat(os_fd).st_nlink == 0
            self.close(self.fds.index((os_fd, pg_fd)))
            return there
        assert here == there, (name, here, there)
        return here

    def open(self, name: str, flags: int) -> None:
        os_fd = outcome(lambda: OS_FILES.open(self.directory / name, flags))
        pg_fd = outcome(lambda: self.pg.open(ROOT / name, flags))
        assert isinstance(os_fd, int) == isinstance(pg_fd, int), (name, os_fd, pg_fd)
        if isinstance(os_fd, int) and isinstance(pg_fd, int):
            self.fds.append((os_fd, pg_fd))
        else:
            assert os_fd == pg_fd

    def close(self, index: int) -> None:
        os_fd, pg_fd = self.fds.pop(index)
        OS_FILES.close(os_fd)
        self.pg.close(pg_fd)

    def fsync(self, index: int) -> None:
        self.both("", lambda files, _, fd: files.fsync(fd), index)
        self.committed = self.contents()

    def contents(self) -> dict[str, bytes]:
        found = {}
        for name in NAMES:
            path = self.directory / name
            if path.is_file():
                found[name] = path.read_bytes()
        return found


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("open"),
            st.sampled_from(NAMES),
            st.sampled_from(["create", "excl", "trunc", "plain"]),
        ),
        st.tuples(st.just("write"), st.integers(0, 3), st.binary(max_size=40)),
        st.tuples(st.just("read"), st.integers(0, 3), st.integers(0, 60), st.integers(0, 60)),
        st.tuples(st.just("truncate"), st.integers(0, 3), st.integers(0, 80)),
        st.tuples(st.just("size"), st.integers(0, 3)),
        st.tuples(st.just("fsync"), st.integers(0, 3)),
        st.tuples(st.just("close"), st.integers(0, 3)),
        st.tuples(st.just("replace"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
        st.tuples(st.just("remove"), st.sampled_from(NAMES)),
        st.tuples(st.just("list"), st.sampled_from(["", "sub"])),
    ),
    max_size=40,
)
FLAGS = {
    "create": os.O_CREAT,
    "excl": os.O_CREAT | os.O_EXCL,
    "trunc": os.O_CREAT | os.O_TRUNC,
    "plain": 0,
}


def run(pair: Pair, operation: tuple[object, ...]) -> None:
    kind, *args = operation
    if kind == "open":
        name, flags = args
        assert isinstance(name, str)
        assert isinstance(flags, str)
        pair.open(name, os.O_RDWR | os.O_APPEND | FLAGS[flags])
    elif kind == "replace":
        source, target = args
        assert isinstance(source, str)
        assert isinstance(target, str)
        here = outcome(lambda: OS_FILES.replace(pair.directory / source, pair.directory / target))
        there = outcome(lambda: pair.pg.replace(ROOT / source, ROOT / target))
        assert here == there
    elif kind == "remove":
        name = str(args[0])
        pair.both(name, lambda files, path, _: files.remove(path))
    elif kind == "list":
        name = str(args[0])
        here = sorted(OS_FILES.names(pair.directory / name))
        assert here == sorted(pair.pg.names(ROOT / name))
    elif pair.fds:
        index = int(args[0]) % len(pair.fds)  # type: ignore[call-overload]
        if kind == "write":
            data = args[1]
            assert isinstance(data, bytes)
            pair.both("", lambda files, _, fd: files.write(fd, data), index)
        elif kind == "read":
            size, offset = args[1], args[2]
            assert isinstance(size, int)
            assert isinstance(offset, int)
            pair.both("", lambda files, _, fd: files.pread(fd, size, offset), index)
        elif kind == "truncate":
            length = args[1]
            assert isinstance(length, int)
            pair.both("", lambda files, _, fd: files.truncate(fd, length), index)
        elif kind == "size":
            pair.both("", lambda files, _, fd: files.size(fd), index)
        elif kind == "fsync":
            pair.fsync(index)
        else:
            pair.close(index)


# (Each example uses a broker id of its own in the test's database.)
@settings(
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(operations=OPERATIONS)
def test_pg_files_answer_as_the_operating_system_and_a_crash_keeps_the_last_commit(
    database: Database, operations: list[tuple[object, ...]]
) -> None:
    broker = f"b{next(_BROKERS)}"
    pg = PgFiles(database, "c1", broker, ROOT)
    with tempfile.TemporaryDirectory() as directory:
        pair = Pair(pg, Path(directory))
        try:
            pair.both("", lambda files, path, _: files.names(path / "sub"))
            for operation in operations:
                run(pair, operation)
            assert pg.committed() == pair.committed
            for name in NAMES:
                assert pg.exists(ROOT / name) == (Path(directory) / name).exists()
        finally:
            for os_fd, _ in pair.fds:
                OS_FILES.close(os_fd)
            pg.abandon()
        # A crash: the pending operations are lost, the last commit is what a new process reads.
        again = PgFiles(database, "c1", broker, ROOT)
        try:
            for name in NAMES:
                expected = pair.committed.get(name)
                assert again.exists(ROOT / name) == (expected is not None)
                if expected is not None:
                    fd = again.open(ROOT / name, os.O_RDONLY)
                    assert again.pread(fd, len(expected) + 10, 0) == expected
        finally:
            again.abandon()


def test_one_commit_takes_every_pending_operation_in_order(opened: Callable[..., PgFiles]) -> None:
    files = opened()
    assert files.names(ROOT / "journal") == []
    fd = files.open(ROOT / "journal" / "1.tmp", os.O_RDWR | os.O_CREAT | os.O_APPEND)
    for part in (b"one ", b"two ", b"three"):
        files.write(fd, part)
    files.close(fd)
    files.replace(ROOT / "journal" / "1.tmp", ROOT / "journal" / "1.log")
    assert files.pending == 5
    assert files.committed() == {}
    dir_fd = files.open(ROOT / "journal", os.O_RDONLY)
    files.fsync(dir_fd)
    assert files.pending == 0
    assert files.commits == 1
    assert files.committed() == {"journal/1.log": b"one two three"}
    with files._reader.cursor() as cursor:  # the three writes of one commit: one row
        rows = cursor.execute("SELECT count(*) FROM sluiceway_chunk").fetchone()
    assert rows == (1,)


def test_a_fence_that_refuses_rolls_the_commit_back_and_stops_the_store(
    opened: Callable[..., PgFiles],
) -> None:
    owned = [True]

    def fence(connection: object) -> None:
        if not owned[0]:
            raise Fenced("broker b9 took it over")

    files = opened(fence=fence)
    fd = files.open(ROOT / "seg", os.O_RDWR | os.O_CREAT | os.O_APPEND)
    files.write(fd, b"kept")
    files.fsync(fd)
    files.write(fd, b" lost")
    owned[0] = False
    with pytest.raises(OSError, match=r"no longer owns its store.*b9 took it over") as raised:
        files.fsync(fd)
    assert raised.value.errno == errno.EIO
    assert files.committed() == {"seg": b"kept"}
    owned[0] = True  # refused for good, even once the fence would let it through
    files.write(fd, b"more")  # (in memory, as a disk's page cache takes it)
    with pytest.raises(OSError, match="no longer owns"):
        files.fsync(fd)
    assert files.committed() == {"seg": b"kept"}


def test_a_connection_lost_in_a_commit_is_a_failed_fsync(
    opened: Callable[..., PgFiles], pg_url: str
) -> None:
    files = opened()
    fd = files.open(ROOT / "seg", os.O_RDWR | os.O_CREAT | os.O_APPEND)
    files.write(fd, b"x")
    pid = files._writer.info.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(OSError, match=r"committing to the database .* failed") as raised:
        files.fsync(fd)
    assert raised.value.errno == errno.EIO
    assert "password" not in str(raised.value)


def test_a_second_process_for_the_same_broker_is_refused(opened: Callable[..., PgFiles]) -> None:
    first = opened("b-same")
    with pytest.raises(StoreInUse, match=r"'b-same'.*in use by another broker process"):
        opened("b-same")
    opened("b-other")  # another broker id is another store
    first.shutdown()
    opened("b-same")  # the lock went with the first one's connection


def test_a_read_takes_only_the_range_asked_from_large_rows(
    opened: Callable[..., PgFiles],
) -> None:
    files = opened()
    fd = files.open(ROOT / "big", os.O_RDWR | os.O_CREAT | os.O_APPEND)
    data = random.Random(1).randbytes(3 * ROW_BYTES + 17)
    files.write(fd, data)
    files.fsync(fd)
    rows = files._select("big", ROW_BYTES - 5, ROW_BYTES + 5)
    assert [(position, len(part)) for position, part in rows] == [(0, 5), (ROW_BYTES, 5)]
    for offset, size in ((0, 10), (ROW_BYTES - 3, 6), (3 * ROW_BYTES, 100), (5, 2 * ROW_BYTES)):
        assert files.pread(fd, size, offset) == data[offset : offset + size]
    files.truncate(fd, ROW_BYTES + 3)  # pending: the committed rows past it are hidden
    assert files.pread(fd, 10, ROW_BYTES) == data[ROW_BYTES : ROW_BYTES + 3]
    files.fsync(fd)
    assert files.committed() == {"big": data[: ROW_BYTES + 3]}


def test_an_armed_crash_stops_every_later_operation(opened: Callable[..., PgFiles]) -> None:
    files = opened()
    fd = files.open(ROOT / "seg", os.O_RDWR | os.O_CREAT | os.O_APPEND)
    files.write(fd, b"a")
    files.fsync(fd)
    files.arm(2, random.Random(0))
    files.write(fd, b"b")
    with pytest.raises(SimulatedCrash):
        files.write(fd, b"c")
    assert files.down
    with pytest.raises(SimulatedCrash):
        files.fsync(fd)
    files.abandon()
    assert opened(files.broker_id).committed() == {"seg": b"a"}


def test_free_space_never_looks_low(opened: Callable[..., PgFiles]) -> None:
    free, total = opened().free_space(ROOT)
    assert free == total >= 1 << 40
