"""Helpers for testing code that uses Sluiceway, shipped with the package.

- `FakeClock` drives the broker core deterministically: time moves only when a test says so.
- `BrokerThread` runs a real broker on a real socket (port 0 by default) on an event loop of its
  own, so blocking clients (stomp.py, the sync client) can talk to it from the test's thread.
  `call(fn)` runs `fn` on the broker's loop and returns its result, the safe way to look at broker
  state while it runs.
- `BrokerProcess` runs `sluiceway broker` as a separate process, for what only a process can
  show: start-up and shutdown, SIGTERM, and a broker killed (SIGKILL) or frozen (SIGSTOP).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from sluiceway.app.services import Services
from sluiceway.app.storage import Storage
from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.persist.files import OS_FILES, Files
from sluiceway.server.stomp_server import StompServer

T = TypeVar("T")

# An arbitrary fixed instant (2023-11-14T22:13:20Z) so timestamps in tests are reproducible.
FAKE_EPOCH_MS = 1_700_000_000_000
START_TIMEOUT_S = 10.0


@dataclass
class FakeClock:
    """A clock that stands still until `advance` is called."""

    wall_ms: int = FAKE_EPOCH_MS
    mono: float = 1000.0

    def time_ms(self) -> int:
        return self.wall_ms

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by `seconds`."""
        self.mono += seconds
        self.wall_ms += round(seconds * 1000)


class BrokerThread:
    """A broker serving STOMP on 127.0.0.1 from a background thread.

    `properties` are broker properties by their Open MQ names; the port defaults to 0 (any free
    port; `port` tells which, 0 when imq.stomp.tcp.port is -1; `services.addresses()` tells
    every listener's). Use as a context manager, or call start() and stop().
    """

    def __init__(
        self, properties: Mapping[str, str] | None = None, *, files: Files = OS_FILES
    ) -> None:
        """`files`: where the journal's files are (a simulated disk, to fail its writes)."""
        self._files = files
        values = {"imq.stomp.tcp.port": "0", "imq.admin.http.port": "0"}
        values.update(properties or {})
        # A data directory of its own unless told which (then it is kept, for restarts).
        self._own_directory: str | None = None
        if "imq.persist.file.directory" not in values:
            self._own_directory = tempfile.mkdtemp(prefix="sluiceway-test-")
            values["imq.persist.file.directory"] = self._own_directory
        self.config = build_config(values)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sluiceway-broker", daemon=True)
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stopping: asyncio.Event | None = None
        self._abandoned = False  # start() gave up waiting: stop as soon as started
        self.broker: Broker | None = None
        self.services: Services | None = None
        self.server: StompServer | None = None  # the plain STOMP listener (None when off)
        self.host = ""
        self.port = 0  # the plain STOMP listener's; 0 when it is off
        self.admin_port = 0  # 0 when the admin endpoint is off

    def __enter__(self) -> BrokerThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        try:
            self._started.result(timeout=START_TIMEOUT_S)
        except BaseException:
            # Too slow, or the test's own timeout interrupted the wait: the caller never
            # stops a broker it was not given, so it stops itself once it has started.
            self._abandoned = True
            self.stop()
            raise

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        storage: Storage | None = None
        try:
            storage = Storage(self.config, files=self._files)
            self.broker, _ = storage.open_broker()
            self.services = Services(self.broker)
            self.server = self.services.stomp
            storage.notifier.attach(asyncio.get_running_loop(), self.services.synced)
            await self.services.start()
            addresses = self.services.addresses()
            self.host, self.port = addresses.get("stomp", (self.config.host, 0))
            self.admin_port = addresses["admin"][1] if "admin" in addresses else 0
            self._stopping = asyncio.Event()
            if self._abandoned:
                self._stopping.set()
        except BaseException as exc:
            if storage is not None:
                storage.close()
            self._started.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return  # start() raises it, in the thread that asked (a refused start)
        self._started.set_result(None)
        try:
            await self._stopping.wait()
            await self.services.stop()
        finally:
            storage.close()

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run `fn` on the broker's event loop and return what it returns."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Shut the broker down cleanly (clients get an ERROR, then are closed)."""
        if self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        if self._own_directory is not None:
            shutil.rmtree(self._own_directory, ignore_errors=True)


