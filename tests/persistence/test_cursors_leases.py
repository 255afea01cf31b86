"""Topic cursors and queue leases across restarts, clean and by SIGKILL: they come back exactly,
with their messages, and a lease read again after a crash returns what it returned before."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.e2e.rawclient import ConnectionClosed, RawClient
from tests.e2e.reading import commit, end_lease, read, read_cursor, read_lease, send
from tests.e2e.support import wait_until
from tests.persistence.raw import client

Q, T = "/queue/work", "/topic/feed"


def seen(messages: list[Frame]) -> list[tuple[bytes, str, str, str]]:
    """What must not change when a message is read again: body, id, sequence, delivery count."""
    return [
        (m.body, m.headers["message-id"], m.headers["sequence"], m.headers["delivery-count"])
        for m in messages
    ]


@dataclass
class Picture:
    """Everything the scenario's readers can see."""

    open_lease: list[tuple[bytes, str, str, str]]
    open_end: dict[str, str]
    cursor: list[tuple[bytes, str, str, str]]
    cursor_end: dict[str, str]
    acknowledged: str
    released: str
    waiting: list[bytes]


def scenario(port: int) -> None:
    """Leases acknowledged, released and open, a committed cursor; every step confirmed."""
    raw = client(port)
    send(raw, Q, 8)
    raw.request("SEND", {"destination": Q, "persistent": "false"}, b"transient")
    read_lease(raw, Q, "g/1", lease_max_messages="2")
    end_lease(raw, Q, "g/1")
    read_lease(raw, Q, "g/2", lease_max_messages="2")
    end_lease(raw, Q, "g/2", "NACK")
    read_lease(raw, Q, "g/3", lease_max_messages="3")  # m2, m3 (redelivered) and m4
    read_cursor(raw, T, "c")
    send(raw, T, 5, "t")
    _, end = read_cursor(raw, T, "c")
    commit(raw, T, "c", int(end.headers["cursor-sequence"]) + 2)


def picture(port: int) -> Picture:
    raw = client(port)
    lease, lease_end = read_lease(raw, Q, "g/3")
    cursor, cursor_end = read_cursor(raw, T, "c", from_sequence="0")
    keep = ("lease-state", "lease-count", "lease-expires", "cursor-sequence", "first-sequence")
    browse, _ = read(raw, Q, browser="true")
    return Picture(
        open_lease=seen(lease),
        open_end={k: v for k, v in lease_end.headers.items() if k in keep},
        cursor=seen(cursor),
        cursor_end={k: v for k, v in cursor_end.headers.items() if k in keep},
        acknowledged=read_lease(raw, Q, "g/1")[1].headers["lease-state"],
        released=read_lease(raw, Q, "g/2")[1].headers["lease-state"],
        waiting=[m.body for m in browse],
    )


def check_first(before: Picture) -> None:
    assert [row[0] for row in before.open_lease] == [b"m2", b"m3", b"m4"]
    assert [row[3] for row in before.open_lease] == ["2", "2", "1"]
    assert [row[0] for row in before.cursor] == [b"t2", b"t3", b"t4"]
    assert (before.acknowledged, before.released) == ("acknowledged", "expired")
    assert before.open_end["lease-state"] == "open"


def test_cursors_and_leases_come_back_after_a_clean_restart(tmp_path: Path) -> None:
    properties = {"imq.persist.file.directory": str(tmp_path)}
    with BrokerThread(properties) as broker:
        scenario(broker.port)
        before = picture(broker.port)
    check_first(before)
    assert before.waiting == [b"m5", b"m6", b"m7", b"transient"]
    with BrokerThread(properties) as broker:
        after = picture(broker.port)
        end_lease(client(broker.port), Q, "g/3")
    assert after == Picture(**{**before.__dict__, "waiting": [b"m5", b"m6", b"m7"]})
    with BrokerThread(properties) as broker:
        raw = client(broker.port)
        assert read_lease(raw, Q, "g/3")[1].headers["lease-state"] == "acknowledged"
        messages, _ = read_lease(raw, Q, "g/4")
        assert [m.body for m in messages] == [b"m5", b"m6", b"m7"]


def test_cursors_and_leases_come_back_after_sigkill(tmp_path: Path) -> None:
    data = str(tmp_path)
    with BrokerProcess(data_dir=data) as broker:
        scenario(broker.port)
        before = picture(broker.port)
        broker.kill()
    check_first(before)
    with BrokerProcess(data_dir=data) as broker:
        after = picture(broker.port)
    assert after == Picture(**{**before.__dict__, "waiting": [b"m5", b"m6", b"m7"]})


# -- a reader and a producer, killed again and again --------------------------------------------

KILLS = 8
BATCH = "7"  # messages per lease


