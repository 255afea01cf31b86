"""The synchronous facade: the same names and semantics, for scripts and threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sluiceway.client.sync import AckMode, ConnectionFactory, Message
from sluiceway.testing import BrokerThread
from tests.e2e.support import WAIT, wait_until


def factory(broker: BrokerThread, **keywords: Any) -> ConnectionFactory:
    return ConnectionFactory(f"stomp://127.0.0.1:{broker.port}", **keywords)


def test_produce_and_consume(broker: BrokerThread) -> None:
    with factory(broker).connect() as connection:
        session = connection.session(AckMode.AUTO)
        producer = session.producer("/queue/sync")
        for i in range(5):
            producer.send(f"{i}", priority=4, time_to_live=60)
        consumer = session.consumer("/queue/sync")
        first = consumer.receive(timeout=5)
        assert first is not None
        assert first.text == "0"
        assert first.persistent
        rest = []
        for message in consumer:  # iteration ends when the consumer closes...
            rest.append(message.text)
            if len(rest) == 4:
                break
        assert rest == ["1", "2", "3", "4"]
        assert consumer.receive_no_wait() is None
        assert consumer.receive(timeout=0.05) is None


def test_client_acknowledge_from_listener_threads(broker: BrokerThread) -> None:
    with factory(broker).connect() as connection:
        session = connection.session(AckMode.CLIENT)
        producer = session.producer("/queue/listen")
        seen: list[str] = []
        threads: set[str] = set()
        lock = threading.Lock()
        done = threading.Event()
        first_two = threading.Barrier(2)  # passed only by two handlers working at once

        def handler(message: Message) -> None:
            with lock:
                seen.append(message.text)
                threads.add(threading.current_thread().name)
                if len(seen) == 20:
                    done.set()
                early = len(seen) <= 2
            if early:  # the first two wait for each other: they go on only if run side by side
                first_two.wait(WAIT)
            message.acknowledge()  # blocking, from the consumer's own thread

        consumer = session.consumer("/queue/listen")
        consumer.set_listener(handler, concurrency=3)
        for i in range(20):
            producer.send(f"{i}")
        assert done.wait(10)
        consumer.close()
        assert sorted(seen, key=int) == [str(i) for i in range(20)]
        assert len(threads) > 1  # the pool really ran handlers side by side
    with factory(broker).connect() as other:
        assert other.session().consumer("/queue/listen").receive(timeout=0.2) is None


def test_transactions_and_browsing(broker: BrokerThread) -> None:
    with factory(broker).connect() as connection:
        session = connection.session(transacted=True)
        producer = session.producer("/queue/sync-tx")
        producer.send("a")
        producer.send("b")
        browser = connection.session().browser("/queue/sync-tx")
        assert browser.messages() == []  # not committed yet
        session.commit()
        assert [m.text for m in browser.messages()] == ["a", "b"]
        producer.send("c")
        session.rollback()
        assert [m.text for m in browser] == ["a", "b"]


def test_closing_leaves_no_thread_behind(broker: BrokerThread) -> None:
    before = {t.ident for t in threading.enumerate()}
    for _ in range(3):
        connection = factory(broker).connect()
        session = connection.session()
        consumer = session.consumer("/queue/threads")
        consumer.set_listener(lambda message: None, concurrency=4)
        session.producer("/queue/threads").send("x")
        connection.close()
    leftover = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert leftover == []


def test_calling_the_blocking_api_from_its_own_loop_is_refused(broker: BrokerThread) -> None:
    connection = factory(broker).connect()
    try:
        producer = connection.session().producer("/queue/x")
        outcome: list[BaseException] = []

        def from_loop_thread() -> None:
            try:
                producer.send("deadlock?")
            except RuntimeError as exc:
                outcome.append(exc)

        connection._loop.loop.call_soon_threadsafe(from_loop_thread)
        wait_until(lambda: bool(outcome))
        assert "would deadlock" in str(outcome[0])
    finally:
        connection.close()


def test_connect_failure_is_clear_and_leaves_no_thread() -> None:
    before = threading.active_count()
    with pytest.raises(Exception, match="could not connect"):
        ConnectionFactory("stomp://127.0.0.1:9").connect()  # nothing listens on port 9
    assert threading.active_count() == before
