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
from tests.security import access_support as access
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

# (Imported here, in this section: each section of the table is edited on its own.)
from sluiceway.security.users import UserFile  # noqa: E402
from tests.security.logins_support import (  # noqa: E402
    PATIENT_S,
    Flood,
    timed_admin,
    timed_refusal,
)


def growing_delays(trial: Trial) -> list[tuple[str, bool]]:
    """Four wrong passwords in a row from one address (the row sets base 200 ms, cap 800 ms):
    each ERROR's status, and whether it came no sooner than its delay."""
    port = trial.start().port
    seen = []
    for delay in (0.2, 0.4, 0.8, 0.8):
        status, elapsed = timed_refusal(port, "alice", "not-her-password")
        seen.append((status, elapsed >= delay))
    return seen


def cache_after_changes(trial: Trial) -> tuple[str, ...]:
    """Alice and Bob log in (and are remembered); then Alice's password changes and Bob is
    deleted: what each of their next CONNECTs gets."""
    secured = trial.start()
    secured.raw("alice")
    secured.raw("bob")
    users = UserFile(secured.directory / "passwd")
    users.add("alice", "alice-new-pw-W3", ("writers",))
    users.delete("bob")
    old_password = secured.refused_connect(login="alice", passcode=USERS["alice"][0])
    new_password = secured.raw(connect=False)
    new_password.connect(login="alice", passcode="alice-new-pw-W3")
    deleted = secured.refused_connect(login="bob", passcode=USERS["bob"][0])
    return old_password["status"], "CONNECTED", deleted["status"]


def connect_during_flood(trial: Trial) -> dict[str, object]:
    """20 connections send wrong passwords as fast as the broker answers. Meanwhile a client
    connected before makes 20 SEND/RECEIPT round trips, and a new client connects."""
    secured = trial.start()
    carol = secured.raw("carol")
    with Flood(secured.port, 20) as flood:
        wait_until(lambda: flood.answered >= 20, PATIENT_S)
        for _ in range(20):
            carol.request("SEND", {"destination": "/topic/news"}, b"during the flood")
        newcomer = RawClient(secured.port, timeout=PATIENT_S)
        try:
            connected = newcomer.connect(login="bob", passcode=USERS["bob"][0]).command
        finally:
            newcomer.close()
    return {"round trips": 20, "newcomer": connected, "attackers got": sorted(flood.answers)}


def admin_delays(trial: Trial) -> list[tuple[int, bool]]:
    """Three admin requests with a wrong password, then one with the right one (the row sets
    base 300 ms, cap 1200 ms): each status, and whether it came no sooner than its delay."""
    port = trial.start().broker.admin_port
    seen = []
    for password, delay in (("typo", 0.3), ("typo", 0.6), ("typo", 1.2), (USERS["root"][0], 1.2)):
        status, elapsed = timed_admin(port, "root", password)
        seen.append((status, elapsed >= delay))
    return seen


def overload(trial: Trial) -> tuple[list[str], set[str], bool]:
    """30 CONNECTs at once to a broker with one thread and no queue for checks: the statuses
    they get, the message of the 503s, and whether every connection was closed."""
    port = trial.start().port
    clients = [RawClient(port, timeout=PATIENT_S) for _ in range(30)]
    try:
        for client in clients:
            client.send("CONNECT", {"accept-version": "1.2", "login": "bob", "passcode": "x"})
        errors = [client.expect("ERROR").headers for client in clients]
        for client in clients:
            client.expect_closed()
    finally:
        for client in clients:
            client.close()
    busy = {e["message"] for e in errors if e["status"] == "503"}
    return sorted({e["status"] for e in errors}), busy, all(c.closed for c in clients)


