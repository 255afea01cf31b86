"""Listing destinations over the wire (docs/pipelines-protocol.md, "Listing destinations").

Patterns matched name by name; then real brokers on port 0: stomp.py sends the listing
SUBSCRIBE as any STOMP client would, the pipeline client lists, truncates and is refused, and a
broker with access control lists only what each user may consume or browse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.client.pipeline_listing import ListRight
from sluiceway.errors import BadRequest
from sluiceway.naming import DestinationKind, DestinationName, parse_destination, parse_pattern
from sluiceway.security.users import UserFile
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.stomppy import connect, end, with_receipt

DESTINATIONS: Final = (
    "/queue/orders.eu",
    "/queue/orders.us",
    "/queue/orders.eu.returns",
    "/queue/orders",
    "/queue/stock",
    "/topic/orders.eu",
)


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("/queue/orders.*", "/queue/orders.eu", True),
        ("/queue/orders.*", "/queue/orders.eu.returns", False),
        ("/queue/orders.*", "/queue/orders", False),
        ("/queue/orders.>", "/queue/orders.eu.returns", True),
        ("/queue/orders.>", "/queue/orders", False),
        ("/queue/*.eu", "/queue/orders.eu", True),
        ("/queue/*.eu", "/topic/orders.eu", False),
        ("/queue/orders", "/queue/orders", True),
        ("/queue/orders", "/queue/orders.eu", False),
        ("/queue/>", "/queue/mq.sys.dmq", False),  # the broker's own: named, never matched
        ("/queue/mq.>", "/queue/mq.sys.dmq", True),
    ],
)
def test_a_pattern_matches_whole_segments(pattern: str, name: str, matches: bool) -> None:
    assert parse_pattern(pattern).matches(parse_destination(name)) is matches


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("/queue/orders.#", "'#' is reserved"),
        ("/queue/orders*", "a whole segment between dots"),
        ("/queue/>.eu", "last only"),
        ("/queue/orders .*", "may contain only letters"),
        ("orders.*", "unknown prefix"),
    ],
)
def test_a_bad_pattern_says_what_is_wrong(pattern: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_pattern(pattern)
    assert parse_pattern("/topic/a.*.c").kind is DestinationKind.TOPIC
    assert not parse_pattern("/topic/a").matches(DestinationName(DestinationKind.QUEUE, "a"))


def create(port: int, *paths: str) -> None:
    with PipelineConnection(PipelineSettings(port=port, timeout=10.0)) as connection:
        for path in paths:
            connection.send(OutgoingMessage(path, b"x"))


def test_stomppy_lists_with_a_browser_subscribe_answered_by_one_message(
    broker: BrokerThread,
) -> None:
    create(broker.port, *DESTINATIONS)
    connection, recorder = connect(broker.port)
    try:

        def listing(receipt: str) -> None:
            headers = {"browser": "true", "list": "consume", "receipt": receipt}
            connection.subscribe("/queue/orders.>", id="l1", headers=headers)

        with_receipt(recorder, listing)
        (answer,) = recorder.wait_messages(1)
        assert answer.headers["subscription"] == "l1"
        assert answer.headers["destination"] == "/queue/orders.>"
        assert answer.headers["browser"] == "end"
        assert (answer.headers["list-count"], answer.headers["list-truncated"]) == ("3", "false")
        assert answer.body.splitlines() == [
            "/queue/orders.eu",
            "/queue/orders.eu.returns",
            "/queue/orders.us",
        ]
        # No subscription was made: a message sent now is not delivered on l1.
        create(broker.port, "/queue/orders.eu")
        with_receipt(recorder, lambda r: connection.send("/queue/stock", "y", receipt=r))
        assert len(recorder.messages) == 1
        assert recorder.errors == []
    finally:
        connection.disconnect()


def test_the_pipeline_client_lists_within_a_bound_and_keeps_its_connection_when_refused(
    broker: BrokerThread,
) -> None:
    create(broker.port, *DESTINATIONS)
    with PipelineConnection(PipelineSettings(port=broker.port, timeout=10.0)) as connection:
        everything = connection.list_destinations("/queue/>")
        assert everything.paths == (
            "/queue/orders",
            "/queue/orders.eu",
            "/queue/orders.eu.returns",
            "/queue/orders.us",
            "/queue/stock",
        )
        assert not everything.truncated
        first = connection.list_destinations("/queue/>", right=ListRight.BROWSE, limit=2)
        assert (first.paths, first.truncated) == (everything.paths[:2], True)
        assert connection.list_destinations("/topic/*.eu").paths == ("/topic/orders.eu",)
        assert connection.list_destinations("/queue/orders").paths == ("/queue/orders",)
        assert connection.list_destinations("/queue/none.*").paths == ()
        with pytest.raises(BadRequest, match="a whole segment between dots"):
            connection.list_destinations("/queue/orders*")
        # Refused with a failed receipt: the same connection goes on.
        assert connection.list_destinations("/queue/stock").paths == ("/queue/stock",)
        with pytest.raises(ValueError, match="1 to 10000"):
            connection.list_destinations("/queue/>", limit=10_001)


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"list": "produce", "browser": "true"}, "must be consume or browse"),
        ({"list": "consume"}, "add browser:true"),
        ({"list": "consume", "browser": "true", "lease": "g/1"}, "cannot carry the lease header"),
        ({"list": "consume", "browser": "true", "list-max": "0"}, "from 1 to 10000"),
    ],
)
def test_a_malformed_listing_is_refused_naming_the_header(
    broker: BrokerThread, headers: dict[str, str], says: str
) -> None:
    connection, recorder = connect(broker.port)
    try:
        connection.subscribe("/queue/>", id="l1", headers={**headers, "receipt": "r1"})
        recorder.wait_for(lambda: bool(recorder.errors))
        (error,) = recorder.errors
        assert error.headers["status"] == "400"
        assert says in error.body
        assert recorder.messages == []
    finally:
        end(connection, recorder)


ACCESS_RULES: Final = """\
version=JMQFileAccessControlModel/100
connection.NORMAL.allow.user=*
queue.orders.eu.consume.allow.user=etl
queue.orders.us.browse.allow.user=etl
queue.*.produce.allow.user=feeder
queue.create.allow.user=feeder
topic.create.allow.user=feeder
topic.*.produce.allow.user=feeder
"""
PASSWORDS: Final = {"etl": "etl-pw-L1st", "feeder": "feeder-pw-L1st", "nobody": "nobody-pw-L1st"}


@pytest.fixture
def secured(make_broker: BrokerFactory, tmp_path: Path) -> BrokerThread:
    users = UserFile(tmp_path / "passwd")
    for user, password in PASSWORDS.items():
        users.add(user, password, ())
    (tmp_path / "access.properties").write_text(ACCESS_RULES)
    return make_broker(
        {
            "imq.authentication.enabled": "true",
            "imq.user_repository.file.filename": str(tmp_path / "passwd"),
            "imq.accesscontrol.enabled": "true",
            "imq.accesscontrol.file.filename": str(tmp_path / "access.properties"),
        }
    )


def as_user(broker: BrokerThread, user: str) -> PipelineConnection:
    settings = PipelineSettings(
        port=broker.port, username=user, password=PASSWORDS[user], timeout=10.0
    )
    return PipelineConnection(settings)


def test_a_listing_names_only_what_the_user_may_read_and_refuses_nothing(
    secured: BrokerThread,
) -> None:
    with as_user(secured, "feeder") as feeder:
        for path in DESTINATIONS:
            feeder.send(OutgoingMessage(path, b"x"))
        # The feeder may only produce: every name is left out, without a refusal.
        assert feeder.list_destinations("/queue/>").paths == ()
    with as_user(secured, "etl") as etl:
        assert etl.list_destinations("/queue/orders.*").paths == ("/queue/orders.eu",)
        browsed = etl.list_destinations("/queue/orders.*", right=ListRight.BROWSE)
        assert browsed.paths == ("/queue/orders.us",)
        assert etl.list_destinations("/topic/>").paths == ()
    with as_user(secured, "nobody") as nobody:
        assert nobody.list_destinations("/queue/orders.eu").paths == ()
