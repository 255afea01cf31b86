"""A full disk, end to end: a real broker process whose journal's disk really fills up.

Two real ways to make the kernel refuse the journal's writes:

- a tmpfs of 16 MiB mounted for the test, holding the broker's data directory. It needs root
  (CAP_SYS_ADMIN) and the `mount` command; without them the test skips and says which is
  missing. The free-space floor (measured with statvfs) raises the "low" alarm before the disk
  is full, and a filler file then takes the rest, so the journal's writes fail with ENOSPC.
- RLIMIT_FSIZE, lowered on the running broker with prlimit (Linux; no privilege is needed for
  one's own processes): the kernel refuses writes past the limit with EFBIG (Python ignores
  SIGXFSZ, so the write fails instead of killing the process); raising the limit again is
  "space returns". This always runs, and shows everything but the floor.

In both, persistent producers are held with a reason that names the disk; non-persistent
messages and consumers go on; RECEIPTs wait for their records; the broker resumes by itself
when space returns and accepts the held SENDs; and a broker killed afterwards recovers every
message a RECEIPT confirmed, in order. Every wait is bounded; the broker's disk checks run on
its once-a-second tick, so a state change is waited for with a poll of the admin API.
"""

from __future__ import annotations

import errno
import itertools
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluiceway.client.sync import AckMode, ConnectionFactory
from sluiceway.testing import BrokerProcess
from tests.admin.adminhttp import AdminHttp
from tests.cli.support import api, pairs, run_cmd
from tests.e2e.stomppy import connect, with_receipt
from tests.e2e.support import wait_until

pytestmark = pytest.mark.timeout(180)

ORDERS = "/queue/orders"  # persistent messages, sent while the disk fills
BACKLOG = "/queue/backlog"  # persistent messages waiting before it fills, consumed while full
LOW = "/queue/low"  # a persistent message sent while the disk is low
TRANSIENT = "/queue/transient"  # non-persistent messages, which go on whatever the disk does
BODY = b"d" * 8192
SENDS = 60  # persistent SENDs: 480 KiB, more than the room a full disk leaves them
TICKS = 15.0  # seconds a state change may take: the broker looks at its disk once a second
WAIT = 15.0  # seconds any other wait may take (a loaded machine)
MOUNT_SIZE = 16 * 1024 * 1024
FLOOR = 2 * 1024 * 1024  # imq.persist.file.disk.free.limit on the tmpfs


class Disk(Protocol):
    """What fills and frees the disk under a running broker."""

    def fill(self, broker: BrokerProcess, room: int) -> None:
        """Leave the journal about `room` bytes more to write."""
        ...

    def free(self, broker: BrokerProcess) -> None: ...


class Tmpfs:
    """A small tmpfs; a filler file takes its free space."""

    def __init__(self, mount_point: Path) -> None:
        self.mount_point = mount_point
        self.filler = mount_point / "filler"

    def available(self) -> int:
        stat = os.statvfs(self.mount_point)
        return stat.f_bavail * stat.f_frsize

    def fill(self, broker: BrokerProcess, room: int) -> None:
        wanted = self.available() - room
        with self.filler.open("ab") as filler:
            while wanted > 0:
                chunk = min(wanted, 1 << 20)
                try:
                    filler.write(b"\0" * chunk)
                    filler.flush()
                except OSError as exc:  # the broker wrote meanwhile: the disk is full anyway
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                wanted -= chunk

    def free(self, broker: BrokerProcess) -> None:
        self.filler.unlink(missing_ok=True)


