"""A Spark query whose one broker is killed mid-stream and started again goes on by itself,
exactly once: a broker process, a queue read by leases into the exactly-once sink, the driver in
a process of its own (the failover test's job, given the one broker's address). The broker is
killed (kill -9) while a batch's leases are open, and started again on the same port and data
directory within the failover deadline; its journal brings back the leases, the stages and the
sink's last committed batch, and the query's operations, failing over meanwhile, go on there.
The query is never restarted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from sluiceway.client.pipeline import OutgoingMessage
from tests.client.test_pipeline_failover import Restarting, restarting
from tests.processes import descendants, group_killed
from tests.spark.cluster_job import BATCH, SINK, SOURCE
from tests.spark.conftest import wait_for
from tests.spark.test_cluster_failover import batches, connection, leased, settled
from tests.spark.test_crash import failure

JOB: Final = Path(__file__).with_name("cluster_job.py")
MESSAGES: Final = 4000
RUN_WAIT: Final = 240.0  # seconds for the query to start, or to finish after the restart
DAEMONS_EXIT: Final = 30.0  # seconds for Spark's Python daemons to exit once the JVM is gone

pytestmark = pytest.mark.timeout(600)


@contextlib.contextmanager
def spark_daemons_stopped() -> Iterator[None]:
    """However the block ends, wait for the Python daemons of the Spark driver it runs to exit,
    then kill those left. Each daemon puts itself in a process group of its own, so killing the
    job's group misses them; they exit once they see the JVM gone."""
    before = set(descendants(os.getpid()))
    try:
        yield
    finally:
        deadline = time.monotonic() + DAEMONS_EXIT
        while True:
            left = [
                p
                for p in descendants(os.getpid())
                if p not in before and "pyspark.daemon" in p.command
            ]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for process in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)


def test_a_query_goes_on_exactly_once_across_its_broker_killed_and_started_again(
    tmp_path: Path, job_env: dict[str, str]
) -> None:
    logs: list[str] = []
    with restarting(tmp_path / "data") as broker:
        try:
            run(broker, tmp_path, job_env, logs)
        finally:  # what each broker process logged, beside the job's log
            logs.append(broker.process.log)
            for number, log in enumerate(logs):
                (tmp_path / f"broker-{number}.log").write_text(log)


def run(broker: Restarting, work: Path, job_env: dict[str, str], logs: list[str]) -> None:
    with connection(broker.process) as at:
        at.send_many(OutgoingMessage(SOURCE, f"m{i}".encode()) for i in range(MESSAGES))
    log_path = work / "job.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, str(JOB), f"127.0.0.1:{broker.port}", str(work)],
            env=job_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, killed as one
        )
    with spark_daemons_stopped(), group_killed(process) as running:
        wait_for(
            lambda: (
                running.poll() is not None
                or (len(batches(work, "commits")) >= 2 and leased(broker.process))
            ),
            "the query to commit two batches and read the leases of another",
            RUN_WAIT,
        )
        assert running.poll() is None, failure(log_path)
        committed = len(batches(work, "commits"))
        assert committed < MESSAGES // BATCH, "ended before the kill"

        # kill -9 with the batch's leases open; started again on the same port meanwhile
        killed = broker.process
        broker.kill_and_restart()
        logs.append(killed.log)
        broker.wait_started()
        done = settled(broker.process, work)
        wait_for(lambda: running.poll() is not None or done(), "the query to finish", RUN_WAIT)
        assert running.poll() is None, failure(log_path)
        assert len(batches(work, "commits")) > committed

    with connection(broker.process) as at:
        read = at.read_lease(SINK, "check/1", max_messages=2 * MESSAGES)
        counts = Counter(message.body.decode() for message in read)
    assert counts == Counter(f"m{i}" for i in range(MESSAGES)), "lost or duplicated"
