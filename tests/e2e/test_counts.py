"""Bounded counts over real sockets: open transactions and the messages they hold (raw frames and
stomp.py), a topic's cursors and a queue's lease groups (raw frames), with the journal on disk.

Each limit refuses the first request past it with status 414, the limit headers naming the
property, as an ERROR that closes the connection or, for a client that asked for failed
receipts, a failed RECEIPT that keeps it; nothing else changes, and nothing is journalled.
Cursors and lease groups the journal holds are kept at a restart, even beyond a lowered limit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sluiceway.naming import parse_destination
from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory, StompFactory
from tests.e2e.limits import assert_accepted, expect_error_and_close, on_loop
from tests.e2e.rawclient import RawClient
from tests.e2e.reading import read, read_cursor, read_lease, send
from tests.e2e.stomppy import sync, with_receipt
from tests.e2e.support import wait_connection_count

Q, T = "/queue/jobs", "/topic/events"


def limited(headers: dict[str, str]) -> tuple[str | None, str | None, str | None]:
    """The status and limit headers of an ERROR or failed RECEIPT."""
    return headers.get("status"), headers.get("limit"), headers.get("limit-value")


def journal_changes(broker: BrokerThread) -> int:
    return on_loop(broker, lambda core: core.store.changes)


def cursor_groups(broker: BrokerThread, path: str = T) -> list[str]:
    def groups(core: Any) -> list[str]:
        return sorted(cursor.group for cursor in core.cursors if cursor.topic.name.path == path)

    return on_loop(broker, groups)


def lease_groups(broker: BrokerThread, path: str = Q) -> int:
    return on_loop(broker, lambda core: core.leases.group_count(parse_destination(path)))


# -- transactions: raw frames ---------------------------------------------------------------------


def test_a_begin_past_the_limit_gets_a_failed_receipt_and_the_connection_goes_on(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.stomp.max_transactions": "2"})
    client = clients(broker.port, failed_receipts="true")
    client.request("BEGIN", {"transaction": "a"})
    client.request("BEGIN", {"transaction": "b"})
    receipt = client.request("BEGIN", {"transaction": "c"})
    assert limited(receipt.headers) == ("414", "imq.stomp.max_transactions", "2")
    assert receipt.headers["message"] == "too many open transactions"
    assert "raise imq.stomp.max_transactions" in receipt.headers["detail"]
    # Both transactions still work, and a place freed takes a new one.
    client.request("SEND", {"destination": Q, "transaction": "a"}, b"in-a")
    client.request("COMMIT", {"transaction": "a"})
    client.request("BEGIN", {"transaction": "c"})
    client.request("ABORT", {"transaction": "b"})
    client.request("ABORT", {"transaction": "c"})
    assert [m.body for m in client.consume_all(Q)] == [b"in-a"]


def test_a_begin_past_the_limit_without_failed_receipts_is_an_error_and_a_close(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.stomp.max_transactions": "1"})
    client, other = clients(broker.port), clients(broker.port)
    client.request("BEGIN", {"transaction": "a"})
    client.request("SEND", {"destination": Q, "transaction": "a"}, b"never")
    client.send("BEGIN", {"transaction": "b", "receipt": "r"})
    error = expect_error_and_close(client)
    assert limited(error.headers) == ("414", "imq.stomp.max_transactions", "1")
    assert error.headers["receipt-id"] == "r"
    assert b"imq.stomp.max_transactions" in error.body
    wait_connection_count(broker, 1)
    # The closed connection's transaction was aborted; the broker goes on.
    other.request("SEND", {"destination": Q}, b"after")
    assert [m.body for m in other.consume_all(Q)] == [b"after"]


def test_a_send_past_what_transactions_may_hold_leaves_the_transaction_open(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker(
        {"imq.stomp.transactions.max_messages": "3", "imq.stomp.transactions.max_bytes": "1k"}
    )
    client = clients(broker.port, failed_receipts="true")
    client.request("BEGIN", {"transaction": "a"})
    client.request("BEGIN", {"transaction": "b"})
    in_a, in_b = {"destination": Q, "transaction": "a"}, {"destination": Q, "transaction": "b"}
    client.request("SEND", in_a, b"x" * 1000)
    before = journal_changes(broker)
    receipt = client.request("SEND", in_b, b"y" * 25)  # 1025 bytes together
    assert limited(receipt.headers) == ("414", "imq.stomp.transactions.max_bytes", "1024")
    assert "transaction 'b' stays open" in receipt.headers["detail"]
    client.request("SEND", in_b, b"b1")
    client.request("SEND", in_b, b"b2")
    receipt = client.request("SEND", in_a, b"a2")
    assert limited(receipt.headers) == ("414", "imq.stomp.transactions.max_messages", "3")
    assert journal_changes(broker) == before  # nothing was published or recorded
    client.request("COMMIT", {"transaction": "b"})
    client.request("ABORT", {"transaction": "a"})
    assert [m.body for m in client.consume_all(Q)] == [b"b1", b"b2"]


# -- transactions: stomp.py ---------------------------------------------------------------------


def test_stomp_py_sending_past_the_limit_in_a_transaction_gets_an_error_and_loses_it(
    make_broker: BrokerFactory, stomp_clients: StompFactory
) -> None:
    broker = make_broker({"imq.stomp.transactions.max_messages": "2"})
    producer, recorder = stomp_clients(broker.port)
    tx = producer.begin()
    producer.send(Q, "one", transaction=tx)
    producer.send(Q, "two", transaction=tx)
    producer.send(Q, "three", transaction=tx)
    recorder.wait_for(lambda: bool(recorder.errors) and recorder.disconnected)
    (error,) = recorder.errors
    assert limited(error.headers) == ("414", "imq.stomp.transactions.max_messages", "2")
    assert error.headers["message"] == "too many messages in transactions"
    assert "imq.stomp.transactions.max_messages" in error.body
    # The transaction went with the connection; a new connection sends as usual.
    wait_connection_count(broker, 0)
    consumer, seen = stomp_clients(broker.port)
    consumer.subscribe(Q, id="s", ack="auto")
    consumer.send(Q, "after")
    seen.wait_messages(1)
    sync(consumer, seen)
    assert [m.body for m in seen.take()] == ["after"]


def test_stomp_py_with_failed_receipts_commits_what_the_transaction_held(
    make_broker: BrokerFactory, stomp_clients: StompFactory
) -> None:
    broker = make_broker({"imq.stomp.transactions.max_messages": "2"})
    producer, recorder = stomp_clients(broker.port, **{"failed-receipts": "true"})
    tx = producer.begin()

    def send(body: str) -> dict[str, str]:
        return with_receipt(
            recorder, lambda r: producer.send(Q, body, transaction=tx, headers={"receipt": r})
        )

    assert_accepted(send("one"))
    assert_accepted(send("two"))
    refused = send("three")
    assert limited(refused) == ("414", "imq.stomp.transactions.max_messages", "2")
    with_receipt(recorder, lambda r: producer.commit(tx, headers={"receipt": r}))
    assert recorder.errors == []
    producer.subscribe(Q, id="s", ack="auto")
    assert [m.body for m in recorder.wait_messages(2)] == ["one", "two"]
    sync(producer, recorder)
    assert [m.body for m in recorder.take()] == ["one", "two"]


# -- cursors and lease groups -------------------------------------------------------------------


def subscribe_refused(client: RawClient, headers: dict[str, str]) -> Frame:
    receipt = client.request("SUBSCRIBE", headers)
    assert "status" in receipt.headers, receipt
    return receipt


def test_a_new_cursor_past_the_limit_is_refused_and_journals_nothing(
    make_broker: BrokerFactory, clients: ClientFactory, tmp_path: Path
) -> None:
    properties = {"imq.cursor.max_groups": "2", "imq.persist.file.directory": str(tmp_path)}
    broker = make_broker(properties)
    client = clients(broker.port, failed_receipts="true")
    read_cursor(client, T, "a")
    read_cursor(client, T, "b")
    send(client, T, 2)
    before = journal_changes(broker)
    headers = {"destination": T, "id": "r", "browser": "true", "cursor": "c"}
    receipt = subscribe_refused(client, headers)
    assert limited(receipt.headers) == ("414", "imq.cursor.max_groups", "2")
    assert receipt.headers["destination"] == T
    assert "UNSUBSCRIBE with the cursor header" in receipt.headers["detail"]
    client.sync()
    assert client.drain() == []  # no read began
    assert journal_changes(broker) == before
    assert cursor_groups(broker) == ["a", "b"]
    # The cursors in place read as before; deleting one makes room.
    messages, _ = read_cursor(client, T, "a")
    assert [m.body for m in messages] == [b"m0", b"m1"]
    client.request("UNSUBSCRIBE", {"id": "x", "destination": T, "cursor": "b"})
    read_cursor(client, T, "c")
    assert cursor_groups(broker) == ["a", "c"]
    broker.stop()
    restarted = make_broker(properties)
    assert cursor_groups(restarted) == ["a", "c"]


def test_a_lease_in_a_new_group_past_the_limit_is_refused_and_journals_nothing(
    make_broker: BrokerFactory, clients: ClientFactory, tmp_path: Path
) -> None:
    properties = {"imq.lease.max_groups": "1", "imq.persist.file.directory": str(tmp_path)}
    broker = make_broker(properties)
    client = clients(broker.port, failed_receipts="true")
    send(client, Q, 3)
    leased, _ = read_lease(client, Q, "g/1", lease_max_messages="1")
    before = journal_changes(broker)
    receipt = subscribe_refused(client, {"destination": Q, "id": "l", "lease": "h/1"})
    assert limited(receipt.headers) == ("414", "imq.lease.max_groups", "1")
    assert receipt.headers["destination"] == Q
    client.sync()
    assert client.drain() == []
    assert journal_changes(broker) == before
    # The group in use goes on; the queue's other messages still wait for it.
    messages, end = read_lease(client, Q, "g/2", lease_max_messages="1")
    assert [m.body for m in leased + messages] == [b"m0", b"m1"]
    assert end.headers["lease-state"] == "open"
    broker.stop()
    restarted = make_broker(properties)
    assert lease_groups(restarted) == 1
    waiting, _ = read(clients(restarted.port), Q, browser="true")
    assert [m.body for m in waiting] == [b"m2"]


def test_a_restart_keeps_cursors_and_lease_groups_beyond_a_lowered_limit(
    make_broker: BrokerFactory,
    clients: ClientFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    directory = {"imq.persist.file.directory": str(tmp_path)}
    broker = make_broker(directory)
    client = clients(broker.port)
    for group in ("a", "b", "c"):
        read_cursor(client, T, group)
        read_lease(client, Q, f"{group}/1")
    client.close()
    broker.stop()
    lowered = {**directory, "imq.cursor.max_groups": "1", "imq.lease.max_groups": "2"}
    with caplog.at_level(logging.WARNING, logger="sluiceway"):
        restarted = make_broker(lowered)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{T} has 3 cursors" in w and "imq.cursor.max_groups (1)" in w for w in warnings)
    assert any(f"{Q} has 3 lease groups" in w for w in warnings)
    assert (cursor_groups(restarted), lease_groups(restarted)) == (["a", "b", "c"], 3)
    client = clients(restarted.port, failed_receipts="true")
    read_cursor(client, T, "b")  # the existing ones are read as before
    read_lease(client, Q, "c/2")
    receipt = subscribe_refused(
        client, {"destination": T, "id": "r", "browser": "true", "cursor": "d"}
    )
    assert limited(receipt.headers) == ("414", "imq.cursor.max_groups", "1")
    receipt = subscribe_refused(client, {"destination": Q, "id": "l", "lease": "d/1"})
    assert limited(receipt.headers) == ("414", "imq.lease.max_groups", "2")
