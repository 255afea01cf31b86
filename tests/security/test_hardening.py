"""What a careless or hostile client meets, one row per case (docs/security.md).

Each row's probe starts a real broker through its Trial (authentication on, the users of USERS,
the rules of RULES or the row's own, the row's properties, and any the probe adds, such as the
files it made in `trial.directory`), does what the row names over real sockets, and returns what
it saw; the row says what that must be. A probe may expect the start itself to fail. What a
probe returns is what a client or an operator can observe (a status, a message, whether the
socket closed, a count), not the broker's internals.

The rows are grouped by what they harden; each group is a list below, and CASES joins them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from tests.admin.adminhttp import AdminHttp
from tests.e2e.rawclient import RawClient
from tests.e2e.support import wait_until
from tests.security.conftest import USERS, Secured, SecuredFactory
from tests.server.rawws import RawWebSocket


@dataclass(frozen=True)
class Case:
    """One row: the broker's properties, what is tried against it, and what must be seen."""

    id: str
    probe: Callable[[Trial], object]
    expected: object
    properties: dict[str, str] = field(default_factory=dict)
    rules: str | None = None  # the access rules file; None: the suite's RULES


@dataclass
class Trial:
    """What a probe starts its broker with."""

    case: Case
    factory: SecuredFactory
    directory: Path  # the test's own directory, for files the probe makes

    def start(self, **properties: str) -> Secured:
        """The row's broker, with `properties` added to the row's."""
        values = {**self.case.properties, **properties}
        if self.case.rules is None:
            return self.factory(**values)
        return self.factory(self.case.rules, **values)


# -- the input budget: partly received frames, frames before CONNECT ------------------------

KIB = 1024
SCRATCH_SEND = b"SEND\ndestination:/queue/scratch\n"  # any user may produce to /queue/scratch


def refused_while_sending(client: RawClient, data: bytes) -> tuple[str, str, str]:
    """Send all of `data` (the broker refuses it part way, and reads and drops the rest), then
    read the ERROR and the close: the ERROR's status, limit and message."""
    client.send_bytes(data)
    error = client.expect("ERROR")
    client.expect_closed()
    return error.headers["status"], error.headers.get("limit", ""), error.headers["message"]


