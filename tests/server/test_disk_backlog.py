"""The records waiting for a full disk are bounded: past imq.persist.file.disk.backlog.max_size
the broker reads no client, and reads them again by itself once the disk takes the records.

A real broker on a real socket, its journal on the simulated disk (the file seam), so that the
test decides when the disk is full; clients are raw STOMP over TCP.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluiceway.core.broker import Broker
from sluiceway.core.features.disk import DiskLevel
from sluiceway.persist.simulated import SimulatedDisk
from sluiceway.testing import BrokerThread
from tests.e2e.rawclient import RawClient
from tests.e2e.support import connection_infos, wait_until

WAIT = 15.0  # seconds: a state change waits for the broker's once-a-second tick
Q = "/queue/q"


@pytest.fixture
def disk() -> SimulatedDisk:
    return SimulatedDisk()


@pytest.fixture
def broker(disk: SimulatedDisk) -> Iterator[BrokerThread]:
    properties = {
        "imq.persist.file.disk.free.limit": "0",
        "imq.persist.file.disk.backlog.max_size": "1k",
    }
    with BrokerThread(properties, files=disk) as started:
        yield started
        disk.capacity = None  # so that it stops cleanly, writing what waited


def core(broker: BrokerThread) -> Broker:
    assert broker.broker is not None
    return broker.broker


def level(broker: BrokerThread) -> DiskLevel:
    return broker.call(lambda: core(broker).disk.level)


def test_no_client_is_read_past_the_backlog_bound_until_the_disk_takes_it(
    broker: BrokerThread, disk: SimulatedDisk
) -> None:
    producer = RawClient(broker.port)
    producer.connect()
    for n in range(200):
        producer.send("SEND", {"destination": Q, "persistent": "true"}, b"%d" % n)
    producer.sync()
    consumer = RawClient(broker.port)
    consumer.connect()
    consumer.subscribe(Q, ack="client-individual")
    messages = consumer.receive(200)
    consumer.sync()
    broker.call(lambda: setattr(disk, "capacity", disk.used()))  # the disk is full from here
    # Each ACK read alone makes a record that waits in memory, until they reach the bound.
    for message in messages:
        consumer.ack(message)
        if broker.call(lambda: core(broker).disk.reading_stopped):
            break
    assert level(broker) is DiskLevel.FULL
    # What the consumer sends from here on is not handled (the BEGIN would be answered at once).
    consumer.send("BEGIN", {"transaction": "t1", "receipt": "begun"})
    wait_until(lambda: any(info.reading_paused for info in connection_infos(broker)), WAIT)
    # A new client still gets CONNECTED (the CONNECT writes nothing); nothing after it is read.
    late = RawClient(broker.port)
    late.connect()
    late.send("SEND", {"destination": "/queue/other", "receipt": "late"}, b"non-persistent")
    with pytest.raises(TimeoutError):
        late.expect("RECEIPT", timeout=1.5)
    backlog = broker.call(lambda: core(broker).disk.backlog)
    assert 1024 <= backlog < 1024 + 512  # the bound, and what the last read brought
    broker.call(lambda: setattr(disk, "capacity", None))  # space returns
    assert late.expect("RECEIPT", timeout=WAIT).headers["receipt-id"] == "late"
    assert level(broker) is DiskLevel.OK
    assert consumer.expect("RECEIPT", timeout=WAIT).headers["receipt-id"] == "begun"
    consumer.sync()
    for client in (producer, consumer, late):
        client.close()
