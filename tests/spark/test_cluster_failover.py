"""A Spark query on a cluster whose member is killed mid-stream goes on by itself, exactly once:
two broker processes on a real PostgreSQL, a queue read by leases into the exactly-once sink,
the driver in a process of its own given both members in `addresses`. The member the query
uses is killed (kill -9); the other takes its store over with the query's leases, stages and
last committed batch, and the query's operations, refused by it until then, go on there."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.testing import BrokerProcess
from tests.cli.support import get
from tests.cluster.members import start_member
from tests.processes import group_killed
from tests.spark.cluster_job import BATCH, SINK, SOURCE
from tests.spark.conftest import wait_for
from tests.spark.test_crash import failure

JOB: Final = Path(__file__).with_name("cluster_job.py")
MESSAGES: Final = 4000
RUN_WAIT: Final = 240.0  # seconds for the query to start, or to finish after the kill

pytestmark = pytest.mark.timeout(900)


def connection(member: BrokerProcess) -> PipelineConnection:
    return PipelineConnection(PipelineSettings(port=member.port, timeout=30.0))


def batches(work: Path, kind: str) -> set[int]:
    """The batches the checkpoint planned (`offsets`) or committed (`commits`)."""
    folder = work / "checkpoint" / kind
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()


def leased(member: BrokerProcess) -> bool:
    """Whether messages of the source are in open leases at `member` (held, not waiting)."""
    source = get(member.admin_port, f"/destinations/queue/{SOURCE.removeprefix('/queue/')}")
    summary = source["summary"]
    return bool(summary["msgs"] > summary["pending"])


def settled(member: BrokerProcess, work: Path) -> Callable[[], bool]:
    """Whether every message went through: the source is empty at `member`, the sink holds as
    many, and no batch is in flight (the last one planned was committed)."""

    def check() -> bool:
        with connection(member) as at:
            if (at.head(SINK).message_count or 0) < MESSAGES:
                return False
            if at.head(SOURCE).message_count:
                return False
        return batches(work, "offsets") == batches(work, "commits")

    return check


def stop_with_leases_open(job: subprocess.Popen[str], member: BrokerProcess, work: Path) -> None:
    """Wait until the query has committed two batches and holds another's leases at `member`,
    then stop it there (SIGSTOP to its process group, the driver and its JVM): nothing it does
    can close those leases before the kill, however the machine's load times its steps. Left
    running when it ended instead."""
    deadline = time.monotonic() + RUN_WAIT

    def ready() -> bool:
        return job.poll() is not None or (len(batches(work, "commits")) >= 2 and leased(member))

    while True:
        wait_for(
            ready,
            "the query to commit two batches and read the leases of another",
            max(deadline - time.monotonic(), 1.0),
        )
        if job.poll() is not None:
            return
        os.killpg(job.pid, signal.SIGSTOP)
        # Read twice: an acknowledgement sent just before the stop has arrived by the second.
        if leased(member) and leased(member):
            return
        os.killpg(job.pid, signal.SIGCONT)  # the batch closed meanwhile: wait for the next
        if time.monotonic() > deadline:
            raise AssertionError(f"no batch's leases stayed open at a stop within {RUN_WAIT} s")


def test_a_query_goes_on_exactly_once_when_its_member_is_killed(
    pg_url: str, tmp_path: Path, job_env: dict[str, str]
) -> None:
    with start_member(pg_url, "a") as a, start_member(pg_url, "b") as b:
        try:
            run(a, b, tmp_path, job_env)
        finally:  # what the members logged, beside the job's log
            for member, name in ((a, "a"), (b, "b")):
                (tmp_path / f"{name}.log").write_text(member.log)


def run(a: BrokerProcess, b: BrokerProcess, tmp_path: Path, job_env: dict[str, str]) -> None:
    with connection(a) as at_a:
        at_a.send_many(OutgoingMessage(SOURCE, f"m{i}".encode()) for i in range(MESSAGES))
    addresses = f"127.0.0.1:{a.port},127.0.0.1:{b.port}"
    log_path = tmp_path / "job.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, str(JOB), addresses, str(tmp_path)],
            env=job_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, killed as one
        )
    with group_killed(process) as running:
        stop_with_leases_open(running, a, tmp_path)
        try:
            assert running.poll() is None, failure(log_path)
            assert len(batches(tmp_path, "commits")) < MESSAGES // BATCH, "ended before the kill"
            a.kill()  # kill -9 of the member the query uses, its batch's leases open
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.pid, signal.SIGCONT)
        done = settled(b, tmp_path)
        wait_for(lambda: running.poll() is not None or done(), "the query to finish", RUN_WAIT)
        assert running.poll() is None, failure(log_path)

    with connection(b) as at_b:
        read = at_b.read_lease(SINK, "check/1", max_messages=2 * MESSAGES)
        counts = Counter(message.body.decode() for message in read)
    assert counts == Counter(f"m{i}" for i in range(MESSAGES)), "lost or duplicated"
    assert re.search(r"took over broker a's store: .* [1-9]\d* queue leases", b.log), b.log
