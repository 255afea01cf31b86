"""Starting Spark for one analysis: local mode by default, any master with `--master`.

The JVM's log goes to stderr at level ERROR only (a properties file written for the run), and
the console progress bar is off: the command's own output is the report's path, and a failure is
one line. Spark needs Java 17 or later; without one PySpark fails deep inside its launcher, so
Java is looked for first and its absence said plainly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sluiceway.analysis.errors import SparkUnavailable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME: Final = "sluiceway-analyze"

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
        # Every shuffle of the job is small (the history grouped by destination, consumer or
        # sample): one task per core, where Spark's default of 200 schedules mostly empty tasks
        # (measured on two cores: a third less time with 2 than with 8).
        settings["spark.sql.shuffle.partitions"] = str(local_cores(master))
        # A local run is a short-lived JVM whose time goes mostly into compiling Spark's own
        # code: the quick compiler alone halves it (measured on two cores, a small history:
        # 72 s to 32 s). A history is at most imq.metrics.history.max_size (256m by default),
        # too little for the optimising compiler to pay for itself.
        settings["spark.driver.extraJavaOptions"] += " -XX:TieredStopAtLevel=1"
    settings.update(extra)
    return settings


def local_cores(master: str) -> int:
    """The cores a local master uses: local[N], or every core for local and local[*]."""
    inside = master.removeprefix("local").strip("[]").split(",")[0]
    if inside.isdigit() and int(inside) > 0:
        return int(inside)
    return os.cpu_count() or 1


@contextlib.contextmanager
def spark_session(master: str, extra: dict[str, str]) -> Iterator[SparkSession]:
    """A Spark session for the run, stopped at the end (the JVM goes with the process)."""
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
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SparkUnavailable(f"Spark did not start with master {master}: {first}") from exc
        try:
            yield session
        finally:
            session.stop()
