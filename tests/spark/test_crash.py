"""A Spark driver killed mid-stream (SIGKILL of its whole process group: the Python driver, the
JVM and the Python workers) and restarted from its checkpoints loses nothing and duplicates
nothing, reading a topic by sequence number and a queue by leases."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from sluiceway.client.pipeline import PipelineConnection
from sluiceway.testing import BrokerThread
from tests.processes import group_killed
from tests.spark.conftest import publish, settings, wait_for
from tests.spark.crash_job import BATCH, QUERIES

JOB: Final = Path(__file__).with_name("crash_job.py")
MESSAGES: Final = 3000
BATCHES: Final = MESSAGES // BATCH
RUN_WAIT: Final = 240.0


@pytest.fixture
def broker() -> Iterator[BrokerThread]:
    with BrokerThread() as running:
        yield running


def job(broker: BrokerThread, work: Path, mode: str, env: dict[str, str]) -> subprocess.Popen[str]:
    with (work / f"{mode}.log").open("w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, str(JOB), str(broker.port), str(work), mode],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, killed as one
        )


def failure(log: Path) -> str:
    """What a failed job printed, shortened: the lines naming an exception or its cause (a
    Spark stack trace buries them far above its last lines), then the log's end."""
    lines = log.read_text().splitlines()
    causes = [line for line in lines if "Exception" in line and not line.lstrip().startswith("at ")]
    return "\n".join([*causes[:20], "...", *lines[-15:]])


def committed_batches(work: Path, name: str) -> int:
    commits = work / name / "checkpoint" / "commits"
    if not commits.is_dir():
        return 0
    return sum(1 for p in commits.iterdir() if p.name.isdigit())


@pytest.mark.timeout(600)
def test_a_killed_driver_restarts_from_its_checkpoint_without_loss_or_duplicates(
    broker: BrokerThread, tmp_path: Path, job_env: dict[str, str]
) -> None:
    with PipelineConnection(settings(broker)) as connection:
        connection.open_cursor(QUERIES["topic"], "crash-topic", "earliest")
    for destination in QUERIES.values():
        publish(broker, destination, 0, MESSAGES)

    with group_killed(job(broker, tmp_path, "stream", job_env)) as running:
        wait_for(
            lambda: (
                running.poll() is not None
                or all(committed_batches(tmp_path, name) >= 2 for name in QUERIES)
            ),
            "both queries to commit two batches",
            RUN_WAIT,
        )
        assert running.poll() is None, failure(tmp_path / "stream.log")
    for name in QUERIES:
        assert committed_batches(tmp_path, name) < BATCHES, f"{name} ended before the kill"

    with group_killed(job(broker, tmp_path, "drain", job_env)) as restarted:
        assert restarted.wait(RUN_WAIT) == 0, failure(tmp_path / "drain.log")
    expected = Counter(f"m{i}" for i in range(MESSAGES))
    for name in QUERIES:
        result = json.loads((tmp_path / name / "result.json").read_text())
        assert Counter(result) == expected, f"{name}: lost or duplicated messages"
    with PipelineConnection(settings(broker)) as connection:
        assert connection.head(QUERIES["queue"]).message_count == 0