PASSWORD_CASES: list[Case] = [
    Case(
        "wrong passwords from one address are answered after a growing delay",
        growing_delays,
        [("401", True)] * 4,
        properties={
            "imq.authentication.delay.base": "200",
            "imq.authentication.delay.max": "800",
        },
    ),
    Case(
        "the cache lets in neither an old password nor a deleted user",
        cache_after_changes,
        ("401", "CONNECTED", "401"),
    ),
    Case(
        "a CONNECT and round trips during a flood of wrong passwords complete",
        connect_during_flood,
        {"round trips": 20, "newcomer": "CONNECTED", "attackers got": ["401"]},
        properties={"imq.authentication.workers": "1", "imq.authentication.delay.max": "500"},
    ),
    Case(
        "admin requests with a wrong password are answered after a growing delay too",
        admin_delays,
        [(401, True), (401, True), (401, True), (200, True)],
        properties={
            "imq.authentication.delay.base": "300",
            "imq.authentication.delay.max": "1200",
        },
    ),
    Case(
        "past the queue of password checks a CONNECT gets 503 and is closed",
        overload,
        (["401", "503"], {"too many logins in progress"}, True),
        properties={
            "imq.authentication.workers": "1",
            "imq.authentication.queue.max": "0",
            "imq.authentication.delay.base": "0",
        },
    ),
]


# -- listeners and TLS: the plain port off, certificates checked at start --------------------

# The imports of the listener, browser and admin-connection rows.
import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402

from sluiceway.errors import ConfigError  # noqa: E402
from tests.security import webprobe  # noqa: E402