class FileSizeLimit:
    """RLIMIT_FSIZE of the broker process, just above its active journal segment."""

    def fill(self, broker: BrokerProcess, room: int) -> None:
        segments = sorted((Path(broker.data_dir) / "journal").glob("*.log"))
        limit = segments[-1].stat().st_size + room
        resource.prlimit(broker.process.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    def free(self, broker: BrokerProcess) -> None:
        unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        resource.prlimit(broker.process.pid, resource.RLIMIT_FSIZE, unlimited)


@pytest.fixture
def tmpfs() -> Iterator[Tmpfs]:
    if os.geteuid() != 0:
        pytest.skip(
            f"mounting a tmpfs needs root (CAP_SYS_ADMIN); the tests run as uid {os.geteuid()}"
        )
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("mounting a tmpfs needs the mount and umount commands, not on PATH")
    mount_point = Path(tempfile.mkdtemp(prefix="sluiceway-small-disk-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={MOUNT_SIZE},mode=0700", "tmpfs", str(mount_point)],  # noqa: S607  (the system mount tools, from PATH)
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"mount -t tmpfs was refused here: {mounted.stderr.strip()}")
    try:
        yield Tmpfs(mount_point)
    finally:  # (after the brokers fixture has killed every broker still running on it)
        unmounted = subprocess.run(["umount", str(mount_point)], timeout=30, check=False)  # noqa: S607  (the system mount tools, from PATH)
        if unmounted.returncode != 0:  # still busy: detach it now, it goes once unused
            subprocess.run(["umount", "-l", str(mount_point)], timeout=30, check=True)  # noqa: S607  (the system mount tools, from PATH)
        mount_point.rmdir()


@pytest.fixture
def data_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="sluiceway-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Brokers:
    """Broker processes started by a test; each is stopped when it ends, even on failure."""

    def __init__(self) -> None:
        self.started: list[BrokerProcess] = []

    def start(self, data_dir: str, *properties: str) -> BrokerProcess:
        args = [arg for prop in properties for arg in ("-D", prop)]
        broker = BrokerProcess(*args, data_dir=data_dir, timeout=WAIT)
        self.started.append(broker)
        return broker


@pytest.fixture
def brokers() -> Iterator[Brokers]:
    started = Brokers()
    yield started
    for broker in started.started:
        if broker.process.poll() is None:
            broker.kill()


# -- looking at the broker ------------------------------------------------------------------------


def disk_state(broker: BrokerProcess) -> dict[str, Any]:
    status, snapshot = api(broker.admin_port, "GET", "/broker")
    assert status == 200, snapshot
    disk: dict[str, Any] = snapshot["disk"]
    return disk


def wait_state(broker: BrokerProcess, state: str) -> dict[str, Any]:
    wait_until(lambda: disk_state(broker)["state"] == state, TICKS)
    return disk_state(broker)


def held_reasons(broker: BrokerProcess) -> list[dict[str, Any]]:
    status, producers = api(broker.admin_port, "GET", "/producers")
    assert status == 200, producers
    return list(producers)


def prometheus_state(broker: BrokerProcess) -> str:
    status, body, _ = AdminHttp(broker.admin_port).raw("GET", "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "sluiceway_disk_state":
            (current,) = [s.labels["state"] for s in family.samples if s.value == 1]
            return current
    raise AssertionError("no sluiceway_disk_state in /metrics")


def queue_count(broker: BrokerProcess, name: str) -> int:
    status, detail = api(broker.admin_port, "GET", f"/destinations/queue/{name}")
    assert status == 200, detail
    count: int = detail["summary"]["msgs"]
    return count


# -- clients --------------------------------------------------------------------------------------


class Producer:
    """Persistent SENDs with receipts over stomp.py, not waiting for each."""

    def __init__(self, port: int) -> None:
        self.connection, self.recorder = connect(port)
        self.sent: dict[str, list[bytes]] = {}  # bodies by destination, in send order

    def send(self, destination: str = ORDERS) -> str:
        bodies = self.sent.setdefault(destination, [])
        body = BODY[:-8] + b"%08d" % len(bodies)
        receipt = f"{len(bodies)}@{destination}"
        self.connection.send(destination, body, headers={"persistent": "true", "receipt": receipt})
        bodies.append(body)
        return receipt

    def receipts(self, destination: str = ORDERS) -> int:
        suffix = "@" + destination
        return sum(1 for receipt in list(self.recorder.receipts) if receipt.endswith(suffix))

    def wait_receipts(self, destination: str = ORDERS) -> None:
        """Until every SEND to `destination` has its RECEIPT."""
        count = len(self.sent[destination])
        self.recorder.wait_for(lambda: self.receipts(destination) >= count, WAIT)

    def close(self) -> None:
        self.connection.disconnect()


def transient_flows(port: int) -> None:
    """Non-persistent messages go to a consumer, through the project's own client, and a
    non-persistent SEND's RECEIPT comes at once (stomp.py), even for a new destination, which
    speaks for sequence numbers in the journal."""
    with ConnectionFactory(f"stomp://127.0.0.1:{port}").connect() as connection:
        session = connection.session(AckMode.AUTO)
        consumer = session.consumer(TRANSIENT)
        session.producer(TRANSIENT, persistent=False).send(b"goes on")
        received = consumer.receive(timeout=WAIT)
        assert received is not None
        assert received.body == b"goes on"
    producer, recorder = connect(port)
    try:
        fresh = f"/queue/fresh-{next(_fresh)}"
        headers = {"persistent": "false"}
        with_receipt(
            recorder, lambda r: producer.send(fresh, b"x", headers={**headers, "receipt": r})
        )
    finally:
        producer.disconnect()


_fresh = itertools.count()


def consume(port: int, destination: str, count: int) -> list[bytes]:
    """`count` messages of `destination`, acknowledged (the project's own client)."""
    with ConnectionFactory(f"stomp://127.0.0.1:{port}").connect() as connection:
        consumer = connection.session(AckMode.AUTO).consumer(destination)
        bodies: list[bytes] = []
        for _ in range(count):
            message = consumer.receive(timeout=WAIT)
            assert message is not None, f"{len(bodies)} of {count} received"
            bodies.append(message.body)
        return bodies


# -- the scenario ---------------------------------------------------------------------------------


def fill_with_persistent_traffic(
    broker: BrokerProcess, disk: Disk, producer: Producer, reason: Callable[[str], bool]
) -> None:
    """Fill the disk with persistent SENDs until its writes fail; what follows is held."""
    disk.fill(broker, room=128 * 1024)
    for _ in range(SENDS):
        producer.send(ORDERS)
    full = wait_state(broker, "full")
    assert reason(full["reason"]), full["reason"]
    assert not full["reading_paused"]  # (what waits for the disk is far below its bound)
    wait_until(lambda: bool(held_reasons(broker)), WAIT)
    (held,) = held_reasons(broker)
    assert held["reason"] == "disk full"
    assert "the journal cannot write to the disk holding" in held["detail"]
    assert producer.receipts(ORDERS) < SENDS  # the held SENDs, and those whose records wait


def shows_full_everywhere(broker: BrokerProcess) -> None:
    assert prometheus_state(broker) == "full"
    shown = run_cmd("query", "bkr", admin_port=broker.admin_port)
    assert shown.status == 0, shown.err
    rows = pairs(shown.out)
    assert rows["Disk State"] == "FULL"
    assert "persistent messages are held" in rows["Disk State Reason"]
    assert " ERROR sluiceway.core.features.disk: disk full: the journal cannot write" in broker.log


def resumes_and_recovers(
    brokers: Brokers, broker: BrokerProcess, disk: Disk, producer: Producer, data_dir: str
) -> None:
    disk.free(broker)
    wait_state(broker, "ok")
    producer.wait_receipts(ORDERS)  # the held SENDs were accepted, and are on disk
    assert " INFO sluiceway.core.features.disk: disk ok again after " in broker.log
    wait_until(lambda: queue_count(broker, BACKLOG[len("/queue/") :]) == 0, WAIT)
    producer.close()
    broker.kill()  # nothing is flushed at the end: what a RECEIPT confirmed must be on disk
    restarted = brokers.start(data_dir)
    orders = producer.sent[ORDERS]
    status, snapshot = api(restarted.admin_port, "GET", "/broker")
    assert status == 200, snapshot
    assert snapshot["msgs"] == len(orders) + len(producer.sent.get(LOW, []))  # backlog: none
    assert consume(restarted.port, ORDERS, len(orders)) == orders
    restarted.stop()


def preload(port: int) -> Producer:
    """20 persistent messages in the backlog, confirmed; the producer that sent them."""
    producer = Producer(port)
    for _ in range(20):
        producer.send(BACKLOG)
    producer.wait_receipts(BACKLOG)
    return producer


def test_a_full_tmpfs_holds_persistent_producers_and_resumes_by_itself(
    tmpfs: Tmpfs, brokers: Brokers
) -> None:
    data_dir = str(tmpfs.mount_point / "data")
    broker = brokers.start(
        data_dir,
        "imq.persist.file.segment.size=256k",
        f"imq.persist.file.disk.free.limit={FLOOR}",
    )
    assert wait_state(broker, "ok")["free_limit"] == FLOOR
    producer = preload(broker.port)

    # Below the floor: an alarm before the disk is full.
    tmpfs.fill(broker, room=FLOOR // 2)
    low = wait_state(broker, "low")
    assert 0 < low["free"] < FLOOR
    receipt = producer.send(LOW)
    wait_until(lambda: bool(held_reasons(broker)), WAIT)
    (held,) = held_reasons(broker)
    assert held["reason"] == "disk low"
    assert held["limit"] == "imq.persist.file.disk.free.limit"
    assert "of imq.persist.file.disk.free.limit: persistent messages" in held["detail"]
    assert prometheus_state(broker) == "low"
    transient_flows(broker.port)
    assert receipt not in producer.recorder.receipts
    tmpfs.free(broker)
    wait_state(broker, "ok")
    producer.wait_receipts(LOW)
    assert " WARNING sluiceway.core.features.disk: disk low: the disk holding " in broker.log

    # Full: the journal's own writes fail.
    status, _ = api(
        broker.admin_port,
        "PATCH",
        "/broker",
        {"properties": {"imq.persist.file.disk.free.limit": "0"}},
    )
    assert status == 200
    fill_with_persistent_traffic(broker, tmpfs, producer, lambda r: "ENOSPC" in r)
    shows_full_everywhere(broker)
    transient_flows(broker.port)
    assert len(consume(broker.port, BACKLOG, 20)) == 20  # consumers go on
    resumes_and_recovers(brokers, broker, tmpfs, producer, data_dir)


def test_a_file_size_limit_holds_persistent_producers_and_resumes_by_itself(
    data_dir: str, brokers: Brokers
) -> None:
    if not hasattr(resource, "prlimit"):
        pytest.skip("lowering a running broker's RLIMIT_FSIZE needs resource.prlimit (Linux)")
    broker = brokers.start(data_dir, "imq.persist.file.disk.free.limit=0")
    disk = FileSizeLimit()
    producer = preload(broker.port)
    fill_with_persistent_traffic(broker, disk, producer, lambda r: "EFBIG" in r)
    shows_full_everywhere(broker)
    transient_flows(broker.port)
    assert len(consume(broker.port, BACKLOG, 20)) == 20
    resumes_and_recovers(brokers, broker, disk, producer, data_dir)
