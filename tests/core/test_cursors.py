"""Topic cursors in the core: opening, reading from, committing and deleting them."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from sluiceway.core.broker import Broker
from sluiceway.core.features.cursors import CursorRead, CursorStart
from sluiceway.core.model.subscription import AckMode, Delivery
from sluiceway.core.model.topic import Topic
from sluiceway.errors import BadRequest, NotFound, ResourceFull
from sluiceway.naming import parse_destination
from tests.core.helpers import Client, bodies

MakeBroker = Callable[[Mapping[str, str]], Broker]
T = "/topic/t"
TOPIC = parse_destination(T)


def read(
    client: Client,
    group: str,
    *,
    start: CursorStart | int = CursorStart.LATEST,
    from_seq: int | None = None,
    to_seq: int | None = None,
    path: str = T,
) -> tuple[list[Delivery], dict[str, str]]:
    """Read through cursor `group` as a browser SUBSCRIBE with cursor headers does; return the
    messages and the end marker's headers."""
    number = len(client.connection.subscriptions) + 1
    client.connection.subscribe(
        f"read-{number}",
        parse_destination(path),
        AckMode.AUTO,
        requested_limit=1000,
        threshold=50,
        prefetch=True,
        browser=True,
        cursor=CursorRead(group, start, from_seq, to_seq),
    )
    taken = client.take()
    assert taken, "a read always ends with its end marker"
    end = dict(taken[-1].message.headers)
    assert end["browser"] == "end"
    return taken[:-1], end


def topic(broker: Broker) -> Topic:
    found = broker.registry.get(TOPIC)
    assert isinstance(found, Topic)
    return found


def publish(client: Client, count: int, *, first: int = 0) -> None:
    for i in range(first, first + count):
        client.send(T, b"%d" % i)


def test_a_new_cursor_starts_after_the_head_and_retains_what_follows(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    publish(producer, 3)  # before the cursor: a topic with no reader keeps nothing
    messages, end = read(reader, "g")
    assert messages == []
    assert end["cursor-sequence"] == "4"  # latest: head-sequence + 1
    assert (end["head-sequence"], end["first-sequence"], end["message-count"]) == ("3", "4", "0")
    publish(producer, 3, first=3)
    messages, end = read(reader, "g")
    assert bodies(messages) == [b"3", b"4", b"5"]
    assert [m.message.seq for m in messages] == [4, 5, 6]
    assert (end["next-sequence"], end["cursor-sequence"]) == ("7", "4")  # reading moves nothing
    assert (end["first-sequence"], end["message-count"]) == ("4", "3")
    assert bodies(read(reader, "g")[0]) == [b"3", b"4", b"5"]  # the same again


def test_cursor_start_earliest_takes_the_oldest_retained_message(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    read(reader, "first")
    publish(producer, 4)
    _, end = read(reader, "second", start=CursorStart.EARLIEST)
    assert end["cursor-sequence"] == "1"  # what cursor "first" makes the topic keep
    _, end = read(reader, "third", start=3)
    assert end["cursor-sequence"] == "3"
    _, end = read(reader, "third", start=CursorStart.EARLIEST)  # exists: the start is ignored
    assert end["cursor-sequence"] == "3"


def test_earliest_on_a_topic_that_retains_nothing_is_the_latest(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    publish(producer, 2)
    _, end = read(reader, "g", start=CursorStart.EARLIEST)
    assert end["cursor-sequence"] == "3"


def test_a_range_read_returns_from_to(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    read(reader, "g")
    publish(producer, 10)
    messages, end = read(reader, "g", from_seq=3, to_seq=6)
    assert [m.message.seq for m in messages] == [3, 4, 5]
    assert end["next-sequence"] == "6"
    messages, end = read(reader, "g", from_seq=6, to_seq=6)  # asks for the head only
    assert messages == []
    assert (end["next-sequence"], end["head-sequence"]) == ("6", "10")


def test_commit_moves_forward_only_and_releases_what_is_behind(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    read(reader, "g")
    publish(producer, 5)
    assert len(topic(broker).log) == 5
    assert broker.cursors.commit(TOPIC, "g", 4).position == 4
    assert len(topic(broker).log) == 2  # sequence numbers 4 and 5 stay
    assert broker.cursors.commit(TOPIC, "g", 2).position == 4  # never back
    messages, end = read(reader, "g")
    assert [m.message.seq for m in messages] == [4, 5]
    messages, end = read(reader, "g", from_seq=1)
    # Asking for what is gone shows it: first-sequence is above from-sequence.
    assert [m.message.seq for m in messages] == [4, 5]
    assert end["first-sequence"] == "4"


def test_the_lowest_cursor_and_durable_subscriptions_decide_what_is_kept(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    read(reader, "slow")
    read(reader, "fast")
    publish(producer, 6)
    broker.cursors.commit(TOPIC, "fast", 7)
    assert len(topic(broker).log) == 6  # "slow" still needs every one
    broker.cursors.commit(TOPIC, "slow", 3)
    assert [m.seq for m in topic(broker).log.read(0, 100)] == [3, 4, 5, 6]
    broker.cursors.delete(TOPIC, "slow")
    assert len(topic(broker).log) == 0  # "fast" is past them all


def test_committing_or_deleting_an_unknown_cursor_is_404(broker: Broker) -> None:
    reader = Client(broker)
    with pytest.raises(NotFound) as unknown:
        broker.cursors.commit(TOPIC, "nobody", 1)
    assert unknown.value.status == 404
    assert "cursor:nobody" in str(unknown.value)
    read(reader, "g")
    broker.cursors.delete(TOPIC, "g")
    with pytest.raises(NotFound):
        broker.cursors.delete(TOPIC, "g")


def test_a_cursor_on_a_queue_is_refused(broker: Broker) -> None:
    with pytest.raises(BadRequest, match="queue"):
        read(Client(broker), "g", path="/queue/q")


def test_retained_messages_count_against_the_topic_limits(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.destination.topic.t.maxNumMsgs": "3"})
    producer, reader = Client(broker), Client(broker)
    read(reader, "g")
    publish(producer, 3)
    with pytest.raises(ResourceFull) as refused:
        producer.send(T, b"one too many", persistent=True)
    assert refused.value.limit == "maxNumMsgs"
    broker.cursors.commit(TOPIC, "g", 2)  # the first is released: room for one more
    producer.send(T, b"fits", persistent=True)
    assert bodies(read(reader, "g")[0]) == [b"1", b"2", b"fits"]


def test_destroying_the_topic_deletes_its_cursors(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    read(reader, "g")
    publish(producer, 2)
    for sub_id in list(reader.connection.subscriptions):
        reader.connection.unsubscribe(sub_id)
    broker.destroy_destination(TOPIC)
    assert len(broker.cursors) == 0
    with pytest.raises(NotFound):
        broker.cursors.commit(TOPIC, "g", 3)
