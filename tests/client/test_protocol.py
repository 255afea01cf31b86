"""The client protocol without sockets: frames in, headers, answers and exceptions out."""

from __future__ import annotations

import itertools

import pytest

from sluiceway.client.protocol import (
    ConnectRequest,
    Receipts,
    connected_version,
    heartbeat_intervals,
    is_end_marker,
    refusal,
)
from sluiceway.errors import (
    BadRequest,
    BrokerError,
    ClientError,
    ConnectionClosedError,
    EntityTooLarge,
    Forbidden,
    InternalError,
    RemoteProtocolError,
    ResourceFull,
    Unauthorized,
)
from sluiceway.protocol.frames import Frame, StompVersion


def test_connect_headers_carry_credentials_heartbeats_and_extensions_in_order() -> None:
    request = ConnectRequest(
        "broker.example",
        "etl",
        "s3cret",
        "client-7",
        heartbeat_ms=30_000,
        extensions={"connection-flow-count": "100"},
    )
    assert list(request.headers().items()) == [
        ("accept-version", "1.2"),
        ("host", "broker.example"),
        ("heart-beat", "30000,30000"),
        ("connection-flow-count", "100"),
        ("failed-receipts", "true"),
        ("login", "etl"),
        ("passcode", "s3cret"),
        ("client-id", "client-7"),
    ]
    assert "s3cret" not in repr(request)


def test_connect_headers_leave_out_what_is_not_set() -> None:
    assert ConnectRequest("h").headers() == {
        "accept-version": "1.2",
        "host": "h",
        "heart-beat": "0,0",
        "failed-receipts": "true",
    }


def test_a_refused_connect_names_the_broker_and_the_user_never_the_password() -> None:
    error = refusal(Frame("ERROR", {"status": "401", "message": "wrong credentials"}))
    refused = ConnectRequest("broker.example", "etl", "s3cret").refused(error, 61613)
    assert isinstance(refused, Unauthorized)
    assert "broker.example:61613" in str(refused)
    assert "user 'etl'" in str(refused)
    assert "s3cret" not in str(refused)
    anonymous = ConnectRequest("h").refused(error, 1)
    assert "without a user name" in str(anonymous)


def test_connected_gives_the_version_and_anything_else_raises() -> None:
    assert connected_version(Frame("CONNECTED", {"version": "1.1"})) is StompVersion.V1_1
    assert connected_version(Frame("CONNECTED")) is StompVersion.V1_2
    with pytest.raises(Forbidden):
        connected_version(Frame("ERROR", {"status": "403", "message": "not allowed"}))
    with pytest.raises(RemoteProtocolError, match="expected CONNECTED, got MESSAGE"):
        connected_version(Frame("MESSAGE"))


@pytest.mark.parametrize(
    ("offered", "server", "expected"),
    [
        (10_000, "5000,20000", (20.0, 10.0)),  # each way the larger of the two
        (10_000, "0,0", (0.0, 0.0)),  # the broker does not heart-beat
        (0, "5000,5000", (0.0, 0.0)),  # the client offered none
        (10_000, None, (0.0, 0.0)),  # no header
        (10_000, "garbage", (0.0, 0.0)),
    ],
)
def test_heartbeat_intervals(
    offered: int, server: str | None, expected: tuple[float, float]
) -> None:
    headers = {} if server is None else {"heart-beat": server}
    assert heartbeat_intervals(offered, Frame("CONNECTED", headers)) == expected


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        ("400", BadRequest),
        ("401", Unauthorized),
        ("403", Forbidden),
        ("414", ResourceFull),
        ("423", EntityTooLarge),
        ("599", InternalError),  # unknown codes
        ("many", InternalError),  # not a number
    ],
)
def test_one_mapping_from_status_to_exception(status: str, cls: type[BrokerError]) -> None:
    error = refusal(
        Frame(
            "RECEIPT",
            {
                "status": status,
                "message": "full",
                "destination": "/queue/q",
                "limit": "maxNumMsgs",
                "limit-value": "10",
            },
        )
    )
    assert type(error) is cls
    assert (error.destination, error.limit, error.limit_value) == ("/queue/q", "maxNumMsgs", "10")


def test_an_error_without_detail_explains_itself_in_its_body() -> None:
    error = refusal(Frame("ERROR", {"message": "bad frame"}, b"the reason\n"))
    assert isinstance(error, InternalError)
    assert "the reason" in str(error)


def test_receipts_match_answers_to_what_asked_for_them() -> None:
    book: Receipts[str] = Receipts()
    first = book.ask(Frame("SEND", {"destination": "/queue/a"}, b"x"), "first", "s")
    second = book.ask(Frame("COMMIT", {"transaction": "t"}), "second")
    assert first.headers == {"destination": "/queue/a", "receipt": "s1"}
    assert first.body == b"x"
    assert second.headers["receipt"] == "c2"
    assert len(book) == 2
    assert book.answer(Frame("MESSAGE", {"receipt-id": "s1"})) is None
    assert book.answer(Frame("RECEIPT", {"receipt-id": "unknown"})) is None
    refused = book.answer(Frame("RECEIPT", {"receipt-id": "c2", "status": "414"}))
    assert refused is not None
    assert refused.waiter == "second"
    assert isinstance(refused.error, ResourceFull)
    taken = book.answer(Frame("RECEIPT", {"receipt-id": "s1"}))
    assert taken is not None
    assert (taken.waiter, taken.error) == ("first", None)
    assert len(book) == 0
    assert book.answer(Frame("RECEIPT", {"receipt-id": "s1"})) is None  # answered once


def test_an_error_naming_a_receipt_answers_it_with_the_refusal() -> None:
    book: Receipts[None] = Receipts()
    book.ask(Frame("SUBSCRIBE"), None)
    answer = book.answer(Frame("ERROR", {"receipt-id": "c1", "status": "403"}))
    assert answer is not None
    assert answer.waiter is None
    assert isinstance(answer.error, Forbidden)


def test_books_sharing_numbers_never_reuse_a_receipt_id() -> None:
    numbers = itertools.count(1)
    requests: Receipts[None] = Receipts(numbers)
    sends: Receipts[int] = Receipts(numbers)
    ids = {
        requests.ask(Frame("ACK"), None, "r").headers["receipt"],
        sends.ask(Frame("SEND"), 1, "r").headers["receipt"],
        requests.ask(Frame("ACK"), None, "r").headers["receipt"],
    }
    assert ids == {"r1", "r2", "r3"}


def test_given_up_and_drained_requests_are_answered_no_more() -> None:
    book: Receipts[str] = Receipts()
    given_up = book.ask(Frame("COMMIT"), "timed out")
    book.ask(Frame("SEND"), "a")
    book.ask(Frame("SEND"), "b")
    book.forget(given_up)
    assert book.answer(Frame("RECEIPT", {"receipt-id": "c1"})) is None
    assert book.drain() == ["a", "b"]
    assert len(book) == 0


def test_end_markers() -> None:
    assert is_end_marker({"browser": "end", "next-sequence": "5"})
    assert not is_end_marker({"browser": "true"})
    assert not is_end_marker({})


def test_a_closed_connection_is_a_connection_error_and_a_client_error() -> None:
    error = ConnectionClosedError("the connection is closed")
    assert isinstance(error, ConnectionError)
    assert isinstance(error, ClientError)
    assert str(error) == "the connection is closed"
    with pytest.raises(ConnectionError):
        raise error
