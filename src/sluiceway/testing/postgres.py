"""A PostgreSQL server of its own for tests and benchmarks: Debian's server binaries, a new
database cluster in a temporary directory, listening on a loopback port only.

PostgreSQL refuses to run as root: when the caller is root the server runs as the `postgres`
user (which Debian's package creates), and its directory belongs to that user. The server is
stopped (fast shutdown, then killed if it lingers) by `stop`, and by the context manager however
the block ends. `./dev test` installs the package when it is missing; without it, `find_bin`
raises PostgresMissing, naming what to install.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from sluiceway.errors import SluicewayError

START_TIMEOUT: Final = 60.0  # seconds for initdb and for the server to accept connections
STOP_TIMEOUT: Final = 30.0  # seconds for a fast shutdown before the server is killed
SUPERUSER: Final = "postgres"


class PostgresMissing(SluicewayError):
    """PostgreSQL's server is not installed."""


def find_bin() -> Path:
    """The directory of the newest installed PostgreSQL server (initdb, postgres, pg_ctl)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).resolve().parent
    raise PostgresMissing(
        "PostgreSQL's server (initdb) is not installed: install Debian's postgresql package "
        "(./dev test does when it can)"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1:`port`, its files under a temporary directory.

    `fsync` False runs the server with fsync=off: for tests, where the database server itself
    is never crashed (brokers are), and a commit then costs no disk flush. Benchmarks keep it on.
    """

    def __init__(self, *, fsync: bool = False) -> None:
        self._bin = find_bin()
        self._fsync = fsync
        self._root = Path(tempfile.mkdtemp(prefix="sluiceway-pg-"))
        self._data = self._root / "data"
        self._process: subprocess.Popen[bytes] | None = None
        self.port = 0
        # As root, the server and its tools run as the postgres user (None: as the caller).
        self._uid: int | None = None
        self._gid: int | None = None
        self._groups: list[int] | None = None
        if os.geteuid() == 0:
            entry = pwd.getpwnam(SUPERUSER)
            os.chown(self._root, entry.pw_uid, entry.pw_gid)
            self._uid, self._gid, self._groups = entry.pw_uid, entry.pw_gid, []

    @property
    def log_path(self) -> Path:
        return self._root / "server.log"

    def url(self, database: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(  # noqa: S603 - the server's own binaries
            list(args),
            capture_output=True,
            timeout=START_TIMEOUT,
            check=False,
            user=self._uid,
            group=self._gid,
            extra_groups=self._groups,
        )

    def start(self) -> None:
        result = self._run(
            str(self._bin / "initdb"),
            "-D",
            str(self._data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
        )
        if result.returncode != 0:
            raise SluicewayError(f"initdb failed: {result.stderr.decode(errors='replace')}")
        for _attempt in range(5):
            self.port = free_port()
            if self._launch():
                return
        raise SluicewayError(f"PostgreSQL did not start; its log: {self._log_tail()}")

    def _launch(self) -> bool:
        options = [
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"port={self.port}",
            "-c", f"unix_socket_directories={self._root}",
            "-c", f"fsync={'on' if self._fsync else 'off'}",
            "-c", "max_connections=200",
            "-c", "shared_buffers=64MB",
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - the server writes to it until it stops
        with log:
            self._process = subprocess.Popen(  # noqa: S603 - the server's own binary
                [str(self._bin / "postgres"), "-D", str(self._data), *options],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                user=self._uid,
                group=self._gid,
                extra_groups=self._groups,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False  # the port was taken meanwhile, most likely: try another
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0),
            ):
                if self._accepts():
                    return True
            time.sleep(0.05)
        self.stop()
        raise SluicewayError(
            f"PostgreSQL did not accept connections within {START_TIMEOUT:.0f} s; its log: "
            f"{self._log_tail()}"
        )

    def _accepts(self) -> bool:
        result = subprocess.run(  # noqa: S603 - the server's own binaries
            [str(self._bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
            capture_output=True,
            timeout=START_TIMEOUT,
            check=False,
        )
        return result.returncode == 0

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError as error:
            return f"(no log: {error})"

    def create_database(self, name: str) -> str:
        """A new, empty database `name`; its URL."""
        result = subprocess.run(  # noqa: S603 - the server's own binaries
            [
                str(self._bin / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                name,
            ],
            capture_output=True,
            timeout=START_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise SluicewayError(
                f"createdb {name} failed: {result.stderr.decode(errors='replace')}"
            )
        return self.url(name)

    def pause(self) -> None:
        """Stop the whole server (SIGSTOP): it neither answers nor closes connections."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGCONT)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)
                process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=STOP_TIMEOUT)
        shutil.rmtree(self._root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server(*, fsync: bool = False) -> Iterator[PostgresServer]:
    """A started server, stopped and removed when the block ends."""
    server = PostgresServer(fsync=fsync)
    try:
        server.start()
        yield server
    finally:
        server.stop()
