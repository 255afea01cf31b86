"""What a careless or hostile client meets, one row per case (docs/security.md).

Each row's probe starts a real broker through its Trial (authentication on, the users of USERS,
the rules of RULES or the row's own, the row's properties, and any the probe adds, such as the
files it made in `trial.directory`), does what the row names over real sockets, and returns what
it saw; the row says what that must be. A probe may expect the start itself to fail. What a
probe returns is what a client or an operator can observe (a status, a message, whether the
socket closed, a count), not the broker's internals.

The rows are grouped by what they harden; each group is a list below, and CASES joins them.
The probes live in tests/security/hardening/, a module per group.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.security import access_support as access
from tests.security.conftest import SecuredFactory
from tests.security.hardening import Case, Trial
from tests.security.hardening.access_changes import (
    deleted_user,
    destroyed_connection,
    revoked_connect,
    revoked_produce,
)
from tests.security.hardening.admin import (
    ADMIN_LINE,
    admin_statuses,
    probe_connection_cap,
    probe_half_requests,
    probe_idle_keepalive,
    worked_example_billing_administers,
    worked_example_root_creates_orders,
)
from tests.security.hardening.browsers import (
    AUTH_OFF,
    WS_ON,
    probe_admin_host,
    probe_ws_origin,
    probe_ws_refused,
)
from tests.security.hardening.counts import (
    begin_past_max_transactions,
    cursor_past_max_groups,
    lease_group_past_max_groups,
    send_past_transaction_bytes,
    send_past_transaction_messages,
)
from tests.security.hardening.inputs import (
    probe_connect_body,
    probe_oversized_header,
    probe_past_connection_count,
    probe_send_past_connection_budget,
    probe_stalled_before_connect,
    probe_total_shared,
    probe_websocket_before_connect,
)
from tests.security.hardening.listeners import (
    probe_certificate_expiring_soon,
    probe_expired_certificate,
    probe_future_certificate,
    probe_mismatched_key,
    probe_no_listener,
    probe_tls_only,
)
from tests.security.hardening.passwords import (
    admin_delays,
    cache_after_changes,
    connect_during_flood,
    growing_delays,
    overload,
)

# -- the input budget: partly received frames, frames before CONNECT ------------------------

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
        ("423", "imq.stomp.connect.max_frame_size", True),
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
        begin_past_max_transactions,
        "imq.stomp.max_transactions",
        "2",
    ),
    _count_case(
        "send-past-transaction-messages",
        send_past_transaction_messages,
        "imq.stomp.transactions.max_messages",
        "2",
    ),
    _count_case(
        "send-past-transaction-bytes",
        send_past_transaction_bytes,
        "imq.stomp.transactions.max_bytes",
        "1k",
    ),
    _count_case("cursor-past-max-groups", cursor_past_max_groups, "imq.cursor.max_groups", "2"),
    _count_case(
        "lease-group-past-max-groups", lease_group_past_max_groups, "imq.lease.max_groups", "1"
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
