"""The suite's safety net for processes: none it starts outlives the run unnoticed.

Each test stops what it starts (the fixtures and context managers of `sluiceway.testing` kill
their broker however the test ends). This net catches the ones that slip through: a test that
fails between starting a process and handing it to a fixture, a helper that forgets a process,
an example whose broker was orphaned when the example was killed.

The run makes itself a child subreaper (Linux), so an orphaned descendant is re-parented to it
rather than to init, and stays visible here. After every test the net notes which test was
running when each live descendant was first seen; at the end it kills whatever is still alive
and reports it, naming the test, so the leak is fixed rather than hidden.

Two children are meant to live until the end and are not leaks: the Java gateway a local Spark
session runs on (shared by every session of the run; stopped here, at the end), and the
resource tracker of `multiprocessing` (it exits when the run closes its pipe).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

PR_SET_CHILD_SUBREAPER: Final = 36  # <linux/prctl.h>
GATEWAY_EXIT_WAIT: Final = 30.0  # seconds for Spark's JVM to exit once its stdin is closed


@dataclass(frozen=True)
class Process:
    """A process as the net knows it: a pid is only reused with another start time."""

    pid: int
    started: int  # clock ticks after boot (/proc/PID/stat field 22)
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.command}"


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux only; elsewhere, orphans go to init unseen)."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def children(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's), or none once it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # it ended since it was listed
        return found
    for task in tasks:
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            found.extend(int(child) for child in text.split())
    return found


def describe(pid: int) -> Process | None:
    """`pid` as a Process, or None when it is gone or a zombie (dead, only not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return Process(pid, int(fields[19]), command[:300])


def descendants(pid: int) -> list[Process]:
    """The live descendants of `pid`, parents before their children."""
    found: list[Process] = []
    waiting = children(pid)
    while waiting:
        child = waiting.pop(0)
        process = describe(child)
        if process is not None:
            found.append(process)
        waiting.extend(children(child))
    return found


@contextlib.contextmanager
def group_killed(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """Kill the process group `process` leads (started with start_new_session=True) however
    the block ends, then wait for `process`: a program that starts others (an example starting
    a broker and Spark) leaves none of them behind."""
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_group(
    command: list[str], timeout: float, **options: Any
) -> subprocess.CompletedProcess[str]:
    """Run `command` (text output captured) in a process group of its own, bounded by
    `timeout`; the whole group is killed however the run ends."""
    started = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **options,
    )
    with group_killed(started) as process:
        stdout, stderr = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def reap() -> None:
    """Collect the exit status of every dead child: only once the run is over, as it takes
    the status a `Popen` still waiting for its child would read."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def stop_spark_gateway() -> None:
    """End the JVM local Spark sessions run on, if one was started: it lives until its stdin
    closes, which would otherwise be when the run exits."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext  # noqa: PLC0415  (only when the run used Spark)

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is not None and process.stdin is not None:
        process.stdin.close()
        # Still alive after the wait: the net kills it and reports it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=GATEWAY_EXIT_WAIT)


def resource_tracker_pid() -> int | None:
    """The pid of `multiprocessing`'s resource tracker, if this run started one."""
    if "multiprocessing.resource_tracker" not in sys.modules:
        return None
    from multiprocessing import resource_tracker  # noqa: PLC0415  (only when already loaded)

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return pid if isinstance(pid, int) else None


def kill(processes: list[Process]) -> None:
    """SIGKILL each (a frozen one too), then reap them."""
    for process in processes:
        if describe(process.pid) == process:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(describe(p.pid) == p for p in processes) and time.monotonic() < deadline:
        time.sleep(0.01)
    reap()


@dataclass
class ProcessWatch:
    """Which test was running when each descendant of the run was first seen alive."""

    pid: int = field(default_factory=os.getpid)
    first_seen: dict[Process, str] = field(default_factory=dict)

    def start(self) -> None:
        become_subreaper()

    def note(self, test: str) -> None:
        """After `test`: attribute the descendants not seen before to it."""
        for process in descendants(self.pid):
            self.first_seen.setdefault(process, test)

    def finish(self) -> list[str]:
        """Stop the helpers meant to live until the end, kill what is left: one line each."""
        stop_spark_gateway()
        tracker = resource_tracker_pid()
        left = [p for p in descendants(self.pid) if p.pid != tracker]
        kill(left)
        return [f"{p} (first seen after {self.first_seen.get(p, 'the last test')})" for p in left]