_READY = re.compile(r"Sluiceway \S+ ready: (.*)")
_READY_STOMP = re.compile(r"(?:^|, )STOMP on [^\s,]+:(\d+)")
_READY_ADMIN = re.compile(r"(?:^|, )admin on [^\s,]+:(\d+)")


class BrokerProcess:
    """`sluiceway broker` in a child process; `port` is read from its ready line (0 when the
    plain STOMP listener is off: `--port -1`; `ready` holds the line's list of listeners).

    `args` are extra command-line arguments (`-D name=value`, `--config FILE`); the port is 0
    (any free one) unless `port` is given; the data directory is `data_dir`, or a temporary one
    removed when the process is stopped or killed.
    """

    def __init__(
        self, *args: str, port: int = 0, data_dir: str | None = None, timeout: float = 20.0
    ) -> None:
        self._own_directory: str | None = None
        if data_dir is None:
            data_dir = self._own_directory = tempfile.mkdtemp(prefix="sluiceway-test-")
        self.data_dir = data_dir
        admin = (
            () if any("imq.admin.http.port" in a for a in args) else ("-D", "imq.admin.http.port=0")
        )
        command = [
            sys.executable,
            "-m",
            "sluiceway",
            "broker",
            "--port",
            str(port),
            "--data-dir",
            data_dir,
            *admin,
            *args,
        ]
        # In the caller's process group, not one of its own: killing the group of a program
        # that started it (a test killing an example it runs) takes the broker along.
        self.process = subprocess.Popen(  # noqa: S603  (our own command, fixed arguments)
            command,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self.admin_port = 0  # from the ready line; 0 when the admin endpoint is off
        self.ready = ""  # what the ready line lists: "STOMP on 127.0.0.1:61613, admin on ..."
        self._ready_seen = threading.Event()  # set at the ready line, or when the log ends
        # Reading from the start, on a thread of its own: the wait for the ready line is then
        # bounded by `timeout` even when the broker logs nothing, and a full pipe never blocks
        # the broker.
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        try:
            self.port = self._wait_ready(timeout)
        except BaseException:
            # However the start ends (no ready line, the test's own timeout interrupting the
            # wait), the caller never gets the object to stop: stop the process here.
            self.kill()
            raise

    def _wait_ready(self, timeout: float) -> int:
        if not self._ready_seen.wait(timeout) or not self.ready:
            raise RuntimeError(
                f"the broker did not log its ready line within {timeout} s:\n" + self.log
            )
        admin = _READY_ADMIN.search(self.ready)
        self.admin_port = int(admin.group(1)) if admin else 0
        stomp = _READY_STOMP.search(self.ready)
        return int(stomp.group(1)) if stomp else 0

    def _read_log(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        for line in stderr:
            self.lines.append(line)
            match = _READY.search(line) if not self.ready else None
            if match:
                self.ready = match.group(1).strip()
                self._ready_seen.set()
        self._ready_seen.set()

    @property
    def log(self) -> str:
        """Everything it logged so far."""
        return "".join(self.lines)

    def stop(self, timeout: float = 20.0) -> tuple[int, str]:
        """SIGTERM, then wait: (exit status, everything it logged). A broker that does not
        exit within `timeout` is killed before the wait's TimeoutExpired is raised."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except BaseException:
            self.kill()
            raise
        self._finish_reading()
        self._cleanup()
        return self.process.returncode, self.log

    def _finish_reading(self) -> None:
        stderr = self.process.stderr
        self._reader.join(timeout=5)
        if stderr is not None and not self._reader.is_alive():
            stderr.close()

    def kill(self) -> None:
        """SIGKILL: the broker dies at once, as in a crash."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._finish_reading()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._own_directory is not None:
            shutil.rmtree(self._own_directory, ignore_errors=True)

    def freeze(self) -> None:
        """SIGSTOP: the broker keeps its sockets open and answers nothing."""
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process.poll() is None:
            self.thaw()
            self.kill()
