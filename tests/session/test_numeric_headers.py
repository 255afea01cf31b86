"""Every numeric header the broker reads, out of the range it can store or use: refused with
status 400 naming the header and the range, and nothing changed.

Each case is a frame fed to a session, once from a client that asked for failed receipts (a
RECEIPT with the status; the session goes on) and once from one that did not (an ERROR; the
session closes). CONNECT has no receipt: it gets the ERROR.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.naming import parse_destination
from sluiceway.session.session import SessionState
from sluiceway.testing import FakeClock
from tests.session.peer import Peer

I64 = "9223372036854775807"  # 2^63-1: sequence numbers, expiries, lease sizes and times
ABOVE_I64 = "9223372036854775808"
I32 = "2147483647"  # 2^31-1: flow limits and counts (Open MQ's Java ints), heart-beats
ABOVE_I32 = "2147483648"
QUEUE = {"destination": "/queue/q"}
SUBSCRIBE = {"destination": "/queue/q", "id": "s"}
BROWSE_TOPIC = {"destination": "/topic/t", "id": "s", "browser": "true", "cursor": "g"}


@dataclass(frozen=True)
class Case:
    command: str
    headers: dict[str, str]
    named: str  # the header the refusal names (in its summary)
    range: str  # the range it states


CASES: dict[str, Case] = {
    "SEND expires of the issue": Case(
        "SEND",
        {**QUEUE, "persistent": "true", "expires": "99999999999999999999"},
        "expires",
        f"0 to {I64}",
    ),
    "SEND expires 2^63": Case("SEND", {**QUEUE, "expires": ABOVE_I64}, "expires", f"0 to {I64}"),
    "SEND expires -1": Case("SEND", {**QUEUE, "expires": "-1"}, "expires", f"0 to {I64}"),
    "SEND expires with a plus sign": Case("SEND", {**QUEUE, "expires": "+5"}, "expires", "0 to"),
    "SEND expires with an underscore": Case(
        "SEND", {**QUEUE, "expires": "1_000"}, "expires", "0 to"
    ),
    "SEND expires in another script": Case(
        "SEND", {**QUEUE, "expires": "\u0665"}, "expires", "0 to"
    ),
    "SEND priority 256": Case("SEND", {**QUEUE, "priority": "256"}, "priority", "0 to 9"),
    "SEND stage-ttl 2^63": Case(
        "SEND",
        {**QUEUE, "stage": "sink/1/task", "stage-ttl": ABOVE_I64},
        "stage-ttl",
        f"1 to {I64}",
    ),
    "SEND stage batch 2^63": Case(
        "SEND", {**QUEUE, "stage": f"sink/{ABOVE_I64}/task"}, "stage", "2^63-1"
    ),
    "SUBSCRIBE consumer-flow-limit 2^31": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "consumer-flow-limit": ABOVE_I32},
        "consumer-flow-limit",
        f"-1 to {I32}",
    ),
    "SUBSCRIBE consumer-flow-limit -2": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "consumer-flow-limit": "-2"},
        "consumer-flow-limit",
        f"-1 to {I32}",
    ),
    "SUBSCRIBE activemq.prefetchSize 2^31": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "activemq.prefetchSize": ABOVE_I32},
        "activemq.prefetchSize",
        f"-1 to {I32}",
    ),
    "SUBSCRIBE prefetch-count of the issue": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "prefetch-count": "99999999999999999999"},
        "prefetch-count",
        f"-1 to {I32}",
    ),
    "SUBSCRIBE consumer-flow-threshold 101": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "consumer-flow-threshold": "101"},
        "consumer-flow-threshold",
        "0 to 100",
    ),
    "SUBSCRIBE from-sequence 2^63": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "browser": "true", "from-sequence": ABOVE_I64},
        "from-sequence",
        f"0 to {I64}",
    ),
    "SUBSCRIBE to-sequence -1": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "browser": "true", "to-sequence": "-1"},
        "to-sequence",
        f"0 to {I64}",
    ),
    "SUBSCRIBE cursor-start 2^63": Case(
        "SUBSCRIBE", {**BROWSE_TOPIC, "cursor-start": ABOVE_I64}, "cursor-start", f"0 to {I64}"
    ),
    "SUBSCRIBE cursor from-sequence 2^63": Case(
        "SUBSCRIBE",
        {**BROWSE_TOPIC, "from-sequence": ABOVE_I64},
        "from-sequence",
        f"0 to {I64}",
    ),
    "SUBSCRIBE lease number 2^63": Case(
        "SUBSCRIBE", {**SUBSCRIBE, "lease": f"g/{ABOVE_I64}"}, "lease", f"0 to {I64}"
    ),
    "SUBSCRIBE lease-max-messages 2^63": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "lease": "g/1", "lease-max-messages": ABOVE_I64},
        "lease-max-messages",
        f"1 to {I64}",
    ),
    "SUBSCRIBE lease-max-bytes 0": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "lease": "g/1", "lease-max-bytes": "0"},
        "lease-max-bytes",
        f"1 to {I64}",
    ),
    "SUBSCRIBE lease-ttl 2^63": Case(
        "SUBSCRIBE",
        {**SUBSCRIBE, "lease": "g/1", "lease-ttl": ABOVE_I64},
        "lease-ttl",
        f"1 to {I64}",
    ),
    "ACK cursor sequence 2^63": Case(
        "ACK",
        {"destination": "/topic/t", "cursor": "g", "sequence": ABOVE_I64},
        "sequence",
        f"0 to {I64}",
    ),
    "ACK lease number 2^63": Case(
        "ACK", {**QUEUE, "lease": f"g/{ABOVE_I64}"}, "lease", f"0 to {I64}"
    ),
    "COMMIT stage batch 2^63": Case(
        "COMMIT",
        {"transaction": "stage", "stage": f"sink/{ABOVE_I64}", "stage-tasks": ""},
        "stage",
        "2^63-1",
    ),
}

CONNECT_CASES: dict[str, Case] = {
    "heart-beat 2^31": Case(
        "CONNECT", {"heart-beat": f"0,{ABOVE_I32}"}, "heart-beat", f"0 to {I32}"
    ),
    "heart-beat with a plus sign": Case("CONNECT", {"heart-beat": "+1,0"}, "heart-beat", "0 to"),
    "connection-flow-count 2^31": Case(
        "CONNECT", {"connection-flow-count": ABOVE_I32}, "connection-flow-count", f"0 to {I32}"
    ),
    "connection-flow-count -1": Case(
        "CONNECT", {"connection-flow-count": "-1"}, "connection-flow-count", f"0 to {I32}"
    ),
    "connection-flow-limit 0": Case(
        "CONNECT", {"connection-flow-limit": "0"}, "connection-flow-limit", f"1 to {I32}"
    ),
    "connection-flow-limit of the issue": Case(
        "CONNECT",
        {"connection-flow-limit": "99999999999999999999"},
        "connection-flow-limit",
        f"1 to {I32}",
    ),
}


@pytest.fixture
def broker() -> Broker:
    return Broker(BrokerConfig(), clock=FakeClock())


def nothing_changed(broker: Broker, peer: Peer) -> None:
    """The refused frame made no destination, message, subscription, cursor or lease."""
    assert broker.registry.get(parse_destination("/queue/q")) is None
    assert broker.registry.get(parse_destination("/topic/t")) is None
    assert broker.context.system.count == 0
    assert len(broker.stages) == 0
    core = peer.session.core
    assert core is None or core.subscriptions == {}


def check_refusal(status: str, message: str, detail: str, case: Case) -> None:
    assert status == "400"
    assert case.named in message
    assert case.named in detail
    assert case.range in detail


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_out_of_range_gets_a_failed_receipt_and_the_session_goes_on(
    broker: Broker, case: Case
) -> None:
    peer = Peer(broker, failed_receipts="true")
    peer.feed(case.command, {**case.headers, "receipt": "bad"})
    (receipt,) = peer.control()
    assert receipt.command == "RECEIPT"
    assert receipt.headers["receipt-id"] == "bad"
    headers = receipt.headers
    check_refusal(headers["status"], headers["message"], headers["detail"], case)
    nothing_changed(broker, peer)
    assert peer.session.state is SessionState.CONNECTED
    peer.feed("SUBSCRIBE", {**SUBSCRIBE, "id": "after", "receipt": "ok"})
    (ok,) = peer.control()
    assert ok.command == "RECEIPT"
    assert "status" not in ok.headers


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_out_of_range_gets_an_error_that_closes_the_session(broker: Broker, case: Case) -> None:
    peer = Peer(broker)
    peer.feed(case.command, {**case.headers, "receipt": "bad"})
    (error,) = peer.control()
    assert error.command == "ERROR"
    assert error.headers["receipt-id"] == "bad"
    check_refusal(error.headers["status"], error.headers["message"], error.body.decode(), case)
    assert peer.session.closing
    nothing_changed(broker, peer)


@pytest.mark.parametrize("case", list(CONNECT_CASES.values()), ids=list(CONNECT_CASES))
def test_an_out_of_range_connect_gets_an_error_and_no_connection(
    broker: Broker, case: Case
) -> None:
    peer = Peer(broker, version="")
    peer.feed("CONNECT", {"accept-version": "1.2", **case.headers})
    (error,) = peer.control()
    assert error.command == "ERROR"
    check_refusal(error.headers["status"], error.headers["message"], error.body.decode(), case)
    assert peer.session.closing
    assert peer.session.core is None
    assert broker.connections == {}


def test_the_largest_values_in_range_are_taken(broker: Broker) -> None:
    peer = Peer(
        broker,
        heart_beat=f"{I32},{I32}",
        connection_flow_count=I32,
        connection_flow_limit=I32,
    )
    peer.feed("SUBSCRIBE", {**SUBSCRIBE, "consumer-flow-limit": I32, "receipt": "sub"})
    (receipt,) = peer.control()
    assert receipt.headers["consumer-flow-limit"] == "1000"  # the queue's consumerFlowLimit
    peer.feed("SEND", {**QUEUE, "persistent": "true", "priority": "9", "expires": I64}, b"m")
    (message,) = peer.payload()
    assert (message.headers["expires"], message.headers["priority"]) == (I64, "9")
