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
from pathlib import Path

import pytest

from tests.security import access_support as access
from tests.security.conftest import Secured, SecuredFactory


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

INPUT_CASES: list[Case] = []


# -- password checks: off the event loop, cached, slowed down for repeated failures ----------

PASSWORD_CASES: list[Case] = []


# -- listeners and TLS: the plain port off, certificates checked at start --------------------

LISTENER_CASES: list[Case] = []


# -- browsers: Origin on the WebSocket endpoint, Host on the admin endpoint, /ws -------------

BROWSER_CASES: list[Case] = []


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