@dataclass
class Ledger:
    """What the clients were told, across every broker run."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: set[bytes] = field(default_factory=set)  # a SEND was written
    receipted: set[bytes] = field(default_factory=set)  # ...and confirmed
    consumed: list[bytes] = field(default_factory=list)  # in leases whose ACK was confirmed
    number: int = 1  # the lease the reader works on
    acknowledged: int = 0  # leases whose ACK the reader saw confirmed, during the crash runs
    lease: list[bytes] | None = None  # what lease `number` returned, once its read completed
    violations: list[str] = field(default_factory=list)


def produce(port: int, ledger: Ledger, run: int, stop: threading.Event) -> None:
    raw: RawClient | None = None
    try:
        raw = RawClient(port, timeout=5)
        raw.connect()
        for count in range(1_000_000):
            if stop.is_set():
                return
            body = f"r{run}-{count}".encode()
            with ledger.lock:
                ledger.sent.add(body)
            raw.request("SEND", {"destination": Q, "persistent": "true"}, body)
            with ledger.lock:
                ledger.receipted.add(body)
    except (ConnectionClosed, OSError, TimeoutError, AssertionError):
        return  # the broker died under us: expected
    finally:
        if raw is not None:
            raw.close()


def work(port: int, ledger: Ledger, stop: threading.Event) -> None:
    """Read lease N; after a crash read it again (it must be the same, or acknowledged);
    acknowledge it; go on with N+1."""
    raw: RawClient | None = None
    try:
        raw = RawClient(port, timeout=5)
        raw.connect()
        while not stop.is_set():
            name = f"spark/{ledger.number}"
            messages, end = read_lease(raw, Q, name, lease_max_messages=BATCH)
            bodies = [m.body for m in messages]
            state = end.headers["lease-state"]
            with ledger.lock:
                if state == "acknowledged" and ledger.lease is not None:
                    # Its ACK took effect before the crash; the RECEIPT never came.
                    ledger.consumed.extend(ledger.lease)
                    ledger.number, ledger.lease = ledger.number + 1, None
                    continue
                if state != "open":
                    ledger.violations.append(f"{name} came back {state}")
                    return
                if ledger.lease is not None and bodies != ledger.lease:
                    ledger.violations.append(f"{name} read {bodies}, before {ledger.lease}")
                ledger.lease = bodies
            end_lease(raw, Q, name)
            with ledger.lock:
                ledger.consumed.extend(bodies)
                ledger.number, ledger.lease = ledger.number + 1, None
                ledger.acknowledged += 1
    except (ConnectionClosed, OSError, TimeoutError, AssertionError):
        return
    finally:
        if raw is not None:
            raw.close()


def progressed(ledger: Ledger, acknowledged: int) -> bool:
    with ledger.lock:
        return ledger.acknowledged > acknowledged


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_leases_stay_exact_through_repeated_sigkill(tmp_path: Path) -> None:
    data = str(tmp_path)
    ledger = Ledger()
    rng = random.Random(20261122)
    for run in range(KILLS):
        with BrokerProcess("-D", "imq.persist.file.segment.size=64k", data_dir=data) as broker:
            stop = threading.Event()
            threads = [
                threading.Thread(target=produce, args=(broker.port, ledger, run, stop)),
                threading.Thread(target=work, args=(broker.port, ledger, stop)),
            ]
            for thread in threads:
                thread.start()
            # Once the reader has finished a lease in this run, crash at a random moment.
            wait_until(partial(progressed, ledger, ledger.acknowledged), timeout=30)
            time.sleep(rng.uniform(0.0, 0.7))  # chooses the moment of the crash: waits for nothing
            broker.kill()
            stop.set()
            for thread in threads:
                thread.join(10)
        assert not ledger.violations, ledger.violations
    with BrokerProcess(data_dir=data) as broker:
        raw = client(broker.port, timeout=10)
        if ledger.lease is not None:  # an open lease from before the last crash: finish it
            messages, end = read_lease(raw, Q, f"spark/{ledger.number}")
            state = end.headers["lease-state"]
            assert state in ("open", "acknowledged"), state
            if state == "open":
                assert [m.body for m in messages] == ledger.lease
                end_lease(raw, Q, f"spark/{ledger.number}")
            ledger.consumed.extend(ledger.lease)
            ledger.number += 1
        while True:
            messages, _ = read_lease(raw, Q, f"spark/{ledger.number}", lease_max_messages="1000")
            end_lease(raw, Q, f"spark/{ledger.number}")
            ledger.number += 1
            if not messages:
                break
            ledger.consumed.extend(m.body for m in messages)
    consumed = ledger.consumed
    assert len(consumed) == len(set(consumed)), "a message was consumed twice"
    assert ledger.receipted <= set(consumed), "a confirmed message was lost"
    assert set(consumed) <= ledger.sent, "a message nobody sent"
    assert ledger.acknowledged >= KILLS  # the reader worked in every run
