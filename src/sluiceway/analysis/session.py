"""Starting Spark for one analysis: local mode by default, any master with `--master`.

The JVM's log goes to stderr at level ERROR only (a properties file written for the run), and
the console progress bar is off: the command's own output is the report's path, and a failure is
one line. Spark needs Java 17 or later; without one PySpark fails deep inside its launcher, so
Java is looked for first and its absence said plainly.

A standalone master (spark://) is reached before Spark starts. Spark's own client tries to
register with an unreachable master 3 times, 20 s apart (fixed in its code, no setting changes
it), then stops the context; PySpark then raises "Cannot call methods on a stopped SparkContext",
which names no cause, and the cause is only in Spark's log. A TCP connection to the master's
port, bounded by MASTER_CONNECT_TIMEOUT_S, tells in a moment what is wrong.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from sluiceway.analysis.errors import SparkUnavailable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME: Final = "sluiceway-analyze"
SHUFFLE_PARTITIONS: Final = "spark.sql.shuffle.partitions"
# Every shuffle of the job is small: the history grouped by destination, consumer or sample. A
# history is at most imq.metrics.history.max_size (256m by default) of JSON, and its shuffles
# carry a few columns of it, well within the 64 MiB Spark aims at per partition. So one task
# per core the session has, up to this many; Spark's default of 200 schedules mostly empty
# tasks, each with its own overhead, on a cluster a network round trip too (measured on two
# cores: a third less time with 2 than with 8).
MAX_SHUFFLE_PARTITIONS: Final = 8
MASTER_CONNECT_TIMEOUT_S: Final = 10.0  # a master's port answers in well under a second
MAX_CAUSES: Final = 20  # Java causes followed to the deepest (a chain may loop back)

# Spark's own loggers stay at ERROR. The two named loggers decide whether Spark prints its
# "Setting default log level" banner when it starts from Python; naming them silences it.
LOG4J2: Final = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n%ex
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
"""


def find_java() -> str | None:
    """The java PySpark's launcher will run: $JAVA_HOME/bin/java, else java on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java")


def spark_settings(master: str, log_config: Path, extra: dict[str, str]) -> dict[str, str]:
    """The Spark properties of the run; `extra` (from --conf) wins over these defaults."""
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config.as_uri()}",
    }
    if master.startswith("local"):
        # A laptop's host name often resolves to an address of no interface, or to nothing;
        # a local run never needs more than the loopback address.
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        # A local run is a short-lived JVM whose time goes mostly into compiling Spark's own
        # code: the quick compiler alone halves it (measured on two cores, a small history:
        # 72 s to 32 s). A history is at most imq.metrics.history.max_size (256m by default),
        # too little for the optimising compiler to pay for itself.
        settings["spark.driver.extraJavaOptions"] += " -XX:TieredStopAtLevel=1"
    settings.update(extra)
    return settings


def shuffle_partitions(parallelism: int) -> int:
    """Shuffle partitions for a session whose default parallelism (its cores: local[N]'s N, a
    cluster's executor cores) is `parallelism`."""
    return max(1, min(parallelism, MAX_SHUFFLE_PARTITIONS))


def tune_shuffles(session: SparkSession, extra: dict[str, str]) -> None:
    """Set spark.sql.shuffle.partitions, unless the user did: with --conf (`extra`), or in
    spark-defaults.conf (then in the context's configuration)."""
    context = session.sparkContext
    if SHUFFLE_PARTITIONS in extra or context.getConf().contains(SHUFFLE_PARTITIONS):
        return
    session.conf.set(SHUFFLE_PARTITIONS, str(shuffle_partitions(context.defaultParallelism)))


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The (host, port) of each master a standalone URL names: spark://HOST:PORT, or several
    separated by commas (masters kept highly available by ZooKeeper)."""
    addresses = []
    for part in master.removeprefix("spark://").split(","):
        try:
            where = urlsplit(f"spark://{part}")
            host, port = where.hostname, where.port
        except ValueError:
            host = port = None
        if not host or port is None:
            raise SparkUnavailable(
                f"the master URL {master} does not name a host and port in {part!r}: write "
                "spark://HOST:PORT (7077 unless the master was started with another port)"
            )
        addresses.append((host, port))
    return addresses


def check_master(master: str, timeout: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """A standalone master must accept a connection (one of them, when several are named)."""
    if not master.startswith("spark://"):
        return  # a local master has nothing to reach; YARN and Kubernetes say why themselves
    failures = []
    for host, port in master_addresses(master):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            failures.append(f"{host}:{port}: {_unreachable(exc, timeout)}")
    raise SparkUnavailable(
        f"cannot reach the Spark master {master} ({'; '.join(failures)}): start it "
        "(sbin/start-master.sh), check the URL against the one its web UI shows, or leave out "
        "--master to run Spark on this machine"
    )


def _unreachable(error: OSError, timeout: float) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused, nothing listens on that port"
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(error, socket.gaierror):
        return f"unknown host ({error.strerror})"
    return error.strerror or str(error)


def spark_error(error: BaseException) -> str:
    """One line saying why PySpark failed. For an error of the JVM (Py4J's), its deepest cause:
    Py4J's own text ("An error occurred while calling None.org.apache...") names only the call."""
    text = str(error)
    java = getattr(error, "java_exception", None)
    if java is not None:
        for _ in range(MAX_CAUSES):
            deeper = java.getCause()
            if deeper is None:
                break
            java = deeper
        text = str(java.toString())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _start_failure(master: str, error: Exception) -> SparkUnavailable:
    reason = spark_error(error)
    if master.startswith("spark://") and "stopped SparkContext" in reason:
        # The master answered (check_master) but did not register the application; Spark
        # logged why (at ERROR, above) and stopped the context.
        reason = (
            "the master did not register the application and Spark gave up (3 attempts, 20 s "
            "apart): check that the URL is the one the master's web UI shows and that the "
            "master can connect back to this machine (set spark.driver.host to an address it "
            "reaches)"
        )
    return SparkUnavailable(f"Spark did not start with master {master}: {reason}")


@contextlib.contextmanager
def spark_session(master: str, extra: dict[str, str]) -> Iterator[SparkSession]:
    """A Spark session for the run, stopped at the end (the JVM goes with the process)."""
    check_master(master)
    if find_java() is None:
        raise SparkUnavailable(
            "Spark needs Java 17 or later and none was found: set JAVA_HOME or put java on "
            "the PATH (e.g. apt-get install openjdk-17-jre-headless)"
        )
    try:
        from pyspark.sql import SparkSession  # noqa: PLC0415  (only `analyze` needs PySpark)
    except ImportError:
        raise SparkUnavailable(
            "PySpark is not installed: pip install 'sluiceway[spark]' (PySpark 4.2 or later, "
            "pyarrow, pandas and matplotlib)"
        ) from None
    with tempfile.TemporaryDirectory(prefix="sluiceway-analyze-") as scratch:
        log_config = Path(scratch) / "log4j2.properties"
        log_config.write_text(LOG4J2, encoding="utf-8")
        builder = SparkSession.builder.master(master).appName(APP_NAME)
        for key, value in spark_settings(master, log_config, extra).items():
            builder = builder.config(key, value)
        try:
            session = builder.getOrCreate()
        except Exception as exc:  # PySpark raises several kinds; all mean Spark did not start
            raise _start_failure(master, exc) from exc
        try:
            tune_shuffles(session, extra)
            yield session
        finally:
            session.stop()
