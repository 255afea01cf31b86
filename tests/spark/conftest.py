"""Fixtures for the Spark tests: one local SparkSession per module, real brokers, helpers.

A local session takes about 15 s to start, so each module shares one (local[2], no UI, two
shuffle partitions). Spark needs Java: without it the tests that need a session are skipped,
naming what is missing (./dev installs openjdk-17-jre-headless).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from pyspark.sql import SparkSession

import sluiceway.spark
from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.testing import BrokerThread

# Bounds every wait on Spark; streaming batch 0 alone takes several seconds on two cores.
SPARK_WAIT: Final = 120  # seconds (Spark's awaitTermination takes whole seconds)


def java_problem() -> str | None:
    """Why Spark cannot start here, or None when a usable Java is found."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None or not Path(java).exists():
        return "Java is not installed (Spark needs a Java 17+ runtime: openjdk-17-jre-headless)"
    try:
        result = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Java at {java} does not run: {exc}"
    if result.returncode != 0:
        return f"Java at {java} fails: {result.stderr.strip()[:200]}"
    return None


def spark_environment() -> dict[str, str]:
    """Python workers must run this interpreter (it has pyarrow and sluiceway)."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@pytest.fixture
def job_env() -> dict[str, str]:
    """The environment of a Spark driver run as a process of its own (skipped without Java)."""
    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    return {**os.environ, **spark_environment()}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    saved = {name: os.environ.get(name) for name in spark_environment()}
    os.environ.update(spark_environment())
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sluiceway-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    sluiceway.spark.register(session)
    yield session
    session.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def settings(broker: BrokerThread) -> PipelineSettings:
    return PipelineSettings(port=broker.port, timeout=30.0)


def publish(broker: BrokerThread, destination: str, start: int, count: int) -> None:
    """Send messages `m<start>` ... `m<start+count-1>`, each confirmed by the broker."""
    with PipelineConnection(settings(broker)) as connection:
        connection.send_many(
            OutgoingMessage(destination, f"m{i}".encode(), headers={"n": str(i)})
            for i in range(start, start + count)
        )


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = SPARK_WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)
