"""A broker killed with SIGKILL under persistent load, again and again.

Producers send persistent messages and wait for each RECEIPT; consumers acknowledge with
receipts. At a random moment the broker process is killed, then restarted on the same data
directory. After every restart:

- every message whose RECEIPT a producer got is still there, or was acknowledged;
- no acknowledged message (its ACK confirmed by a RECEIPT) is there again;
- nothing is there that was never sent;
- a message a consumer received before the crash and had not acknowledged comes back with
  redelivered:true.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sluiceway.testing import BrokerProcess
from tests.e2e.rawclient import ConnectionClosed, RawClient

QUEUE = "/queue/crash"
KILLS = 22
PRODUCERS = 3
CONSUMERS = 2


@dataclass
class Ledger:
    """What the clients know, shared by their threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: set[bytes] = field(default_factory=set)  # every body a producer tried to send
    receipted: set[bytes] = field(default_factory=set)  # the broker confirmed the SEND
    acked: set[bytes] = field(default_factory=set)  # the broker confirmed the ACK
    # ACK sent, RECEIPT not (yet) seen: the broker may or may not have acted on it before dying.
    acking: set[bytes] = field(default_factory=set)
    seen: set[bytes] = field(default_factory=set)  # received by a consumer at some point
    violations: list[str] = field(default_factory=list)


def produce(port: int, ledger: Ledger, name: str, stop: threading.Event) -> None:
    counter = 0
    client: RawClient | None = None
    try:
        client = RawClient(port, timeout=5)
        client.connect()
        while not stop.is_set():
            counter += 1
            body = f"{name}-{counter}".encode()
            with ledger.lock:
                ledger.sent.add(body)
            client.request("SEND", {"destination": QUEUE, "persistent": "true"}, body)
            with ledger.lock:
                ledger.receipted.add(body)
    except (ConnectionClosed, OSError, TimeoutError, AssertionError):
        return  # the broker died under us: expected
    finally:
        if client is not None:
            client.close()


def consume(port: int, ledger: Ledger, name: str, stop: threading.Event) -> None:
    client: RawClient | None = None
    try:
        client = RawClient(port, timeout=5)
        client.connect()
        client.subscribe(QUEUE, name, consumer_flow_limit="20")
        while not stop.is_set():
            try:
                (message,) = client.receive(1, timeout=0.5)
            except TimeoutError:
                continue
            body = message.body
            with ledger.lock:
                if body in ledger.acked:
                    ledger.violations.append(f"acknowledged {body!r} delivered again")
                if body in ledger.seen and message.headers.get("redelivered") != "true":
                    ledger.violations.append(f"{body!r} came back without redelivered:true")
                ledger.seen.add(body)
            if random.random() < 0.2:
                continue  # leave some unacknowledged: they must come back after a crash
            with ledger.lock:
                ledger.acking.add(body)
            client.request("ACK", {"id": message.headers["ack"]})
            with ledger.lock:
                ledger.acking.discard(body)
                ledger.acked.add(body)
    except (ConnectionClosed, OSError, TimeoutError, AssertionError):
        return
    finally:
        if client is not None:
            client.close()


def browse(port: int) -> list[bytes]:
    client = RawClient(port, timeout=10)
    client.connect()
    client.subscribe(QUEUE, "browse", browser="true", ack="auto")
    bodies = []
    while True:
        (message,) = client.receive(1)
        if message.headers.get("browser") == "end":
            break
        bodies.append(message.body)
    client.close()
    return bodies


def check(port: int, ledger: Ledger) -> None:
    present = browse(port)
    with ledger.lock:
        assert not ledger.violations, ledger.violations[:5]
        assert len(present) == len(set(present)), "a message is there twice"
        present_set = set(present)
        assert present_set <= ledger.sent, f"never sent: {sorted(present_set - ledger.sent)[:5]}"
        lost = ledger.receipted - ledger.acked - ledger.acking - present_set
        assert not lost, f"receipted and lost: {sorted(lost)[:5]}"
        back = present_set & ledger.acked
        assert not back, f"acknowledged yet back: {sorted(back)[:5]}"
        # An ACK in flight at the crash either took effect or not; from now on it is settled.
        ledger.acked |= ledger.acking - present_set
        ledger.acking.clear()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_persistent_messages_survive_repeated_sigkill(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    ledger = Ledger()
    rng = random.Random(20261121)
    for kill in range(KILLS):
        with BrokerProcess("-D", "imq.persist.file.segment.size=256k", data_dir=data_dir) as broker:
            check(broker.port, ledger)  # after each restart: nothing lost, nothing back
            stop = threading.Event()
            threads = [
                threading.Thread(target=produce, args=(broker.port, ledger, f"k{kill}p{i}", stop))
                for i in range(PRODUCERS)
            ] + [
                threading.Thread(target=consume, args=(broker.port, ledger, f"c{i}", stop))
                for i in range(CONSUMERS)
            ]
            for thread in threads:
                thread.start()
            time.sleep(rng.uniform(0.2, 1.0))  # let the load run for a random while, then crash
            broker.kill()
            stop.set()
            for thread in threads:
                thread.join(10)
    with BrokerProcess(data_dir=data_dir) as broker:
        check(broker.port, ledger)
    assert len(ledger.receipted) > KILLS * 20  # the load really ran
    assert ledger.acked  # and consumers really acknowledged