def input_gauge(secured: Secured) -> int:
    """sluiceway_input_buffered_bytes, as an operator scrapes it."""
    admin = AdminHttp(secured.broker.admin_port, "root", USERS["root"][0])
    status, body, _ = admin.raw("GET", "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith("sluiceway_input_buffered_bytes "):
            return int(float(line.split()[1]))
    raise AssertionError("no sluiceway_input_buffered_bytes in /metrics")


def gauge_reads(secured: Secured, expected: int) -> bool:
    return input_gauge(secured) == expected


def probe_connect_body(trial: Trial) -> tuple[str, str, str]:
    """A CONNECT announcing a 57 MB body, of which 256 KiB are sent."""
    client = trial.start().raw(connect=False)
    head = b"CONNECT\naccept-version:1.2\nlogin:alice\ncontent-length:57000000\n\n"
    return refused_while_sending(client, head + b"x" * (256 * KIB))


def probe_stalled_before_connect(trial: Trial) -> tuple[bool, list[str], int]:
    """Four connections stall inside CONNECT frames just under the first frame's limit, then
    go on: what the gauge shows while they stall (within the budget?), what each reads, and the
    gauge once they are gone."""
    secured = trial.start()
    clients = [secured.raw(connect=False) for _ in range(4)]
    head = b"CONNECT\naccept-version:1.2\n\n"  # a body up to a NUL that does not come yet
    for client in clients:
        client.send_bytes(head + b"x" * (6 * KIB))
    stalled = len(clients) * (len(head) + 6 * KIB)
    wait_until(lambda: input_gauge(secured) == stalled)
    within = stalled <= len(clients) * 8 * KIB
    statuses = [refused_while_sending(c, b"x" * (64 * KIB))[0] for c in clients]
    wait_until(lambda: input_gauge(secured) == 0)
    return within, statuses, input_gauge(secured)


def probe_send_past_connection_budget(trial: Trial) -> tuple[str, str, str]:
    """An authenticated SEND whose body (up to a NUL, no content-length) goes on past 256 KiB:
    512 KiB are sent."""
    client = trial.start().raw("alice")
    return refused_while_sending(client, SCRATCH_SEND + b"\n" + b"x" * (512 * KIB))


def probe_total_shared(trial: Trial) -> tuple[list[str], tuple[str, str, str], int]:
    """Three writers each stall 400 KiB into a 500 KiB SEND (1 MiB in all allowed): the first
    two finish their SENDs; the third, which takes the broker past, is refused."""
    secured = trial.start()
    clients = [secured.raw(user) for user in ("alice", "carol", "mallory")]
    head = SCRATCH_SEND + b"receipt:done\ncontent-length:%d\n\n" % (500 * KIB)
    for count, client in enumerate(clients[:2], start=1):
        client.send_bytes(head + b"x" * (400 * KIB))
        held = count * (len(head) + 400 * KIB)
        wait_until(partial(gauge_reads, secured, held))
    refused = refused_while_sending(clients[2], head + b"x" * (400 * KIB))
    receipts = []
    for client in clients[:2]:
        client.send_bytes(b"x" * (100 * KIB) + b"\0")
        receipts.append(client.expect("RECEIPT").headers["receipt-id"])
    return receipts, refused, input_gauge(secured)


def probe_oversized_header(trial: Trial) -> tuple[str, str, str]:
    """A header line of 4 MiB, written whole while the broker refuses it after 8 KiB."""
    client = trial.start().raw("alice")
    return refused_while_sending(client, SCRATCH_SEND + b"long:" + b"v" * (4096 * KIB))


def probe_websocket_before_connect(trial: Trial) -> tuple[str, str, int]:
    """Over WebSocket: a message announcing 10 MiB before CONNECT, 64 KiB of it sent."""
    secured = trial.start()
    assert secured.broker.services is not None
    ws = RawWebSocket(secured.broker.services.addresses()["ws"][1])
    try:
        ws.send_header(10 * 1024 * KIB)
        ws.send_payload(b"CONNECT\nlogin:alice\n\n" + b"x" * (64 * KIB))
        error = ws.expect_stomp("ERROR")
        return error.headers["status"], error.headers["limit"], ws.expect_close()
    finally:
        ws.close()


def probe_past_connection_count(trial: Trial) -> tuple[tuple[str, str, str], bool]:
    """Two connections open (the limit, or the limit from 127.0.0.1), then a third: what it
    reads; and whether the first two still work."""
    secured = trial.start()
    first, second = secured.raw("alice"), secured.raw("bob")
    refused = refused_while_sending(secured.raw(connect=False), b"")
    for client in (first, second):
        client.request("BEGIN", {"transaction": "still-here"})
    return refused, True


INPUT_CASES: list[Case] = [
    Case(
        "connect-body-past-the-first-frame-limit",
        probe_connect_body,
        (
            "423",
            "imq.stomp.connect.max_frame_size",
            "frame too large before CONNECT (imq.stomp.connect.max_frame_size)",
        ),
    ),
    Case(
        "unauthenticated-stalls-stay-within-the-budget",
        probe_stalled_before_connect,
        (True, ["423"] * 4, 0),
    ),
    Case(
        "partly-sent-send-past-the-connection-budget",
        probe_send_past_connection_budget,
        (
            "423",
            "imq.stomp.input.max_bytes",
            "connection input limit exceeded (imq.stomp.input.max_bytes)",
        ),
        properties={"imq.stomp.input.max_bytes": "256k"},
    ),
    Case(
        "total-budget-shared-by-connections",
        probe_total_shared,
        (
            ["done", "done"],
            (
                "414",
                "imq.stomp.input.total.max_bytes",
                "broker input limit exceeded (imq.stomp.input.total.max_bytes)",
            ),
            0,
        ),
        properties={
            "imq.stomp.input.total.max_bytes": "1m",
            "imq.stomp.input.max_bytes": "768k",
        },
    ),
    Case(
        "oversized-header-still-being-written",
        probe_oversized_header,
        ("400", "imq.stomp.max_header_length", "frame limit exceeded"),
    ),
    Case(
        "websocket-message-before-connect",
        probe_websocket_before_connect,
        ("423", "imq.stomp.connect.max_frame_size", 1000),
        properties={"imq.stomp.ws.port": "0"},
    ),
    Case(
        "connection-past-the-total",
        probe_past_connection_count,
        (
            (
                "414",
                "imq.stomp.max_connections",
                "too many connections (imq.stomp.max_connections)",
            ),
            True,
        ),
        properties={"imq.stomp.max_connections": "2"},
    ),
    Case(
        "connection-past-the-per-address-count",
        probe_past_connection_count,
        (
            (
                "414",
                "imq.stomp.max_connections_per_address",
                "too many connections from 127.0.0.1 (imq.stomp.max_connections_per_address)",
            ),
            True,
        ),
        properties={"imq.stomp.max_connections_per_address": "2"},
    ),
]


# -- password checks: off the event loop, cached, slowed down for repeated failures ----------

PASSWORD_CASES: list[Case] = []


# -- listeners and TLS: the plain port off, certificates checked at start --------------------

LISTENER_CASES: list[Case] = []


# -- browsers: Origin on the WebSocket endpoint, Host on the admin endpoint, /ws -------------

BROWSER_CASES: list[Case] = []


# -- the admin endpoint: its rules, slow and idle requests -----------------------------------

ADMIN_CASES: list[Case] = []


# -- access changes: deleted users, revoked rights, connections destroyed --------------------

ACCESS_CHANGE_CASES: list[Case] = []


# -- counts: connections, transactions, cursors and lease groups -----------------------------

COUNT_CASES: list[Case] = []


CASES = [
    *INPUT_CASES,
    *PASSWORD_CASES,
    *LISTENER_CASES,
    *BROWSER_CASES,
    *ADMIN_CASES,
    *ACCESS_CHANGE_CASES,
    *COUNT_CASES,
]


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_case(case: Case, secured_factory: SecuredFactory, tmp_path: Path) -> None:
    assert case.probe(Trial(case, secured_factory, tmp_path)) == case.expected
