"""Probes of the hardening table (tests/security/test_hardening.py): the input budget: partly
received frames, frames before CONNECT.
"""

from __future__ import annotations

from functools import partial

from tests.admin.adminhttp import AdminHttp
from tests.e2e.rawclient import RawClient
from tests.e2e.support import wait_until
from tests.security.conftest import USERS, Secured
from tests.security.hardening import Trial
from tests.server.rawws import RawWebSocket

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


def probe_websocket_before_connect(trial: Trial) -> tuple[str, str, bool]:
    """Over WebSocket: a message announcing 10 MiB before CONNECT, 64 KiB of it sent: the
    ERROR, and whether the broker then closed the connection (with a normal close frame, or,
    when its close crossed the rest of our upload, by the connection's end)."""
    secured = trial.start()
    assert secured.broker.services is not None
    ws = RawWebSocket(secured.broker.services.addresses()["ws"][1])
    try:
        ws.send_header(10 * 1024 * KIB)
        ws.send_payload(b"CONNECT\nlogin:alice\n\n" + b"x" * (64 * KIB))
        error = ws.expect_stomp("ERROR")
        closed = ws.expect_close_or_reset()
        return error.headers["status"], error.headers["limit"], closed in (1000, None)
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