def _dates(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _refused_start(trial: Trial, **properties: str) -> ConfigError:
    try:
        trial.start(**properties)
    except ConfigError as exc:
        return exc
    raise AssertionError("the broker started")


def probe_tls_only(trial: Trial) -> object:
    """Plain port off, TLS on: the ready line lists what listens, and only that listens."""
    certificate = webprobe.make_certificate(trial.directory)
    secured = trial.start(**{"imq.stomp.tls.port": "0", **certificate.properties()})
    services = secured.broker.services
    assert services is not None
    ready = secured.broker.call(services.ready_line)
    listed = {int(part.rsplit(":", 1)[1]) for part in ready.split(", ")}
    client = webprobe.tls_client(services.addresses()["stomp-tls"][1], certificate.client_context())
    try:
        alice = USERS["alice"][0]
        connected = client.connect(login="alice", passcode=alice).command
    finally:
        client.close()
    labels = tuple(part.split(" on ")[0] for part in ready.split(", "))
    return labels, listed == webprobe.listening_ports(), connected


def probe_no_listener(trial: Trial) -> object:
    refused = _refused_start(trial)
    named = all(n in str(refused) for n in ("tcp.port", "tls.port", "ws.port"))
    return refused.name, named


def _certificate_refused(trial: Trial, not_before: datetime, not_after: datetime) -> object:
    certificate = webprobe.make_certificate(
        trial.directory, not_before=not_before, not_after=not_after
    )
    refused = _refused_start(trial, **{"imq.stomp.tls.port": "0", **certificate.properties()})
    message = str(refused)
    return (
        refused.name,
        str(certificate.certfile) in message,
        f"notBefore {_dates(not_before)}" in message,
        f"notAfter {_dates(not_after)}" in message,
    )


def probe_expired_certificate(trial: Trial) -> object:
    return _certificate_refused(
        trial, datetime(2020, 1, 1, tzinfo=UTC), datetime(2021, 1, 1, tzinfo=UTC)
    )


def probe_future_certificate(trial: Trial) -> object:
    now = datetime.now(UTC).replace(microsecond=0)
    return _certificate_refused(trial, now + timedelta(days=10), now + timedelta(days=400))


def probe_mismatched_key(trial: Trial) -> object:
    certificate = webprobe.make_certificate(trial.directory)
    other = webprobe.make_certificate(trial.directory, "other")
    properties = {**certificate.properties(), "imq.tls.keyfile": str(other.keyfile)}
    refused = _refused_start(trial, **{"imq.stomp.tls.port": "0", **properties})
    message = str(refused)
    return refused.name, str(certificate.certfile) in message, str(other.keyfile) in message


def probe_certificate_expiring_soon(trial: Trial) -> object:
    now = datetime.now(UTC).replace(microsecond=0)
    certificate = webprobe.make_certificate(trial.directory, not_after=now + timedelta(days=10))
    with webprobe.capture("sluiceway.server.tls") as records:
        secured = trial.start(**{"imq.stomp.tls.port": "0", **certificate.properties()})
    warning = records.text()
    return (
        secured.broker.services is not None,
        str(certificate.certfile) in warning,
        _dates(certificate.not_after) in warning,
    )


LISTENER_CASES: list[Case] = [
    Case(
        "plain-port-off-only-tls-listens",
        probe_tls_only,
        (("STOMP+TLS", "admin"), True, "CONNECTED"),
        {"imq.stomp.tcp.port": "-1"},
    ),
    Case(
        "no-stomp-listener-refused-at-start",
        probe_no_listener,
        ("imq.stomp.tcp.port", True),
        {"imq.stomp.tcp.port": "-1"},
    ),
    Case(
        "expired-certificate-refused-naming-file-and-dates",
        probe_expired_certificate,
        ("imq.tls.certfile", True, True, True),
    ),
    Case(
        "not-yet-valid-certificate-refused-naming-file-and-dates",
        probe_future_certificate,
        ("imq.tls.certfile", True, True, True),
    ),
    Case(
        "key-of-another-certificate-refused-naming-both-files",
        probe_mismatched_key,
        ("imq.tls.keyfile", True, True),
    ),
    Case(
        "certificate-expiring-within-30-days-starts-with-a-warning",
        probe_certificate_expiring_soon,
        (True, True, True),
    ),
]


# -- browsers: Origin on the WebSocket endpoint, Host on the admin endpoint, /ws -------------

FOREIGN_ORIGIN = "http://evil.example"
WS_ON = {"imq.stomp.ws.port": "0"}
AUTH_OFF = {"imq.authentication.enabled": "false"}


def _ws_port(secured: Secured) -> int:
    services = secured.broker.services
    assert services is not None
    return services.addresses()["ws"][1]


def probe_ws_origin(origin: str | None, path: str = "/stomp") -> Callable[[Trial], object]:
    """A STOMP session over WebSocket from a page of `origin`: CONNECTED, or the HTTP status."""

    def probe(trial: Trial) -> object:
        port = _ws_port(trial.start())
        return webprobe.ws_connect(port, path, origin, "alice", USERS["alice"][0])

    return probe


def probe_ws_refused(path: str) -> Callable[[Trial], object]:
    """A handshake from a page of another site: the status, whether the answer names the
    origin and the property, whether a WARNING says so."""

    def probe(trial: Trial) -> object:
        port = _ws_port(trial.start())
        with webprobe.capture("sluiceway.server.websocket") as records:
            answer = webprobe.ws_handshake(port, path, FOREIGN_ORIGIN)
        body = answer.body.decode()
        named = FOREIGN_ORIGIN in body and "imq.stomp.ws.allowed_origins" in body
        return answer.status, named, FOREIGN_ORIGIN in records.text()

    return probe


def probe_admin_host(*hosts: str) -> Callable[[Trial], object]:
    """GET /api/v1/broker naming each of `hosts` (`{port}` is the admin port): the statuses,
    and for a refusal its JSON error and whether its detail names the property."""

    def probe(trial: Trial) -> object:
        port = trial.start().broker.admin_port
        seen: list[object] = []
        for host in hosts:
            request = webprobe.get_request("/api/v1/broker", host.format(port=port))
            answer = webprobe.http_exchange(port, request)
            if answer.status == 403:
                error = json.loads(answer.body)
                named = "imq.admin.allowed_hosts" in error["detail"]
                seen.append((403, error["error"], error["status"], named))
            else:
                seen.append(answer.status)
        return seen

    return probe


BROWSER_CASES: list[Case] = [
    Case("ws-foreign-origin-refused", probe_ws_refused("/stomp"), (403, True, True), WS_ON),
    Case("ws-own-origin-accepted", probe_ws_origin("http://localhost:3000"), "CONNECTED", WS_ON),
    Case("ws-without-origin-accepted", probe_ws_origin(None), "CONNECTED", WS_ON),
    Case(
        "ws-listed-origin-accepted",
        probe_ws_origin("https://app.example.com"),
        "CONNECTED",
        {**WS_ON, "imq.stomp.ws.allowed_origins": "https://app.example.com"},
    ),
    Case(
        "ws-listed-origin-on-another-port-refused",
        probe_ws_origin("https://app.example.com:8443"),
        "HTTP 403",
        {**WS_ON, "imq.stomp.ws.allowed_origins": "https://app.example.com"},
    ),
    Case("ws-path-ws-works", probe_ws_origin(None, "/ws"), "CONNECTED", WS_ON),
    Case("ws-path-ws-checks-origin", probe_ws_refused("/ws"), (403, True, True), WS_ON),
    Case(
        "admin-foreign-host-refused-with-authentication-off",
        probe_admin_host("evil.example:{port}", "evil.example"),
        [(403, "unknown host", 403, True)] * 2,
        AUTH_OFF,
    ),
    Case(
        "admin-foreign-host-refused-before-authentication",
        probe_admin_host("evil.example:{port}"),
        [(403, "unknown host", 403, True)],
    ),
    Case(
        "admin-own-host-works",
        probe_admin_host("localhost:{port}", "127.0.0.1", "[::1]:{port}", "127.0.0.1:{port}"),
        [200, 200, 200, 200],
        AUTH_OFF,
    ),
    Case(
        "admin-listed-host-works",
        probe_admin_host("mq.example.com:{port}", "mq.example.com"),
        [200, 200],
        {**AUTH_OFF, "imq.admin.allowed_hosts": "mq.example.com"},
    ),
]


# -- the admin endpoint: its rules, slow and idle requests -----------------------------------


def worked_example_root_creates_orders(trial: Trial) -> object:
    """docs/security.md's worked example as written (its users, its rules file verbatim): root
    runs the `sluiceway cmd create dst` it prescribes, after which shop may send to the queue."""
    secured = trial.start(**access.worked_users(trial.directory))
    shop = access.client(secured, "shop", access.WORKED_USERS, failed_receipts="true")
    before = shop.request("SEND", {"destination": "/queue/orders"}).headers.get("message")
    result = access.run_as_written(secured, access.worked_example().create_command)
    after = shop.request("SEND", {"destination": "/queue/orders"}).headers.get("status")
    return before, result.status, result.out, result.err, after


def worked_example_billing_administers(trial: Trial) -> object:
    secured = trial.start(**access.worked_users(trial.directory))
    result = access.cmd_as(secured, "billing", "list", "dst", users=access.WORKED_USERS)
    return result.status, result.error_line.split(": ", 3)[1:3]


def admin_statuses(*users: str) -> Callable[[Trial], object]:
    """A probe: the HTTP status of GET /broker for each of `users`, in order."""

    def probe(trial: Trial) -> object:
        port = trial.start().broker.admin_port
        return [access.admin_status(port, user) for user in users]

    return probe


ADMIN_LINE = "connection.ADMIN.allow.group=admin"

ADMIN_CASES: list[Case] = [
    Case(
        "worked-example-root-creates-a-queue",
        worked_example_root_creates_orders,
        ("user shop may not create /queue/orders", 0, "Created queue orders.\n", "", None),
        rules=access.worked_example().rules,
    ),
    Case(
        "worked-example-billing-is-not-an-administrator",
        worked_example_billing_administers,
        (1, ["not an administrator", "user 'billing' may not administer the broker"]),
        rules=access.worked_example().rules,
    ),
    Case(
        "admin-rule-lets-a-user-outside-the-group-administer",
        admin_statuses("carol", "bob", "root"),
        [200, 403, 200],
        rules=access.RULES + "connection.ADMIN.allow.user=carol\n",
    ),
    Case(
        "admin-rule-keeps-a-member-of-the-group-out",
        admin_statuses("root"),
        [403],
        rules=access.RULES + "connection.ADMIN.deny.user=root\n",
    ),
    Case(
        "no-admin-rule-lets-nobody-administer",
        admin_statuses("root", "bob"),
        [403, 403],
        rules=access.without_line(access.RULES, ADMIN_LINE),
    ),
    Case(
        "a-connection-star-rule-covers-the-admin-endpoint",
        admin_statuses("bob", "root"),
        [200, 200],
        rules=access.without_line(access.RULES, ADMIN_LINE) + "connection.*.allow.user=*\n",
    ),
    Case(
        "without-access-control-the-admin-group-decides",
        admin_statuses("root", "carol"),
        [200, 403],
        properties={"imq.accesscontrol.enabled": "false"},
        rules=access.RULES + "connection.ADMIN.deny.user=root\nconnection.ADMIN.allow.user=carol\n",
    ),
]


def _half_requests(count: int, port: int) -> list[socket.socket]:
    opened = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=webprobe.TIMEOUT)
            opened.append(sock)
            sock.sendall(b"GET /api/v1/broker HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    except BaseException:
        for sock in opened:
            sock.close()
        raise
    return opened


def probe_half_requests(trial: Trial) -> object:
    """Many connections that send half a request's head: how many the broker closes, and
    whether each was held at least the header timeout."""
    port = trial.start().broker.admin_port
    started = time.monotonic()
    sockets = _half_requests(20, port)
    try:
        deadline = started + webprobe.TIMEOUT
        closed = [webprobe.closed_within(sock, deadline) for sock in sockets]
        held = time.monotonic() - started >= 0.3
    finally:
        for sock in sockets:
            sock.close()
    return sum(closed), held


def probe_idle_keepalive(trial: Trial) -> object:
    """A kept-alive connection that goes quiet after its answer: the answer, then closed."""
    port = trial.start().broker.admin_port
    request = webprobe.get_request(
        "/api/v1/broker",
        "127.0.0.1",
        close=False,
        Authorization=webprobe.basic("root", USERS["root"][0]),
    )
    with socket.create_connection(("127.0.0.1", port), timeout=webprobe.TIMEOUT) as sock:
        answer = webprobe.http_exchange(port, request, sock=sock)
        closed = webprobe.closed_within(sock, time.monotonic() + webprobe.TIMEOUT)
    return answer.status, closed


def probe_connection_cap(trial: Trial) -> object:
    """Three kept-alive connections fill imq.admin.max_connections=3: the fourth is answered 503
    and closed; once one of the three closes, a new one is served."""
    port = trial.start().broker.admin_port
    authorization = webprobe.basic("root", USERS["root"][0])
    request = webprobe.get_request(
        "/api/v1/broker", "127.0.0.1", close=False, Authorization=authorization
    )
    held = [
        socket.create_connection(("127.0.0.1", port), timeout=webprobe.TIMEOUT) for _ in range(3)
    ]
    try:
        statuses: list[object] = [
            webprobe.http_exchange(port, request, sock=s).status for s in held
        ]
        with socket.create_connection(("127.0.0.1", port), timeout=webprobe.TIMEOUT) as extra:
            refused = webprobe.read_answer(extra)
            closed = webprobe.closed_within(extra, time.monotonic() + webprobe.TIMEOUT)
        statuses += [refused.status, json.loads(refused.body)["error"], closed]
        held.pop().close()
        final = webprobe.get_request("/api/v1/broker", "127.0.0.1", Authorization=authorization)
        answers: list[int] = []

        def served() -> bool:
            try:
                answers.append(webprobe.http_exchange(port, final).status)
            except ConnectionError:  # still refused: the broker has not seen the close yet
                return False
            return answers[-1] == 200

        wait_until(served)
        return [*statuses, answers[-1]]
    finally:
        for sock in held:
            sock.close()


ADMIN_CASES += [
    Case(
        "admin-half-sent-requests-closed-after-header-timeout",
        probe_half_requests,
        (20, True),
        {"imq.admin.request.header_timeout": "300"},
    ),
    Case(
        "admin-idle-keepalive-connection-closed",
        probe_idle_keepalive,
        (200, True),
        {"imq.admin.keepalive.timeout": "300"},
    ),
    Case(
        "admin-connections-beyond-the-cap-refused",
        probe_connection_cap,
        [200, 200, 200, 503, "too many connections", True, 200],
        {"imq.admin.max_connections": "3"},
    ),
]


# -- access changes: deleted users, revoked rights, connections destroyed --------------------


def deleted_user(trial: Trial) -> object:
    """alice is deleted with `sluiceway cmd user delete` while connected."""
    secured = trial.start()
    alice = access.client(secured, "alice")
    users = str(secured.directory / "passwd")
    deleted = access.run_cmd("user", "delete", "-u", "alice", "--file", users)
    assert deleted.status == 0, deleted.err
    status, message, _, closed = access.closed_with(alice)
    return status, message, closed


def revoked_produce(trial: Trial) -> object:
    """alice may produce to /queue/scratch, then the rule is removed: her next SEND (on a
    connection without failed receipts) gets ERROR 403 and the connection closes."""
    secured = trial.start()
    alice = access.client(secured, "alice")
    sent = alice.request("SEND", {"destination": "/queue/scratch"}, b"before").command
    rule = "queue.scratch.produce.allow.user=*"
    access.replace_file(secured.access_file, access.without_line(access.RULES, rule))
    carol = access.client(secured, "carol", failed_receipts="true")  # noticed once she is refused
    access.wait_refused(carol, "SEND", {"destination": "/queue/scratch"})
    alice.send("SEND", {"destination": "/queue/scratch", "receipt": "r-after"}, b"after")
    status, message, _, closed = access.closed_with(alice)
    return sent, status, message, closed


def revoked_connect(trial: Trial) -> object:
    """alice joins eve in connection.NORMAL.deny.user while she is connected."""
    secured = trial.start()
    alice = access.client(secured, "alice")
    deny = "connection.NORMAL.deny.user=eve"
    rules = access.without_line(access.RULES, deny) + f"{deny},alice\n"
    access.replace_file(secured.access_file, rules)
    status, message, _, closed = access.closed_with(alice)
    return status, message, closed


def destroyed_connection(trial: Trial) -> object:
    """root runs `sluiceway cmd destroy cxn -n ID -reason TEXT -f` on alice's connection."""
    secured = trial.start()
    alice = access.client(secured, "alice")
    number = access.connection_id(secured, "alice")
    args = ("destroy", "cxn", "-n", str(number), "-reason", "maintenance window", "-f")
    result = access.cmd_as(secured, "root", *args)
    output = result.out.replace(f"connection {number} ", "connection ID ")
    status, message, body, closed = access.closed_with(alice)
    return result.status, output.split(" (")[0], status, message, body.strip(), closed


ACCESS_CHANGE_CASES: list[Case] = [
    Case(
        "deleted-user-gets-401-and-is-closed",
        deleted_user,
        ("401", "user alice no longer exists", True),
    ),
    Case(
        "revoked-produce-right-refuses-the-next-send",
        revoked_produce,
        ("RECEIPT", "403", "user alice may not produce to /queue/scratch", True),
    ),
    Case(
        "revoked-connect-right-closes-the-connection",
        revoked_connect,
        ("403", "user alice may not connect", True),
    ),
    Case(
        "destroy-cxn-closes-with-the-reason",
        destroyed_connection,
        (
            0,
            "Destroyed connection ID of user alice",
            "410",
            "connection closed by an administrator",
            "connection closed by an administrator: maintenance window",
            True,
        ),
    ),
]


# -- counts: connections, transactions, cursors and lease groups -----------------------------

# Every authenticated user may do everything: these rows bound counts, not rights.
COUNT_RULES = """\
version=JMQFileAccessControlModel/100
connection.NORMAL.allow.user=*
queue.*.produce.allow.user=*
queue.*.consume.allow.user=*
topic.*.produce.allow.user=*
topic.*.consume.allow.user=*
topic.*.browse.allow.user=*
queue.create.allow.user=*
topic.create.allow.user=*
"""

# A frame sent asking for a receipt: command, headers, body.
CountRequest = tuple[str, dict[str, str], bytes]
# What the client sees of the first request past a limit: the failed RECEIPT's status and limit
# header, whether its detail names that property, and whether the same connection and another
# one then still have their requests accepted.
CountRefusal = tuple[str | None, str | None, bool, bool, bool]


def _past_a_count_limit(
    trial: Trial, reach: list[CountRequest], past: CountRequest, then: list[CountRequest]
) -> CountRefusal:
    """As alice, with failed receipts: `reach` the limit, go `past` it, `then` go on."""
    secured = trial.start()
    client = secured.raw("alice")
    for command, headers, body in reach:
        receipt = client.request(command, headers, body)
        assert "status" not in receipt.headers, receipt
    refused = client.request(*past).headers
    limit = refused.get("limit")
    named = limit is not None and limit in refused.get("detail", "")
    goes_on = all("status" not in client.request(*request).headers for request in then)
    other = secured.raw("bob").request("SEND", {"destination": "/queue/scratch"}, b"after")
    return refused.get("status"), limit, named, goes_on, "status" not in other.headers


def _in_tx(tx: str, body: bytes = b"x") -> CountRequest:
    return "SEND", {"destination": "/queue/scratch", "transaction": tx}, body


def _tx(command: str, tx: str) -> CountRequest:
    return command, {"transaction": tx}, b""


def _cursor(group: str, sub_id: str = "") -> CountRequest:
    """A read through cursor `group` (subscription id `sub_id`, else the group)."""
    sub_id = sub_id or group
    headers = {"destination": "/topic/feed", "id": sub_id, "browser": "true", "cursor": group}
    return "SUBSCRIBE", headers, b""


def _lease(name: str) -> CountRequest:
    headers = {"destination": "/queue/scratch", "id": name, "lease": name}
    return "SUBSCRIBE", headers, b""


def _begin_past_max_transactions(trial: Trial) -> CountRefusal:
    reach = [_tx("BEGIN", "a"), _tx("BEGIN", "b")]
    return _past_a_count_limit(trial, reach, _tx("BEGIN", "c"), [_in_tx("a"), _tx("COMMIT", "a")])


def _send_past_transaction_messages(trial: Trial) -> CountRefusal:
    reach = [_tx("BEGIN", "a"), _tx("BEGIN", "b"), _in_tx("a"), _in_tx("b")]
    return _past_a_count_limit(trial, reach, _in_tx("b"), [_tx("COMMIT", "b")])


def _send_past_transaction_bytes(trial: Trial) -> CountRefusal:
    reach = [_tx("BEGIN", "a"), _in_tx("a", b"x" * 1000)]
    return _past_a_count_limit(trial, reach, _in_tx("a", b"y" * 100), [_tx("COMMIT", "a")])


def _cursor_past_max_groups(trial: Trial) -> CountRefusal:
    return _past_a_count_limit(
        trial, [_cursor("a"), _cursor("b")], _cursor("c"), [_cursor("a", "again")]
    )


def _lease_group_past_max_groups(trial: Trial) -> CountRefusal:
    return _past_a_count_limit(trial, [_lease("g/1")], _lease("h/1"), [_lease("g/2")])


def _count_case(name: str, probe: Callable[[Trial], object], limit: str, value: str) -> Case:
    """A row: with `limit` set to `value`, the request past it is refused, naming it."""
    return Case(
        name,
        probe,
        ("414", limit, True, True, True),
        properties={limit: value},
        rules=COUNT_RULES,
    )


COUNT_CASES: list[Case] = [
    _count_case(
        "begin-past-max-transactions",
        _begin_past_max_transactions,
        "imq.stomp.max_transactions",
        "2",
    ),
    _count_case(
        "send-past-transaction-messages",
        _send_past_transaction_messages,
        "imq.stomp.transactions.max_messages",
        "2",
    ),
    _count_case(
        "send-past-transaction-bytes",
        _send_past_transaction_bytes,
        "imq.stomp.transactions.max_bytes",
        "1k",
    ),
    _count_case("cursor-past-max-groups", _cursor_past_max_groups, "imq.cursor.max_groups", "2"),
    _count_case(
        "lease-group-past-max-groups", _lease_group_past_max_groups, "imq.lease.max_groups", "1"
    ),
]


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
