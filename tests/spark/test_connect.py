"""The data source and sink through Spark Connect: a remote session talks to a Spark Connect
server of its own (a separate process on 127.0.0.1), whose Python workers run the data source.

One server for the module: it takes about as long to start as a local session."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pyspark
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

import sluiceway.spark
from sluiceway.client.pipeline import PipelineConnection, StageState
from sluiceway.testing import BrokerThread
from tests.processes import Process, descendants, describe
from tests.spark.conftest import SPARK_WAIT, java_problem, publish, settings, wait_for

pytestmark = pytest.mark.timeout(600)

SERVER_CLASS: Final = "org.apache.spark.sql.connect.service.SparkConnectServer"
# The server binds port 0 and logs the port it was given (INFO, Spark's default log level).
STARTED: Final = re.compile(r"Spark Connect server started at: 127\.0\.0\.1:(\d+)")
SERVER_START: Final = 240  # seconds: a JVM and a Spark context, on two busy cores
SERVER_STOP: Final = 60  # seconds for the server, then its Python workers, to exit
# What the module set: a remote session marks the whole process as using Spark Connect.
CONNECT_MODE: Final = "SPARK_CONNECT_MODE_ENABLED"


def server_command(work: Path) -> list[str]:
    """spark-submit of the pip-installed PySpark, running its Spark Connect server (its jar
    ships in pyspark/jars) in local mode, every address 127.0.0.1."""
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    confs = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": "0",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.local.dir": str(work),
    }
    command = [str(spark_submit), "--class", SERVER_CLASS, "--master", "local[2]"]
    command += ["--driver-memory", "1g"]
    for name, value in confs.items():
        command += ["--conf", f"{name}={value}"]
    return command


def server_environment(work: Path) -> dict[str, str]:
    """The server's Python workers run this interpreter, which imports sluiceway; an empty
    configuration directory keeps any spark-defaults.conf or log4j2.properties out."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPARK_")}
    return {
        **env,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_CONF_DIR": str(work),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def log_tail(log: Path) -> str:
    """The server's log lines naming an exception, then its end (for a failed start)."""
    lines = log.read_text(errors="replace").splitlines()
    causes = [line for line in lines if "Exception" in line and not line.lstrip().startswith("at ")]
    return "\n".join([*causes[:10], "...", *lines[-15:]])


def server_port(server: subprocess.Popen[bytes], log: Path) -> int:
    found: list[int] = []

    def started() -> bool:
        match = STARTED.search(log.read_text(errors="replace"))
        if match:
            found.append(int(match.group(1)))
        return bool(match) or server.poll() is not None

    wait_for(started, "the Spark Connect server to start", SERVER_START)
    assert found, f"the Spark Connect server exited ({server.returncode}):\n{log_tail(log)}"
    return found[0]


def stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the server's process group, then its Python workers: PySpark's worker daemons put
    themselves in groups of their own, and exit once the server has gone."""
    spawned = descendants(server.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)  # lets Spark delete its temporary directories
    try:
        server.wait(SERVER_STOP)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(SERVER_STOP)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)  # anything left in its group

    def alive() -> list[Process]:
        return [p for p in spawned if describe(p.pid) == p]

    deadline = time.monotonic() + SERVER_STOP
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(process.pid), signal.SIGKILL)


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    work = tmp_path_factory.mktemp("connect-server")
    log = work / "server.log"
    with log.open("wb") as output:  # the server keeps its own descriptor
        server = subprocess.Popen(
            server_command(work),
            env=server_environment(work),
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, stopped as one
        )
    try:
        yield f"sc://127.0.0.1:{server_port(server, log)}"
    finally:
        stop(server)


@pytest.fixture(scope="module")
def remote(connect_url: str) -> Iterator[SparkSession]:
    had_connect_mode = CONNECT_MODE in os.environ
    session = SparkSession.builder.remote(connect_url).getOrCreate()
    try:
        sluiceway.spark.register(session)
        yield session
    finally:
        session.stop()
        if not had_connect_mode:  # the next modules' local sessions must not take it as set
            os.environ.pop(CONNECT_MODE, None)


@pytest.fixture(scope="module")
def module_broker() -> Iterator[BrokerThread]:
    with BrokerThread() as broker:
        yield broker


def texts(broker: BrokerThread, destination: str) -> Counter[str]:
    with PipelineConnection(settings(broker)) as connection:
        return Counter(m.text for m in connection.read_range(destination, 0, None))


def test_a_queue_streams_through_connect_into_the_exactly_once_sink(
    remote: SparkSession, module_broker: BrokerThread, tmp_path: Path
) -> None:
    publish(module_broker, "/queue/connect.in", 0, 3000)
    source = (
        remote.readStream.format("sluiceway")
        .option("port", str(module_broker.port))
        .option("destination", "/queue/connect.in")
        .option("group", "connect")
        .option("maxMessagesPerTrigger", "1000")
        .load()
    )
    query = (
        source.writeStream.format("sluiceway")
        .option("port", str(module_broker.port))
        .option("destination", "/queue/connect.out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(SPARK_WAIT), "the query did not end"
        assert query.exception() is None
        progress = query.recentProgress
    finally:
        query.stop()
    # (Progress read from a remote query has attributes; item access gives None.)
    assert [p.numInputRows for p in progress if p.numInputRows] == [1000, 1000, 1000]
    assert texts(module_broker, "/queue/connect.out") == Counter(f"m{i}" for i in range(3000))
    with PipelineConnection(settings(module_broker)) as connection:
        assert connection.head("/queue/connect.in").message_count == 0
        # The sink staged and committed each batch under the name it read from the checkpoint.
        probe = connection.commit_stage(f"spark-{query.id}", 2, ["probe"])
    assert probe.state is StageState.COMMITTED_BEFORE


def test_a_batch_write_and_read_through_connect(
    remote: SparkSession, module_broker: BrokerThread
) -> None:
    rows = [(f"b{i}", {"k": str(i)}) for i in range(500)]
    frame = remote.createDataFrame(rows, "body string, headers map<string,string>")
    frame.repartition(2).write.format("sluiceway").option("port", str(module_broker.port)).option(
        "destination", "/queue/connect.table"
    ).mode("append").save()
    with PipelineConnection(settings(module_broker)) as connection:
        assert connection.head("/queue/connect.table").message_count == 500

    reader = remote.read.format("sluiceway").option("port", str(module_broker.port))
    read = reader.option("destination", "/queue/connect.table").load()
    assert sorted(r.text for r in read.select("text").collect()) == sorted(
        f"b{i}" for i in range(500)
    )
    # A remote load() sends nothing: a bad option is refused when Spark first analyses the read.
    bad = reader.option("destination", "/queue/connect.table").option("minPartitions", "0").load()
    with pytest.raises(AnalysisException, match="minPartitions"):
        bad.count()
