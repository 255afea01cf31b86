"""The jdbc store end to end: real broker processes with imq.persist.store=jdbc on a real
PostgreSQL, clients on real sockets (stomp.py and our own), SIGKILL and restart; a second
process for the same broker id refused; an unreachable database refused in one line."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from sluiceway.app.storage import Storage
from sluiceway.client import ConnectionFactory
from sluiceway.config import build_config
from sluiceway.persist.pg_files import Fenced
from sluiceway.persist.segments import JournalError
from sluiceway.testing import BrokerProcess
from sluiceway.testing.postgres import free_port
from tests.e2e.stomppy import connect, with_receipt
from tests.persistence.raw import client, drain

START_TIMEOUT = 20.0  # seconds: a start-up on a loaded machine, tables created first


def jdbc(url: str, broker_id: str = "b1") -> tuple[str, ...]:
    return (
        "-D",
        "imq.persist.store=jdbc",
        "-D",
        f"imq.persist.jdbc.postgresql.property.url={url}",
        "-D",
        f"imq.brokerid={broker_id}",
        "-D",
        "imq.persist.jdbc.connect.timeout=2",
    )


def send_with_our_client(port: int, destination: str, bodies: list[str]) -> None:
    async def scenario() -> None:
        factory = ConnectionFactory(f"stomp://127.0.0.1:{port}")
        async with await factory.connect() as connection:
            producer = connection.session().producer(destination)
            for body in bodies:
                await producer.send(body, persistent=True)  # returns once receipted

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_receipted_messages_survive_sigkill_once_and_acknowledged_ones_stay_gone(
    pg_url: str, tmp_path: Path
) -> None:
    with BrokerProcess(
        *jdbc(pg_url), data_dir=str(tmp_path / "one"), timeout=START_TIMEOUT
    ) as broker:
        connection, recorder = connect(broker.port)
        try:
            for i in range(20):
                with_receipt(
                    recorder,
                    lambda receipt, i=i: connection.send(  # type: ignore[misc]
                        "/queue/jdbc",
                        f"stomp.py {i}",
                        headers={"persistent": "true", "receipt": receipt},
                    ),
                )
        finally:
            connection.disconnect()
        send_with_our_client(broker.port, "/queue/jdbc", [f"client {i}" for i in range(20)])
        consumer = client(broker.port)
        consumer.subscribe("/queue/jdbc", consumer_flow_limit="5")
        taken = consumer.receive(5)
        for message in taken:
            consumer.request("ACK", {"id": message.headers["ack"]})
        broker.kill()
    acknowledged = {message.body for message in taken}
    # Started again on another data directory: the store is the database's, not the directory's.
    with BrokerProcess(
        *jdbc(pg_url), data_dir=str(tmp_path / "two"), timeout=START_TIMEOUT
    ) as broker:
        back = drain(broker.port, "/queue/jdbc")
        broker.stop()
    bodies = [body for body, _ in back]
    expected = [f"stomp.py {i}".encode() for i in range(20)] + [
        f"client {i}".encode() for i in range(20)
    ]
    assert sorted(bodies) == sorted(set(expected) - acknowledged)
    assert len(bodies) == len(set(bodies))
    with psycopg.connect(pg_url) as connection:
        files = connection.execute(
            "SELECT count(*) FROM sluiceway_file WHERE broker_id = 'b1'"
        ).fetchone()
    assert files is not None
    assert files[0] >= 1


def run_broker(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sluiceway",
            "broker",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path),
            "-D",
            "imq.admin.http.port=-1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )


@pytest.mark.timeout(120)
def test_a_second_broker_with_the_same_id_is_refused(pg_url: str, tmp_path: Path) -> None:
    with BrokerProcess(
        *jdbc(pg_url), data_dir=str(tmp_path / "one"), timeout=START_TIMEOUT
    ) as broker:
        second = run_broker(tmp_path / "two", *jdbc(pg_url))
        assert second.returncode == 1
        (line,) = [line for line in second.stderr.splitlines() if "cannot start" in line]
        assert "store of broker 'b1'" in line
        assert "in use by another broker process" in line
        assert "Traceback" not in second.stderr
        other = BrokerProcess(
            *jdbc(pg_url, "b2"), data_dir=str(tmp_path / "three"), timeout=START_TIMEOUT
        )
        other.stop()
        broker.stop()


@pytest.mark.timeout(120)
def test_an_unreachable_database_stops_the_start_in_one_line(tmp_path: Path) -> None:
    url = f"postgresql://sluiceway:secret@127.0.0.1:{free_port()}/nowhere"
    result = run_broker(tmp_path, *jdbc(url))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "cannot start" in line]
    assert "cannot reach the database postgresql://sluiceway@127.0.0.1:" in line
    assert "secret" not in result.stderr


def test_storage_runs_the_fence_it_is_given_in_every_commit(pg_url: str, tmp_path: Path) -> None:
    owned = [True]
    checked: list[bool] = []

    def fence(connection: object) -> None:
        checked.append(owned[0])
        if not owned[0]:
            raise Fenced("broker b9 took it over")

    config = build_config(
        {
            "imq.persist.file.directory": str(tmp_path),
            "imq.persist.store": "jdbc",
            "imq.persist.jdbc.postgresql.property.url": pg_url,
            "imq.brokerid": "b1",
        }
    )
    storage = Storage(config, fence=fence)
    try:
        assert storage.pg_files is not None
        assert storage.pg_files.fence is fence
        storage.open_broker()
        assert storage.journal_store is not None
        journal = storage.journal_store.journal
        journal.add(1, b"a record")
        journal.sync_active()
        assert checked
        assert all(checked)
        owned[0] = False
        journal.add(1, b"another")
        with pytest.raises(JournalError, match=r"no longer owns its store \(broker b9 took it"):
            journal.sync_active()
        with pytest.raises(JournalError):
            journal.add(1, b"refused")
    finally:
        with contextlib.suppress(JournalError):
            storage.close()
