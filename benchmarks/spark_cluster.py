"""A standalone Spark cluster on this machine, for the Spark benchmarks: one master and some
workers, started from the pip-installed pyspark with its own `bin/spark-class`.

    with StandaloneCluster(workers=2) as cluster:
        spark = SparkSession.builder.master(cluster.url).getOrCreate()

Every daemon binds 127.0.0.1 (`SPARK_LOCAL_IP` covers the web UIs too), on ports the system
picks (`--port 0`, `--webui-port 0`), read back from its log; the master's REST submission
server, which would take the fixed port 6066, is off. Each worker offers `cores` cores and
`memory` of memory to executors, keeps its files in a temporary directory, and runs Python
workers with this interpreter (`PYSPARK_PYTHON`).

Each daemon is a process group of its own, which holds the executors its worker launches.
Leaving the block (or a failed start) sends every group SIGTERM, then SIGKILL to what is left
after STOP_TIMEOUT: no process of the cluster outlives it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Final

import pyspark

SPARK_HOME: Final = Path(pyspark.__file__).parent
START_TIMEOUT: Final = 60.0  # seconds for a daemon's ready line; a JVM takes 5-10 s on two cores
STOP_TIMEOUT: Final = 20.0  # seconds a daemon has to end on SIGTERM before SIGKILL
LOG_LINES: Final = 200  # lines of each daemon's log kept, for the error when it fails
DAEMON_MEMORY: Final = "512m"  # heap of the master and of each worker (not of their executors)
MASTER_URL: Final = re.compile(r"Starting Spark master at (spark://\S+)")
REGISTERED: Final = re.compile(r"Successfully registered with master")


class Daemon:
    """One `spark-class` process in a process group of its own, its log read on a thread."""

    def __init__(self, name: str, arguments: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        self._changed = threading.Condition()
        self._ended = False
        self.process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *arguments],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:  # to its end: when every process of the group has ended
            for line in self.process.stdout:
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first line of the log (among the last LOG_LINES) that matches `pattern`;
        RuntimeError with the log's tail when the daemon ends or `timeout` passes first."""
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found.extend(m for m in map(pattern.search, self.lines) if m)
            return bool(found) or self._ended

        with self._changed:
            self._changed.wait_for(seen, timeout)
        if found:
            return found[0]
        why = "ended" if self._ended else f"did not log {pattern.pattern!r} within {timeout} s"
        tail = "\n".join(list(self.lines)[-20:])
        raise RuntimeError(f"the Spark {self.name} {why}; its log ends:\n{tail}")

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL to what is left of it after STOP_TIMEOUT."""
        with contextlib.suppress(ProcessLookupError):  # the whole group has ended already
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_TIMEOUT)
        with contextlib.suppress(ProcessLookupError):  # executors that outlived their worker
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(STOP_TIMEOUT)


class StandaloneCluster:
    """A master and `workers` workers of `cores` cores and `memory` each, started on entry;
    `url` is the master's `spark://127.0.0.1:PORT`."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.workers, self.cores, self.memory = workers, cores, memory
        self.url = ""
        self.daemons: list[Daemon] = []
        self._directory = ""

    def __enter__(self) -> StandaloneCluster:
        java = shutil.which("java", path=self._path())
        if java is None:
            raise RuntimeError(
                "Java is not installed: a Spark cluster needs a Java 17+ runtime "
                "(openjdk-17-jre-headless)"
            )
        self._directory = tempfile.mkdtemp(prefix="spark-cluster-")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @staticmethod
    def _path() -> str:
        java_home = os.environ.get("JAVA_HOME")
        path = os.environ.get("PATH", os.defpath)
        return f"{java_home}/bin{os.pathsep}{path}" if java_home else path

    def _environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable,
        }

    def _start(self) -> None:
        env = self._environment()
        master = Daemon(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
            ],
            env,
        )  # fmt: skip
        self.daemons.append(master)
        self.url = master.wait_for(MASTER_URL, START_TIMEOUT).group(1)
        for number in range(1, self.workers + 1):
            work = Path(self._directory) / f"worker-{number}"
            arguments = [
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(work),
                self.url,
            ]  # fmt: skip
            self.daemons.append(Daemon(f"worker {number}", arguments, env))
        for worker in self.daemons[1:]:
            worker.wait_for(REGISTERED, START_TIMEOUT)

    def stop(self) -> None:
        """Stop every daemon (workers first), whatever state the start left them in."""
        for daemon in reversed(self.daemons):
            daemon.stop()
        if self._directory:
            shutil.rmtree(self._directory, ignore_errors=True)
