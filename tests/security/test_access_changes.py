"""Access changes reaching open connections, and `destroy cxn`, beyond the hardening table:
a third-party client, changed groups and passwords, subscriptions already made, the Python
client, and what `destroy cxn` refuses."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import stomp

from sluiceway.client import ConnectionClosedError, ConnectionFactory
from sluiceway.errors import Gone
from tests.admin.adminhttp import AdminHttp
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import Recorder, with_receipt
from tests.e2e.support import eventually
from tests.security.access_support import (
    client,
    closed_with,
    cmd_as,
    cmd_on_terminal,
    connection_id,
    replace_file,
    run_cmd,
    wait_refused,
    without_line,
)
from tests.security.conftest import RULES, USERS, Secured


def users_file(secured: Secured) -> str:
    return str(secured.directory / "passwd")


# -- users deleted, groups and passwords changed ----------------------------------------------


def test_stomppy_sees_a_deleted_users_connection_refused_and_closed(secured: Secured) -> None:
    connection = stomp.Connection12([("127.0.0.1", secured.port)], auto_content_length=True)
    recorder = Recorder()
    connection.set_listener("recorder", recorder)
    connection.connect("alice", USERS["alice"][0], wait=True)
    try:
        deleted = run_cmd("user", "delete", "-u", "alice", "--file", users_file(secured))
        assert deleted.status == 0, deleted.err
        recorder.wait_for(lambda: recorder.disconnected, timeout=15)
        (error,) = recorder.errors
        assert (error.headers["status"], error.headers["message"]) == (
            "401",
            "user alice no longer exists",
        )
    finally:
        connection.disconnect()


def test_changed_groups_keep_the_connection_and_count_from_then_on(secured: Secured) -> None:
    carol = client(secured, "carol", failed_receipts="true")  # readers, writers
    allowed = carol.request("SEND", {"destination": "/topic/news"}, b"as a writer")
    assert "status" not in allowed.headers
    replaced = run_cmd(
        "user", "add", "--replace", "-u", "carol", "-p", USERS["carol"][0], "-g", "readers",
        "--file", users_file(secured),
    )  # fmt: skip
    assert replaced.status == 0, replaced.err
    refused = wait_refused(carol, "SEND", {"destination": "/topic/news"})
    assert (refused["status"], refused["message"]) == (
        "403",
        "user carol may not produce to /topic/news",
    )
    # Still connected.
    assert "status" not in carol.subscribe("/topic/news").headers


def test_a_new_password_leaves_the_connection_open(secured: Secured) -> None:
    alice = client(secured, "alice")
    mallory = client(secured, "mallory")
    changed = run_cmd(
        "user", "add", "--replace", "-u", "alice", "-p", "alice-new-pw", "-g", "writers",
        "--file", users_file(secured),
    )  # fmt: skip
    assert changed.status == 0, changed.err
    # A later change, acted on by the broker, says it has seen the password change too.
    deleted = run_cmd("user", "delete", "-u", "mallory", "--file", users_file(secured))
    assert deleted.status == 0, deleted.err
    assert closed_with(mallory)[0] == "401"
    assert alice.request("SEND", {"destination": "/queue/scratch"}, b"still here").command == (
        "RECEIPT"
    )
    old = secured.refused_connect(login="alice", passcode=USERS["alice"][0])
    assert old["status"] == "401"
    client(secured, "alice", {"alice": ("alice-new-pw", ())}).close()


def test_a_subscription_made_goes_on_after_its_right_is_removed(secured: Secured) -> None:
    alice = client(secured, "alice")  # may create queues
    alice.request("SEND", {"destination": "/queue/scratch"}, b"before the change")
    bob = client(secured, "bob", failed_receipts="true")  # readers: may consume queues
    bob.subscribe("/queue/scratch", "before")
    (first,) = bob.receive(1)
    bob.ack(first)
    replace_file(secured.access_file, without_line(RULES, "queue.*.consume.allow.group=readers"))
    carol = client(secured, "carol", failed_receipts="true")  # readers too: refused once seen
    probe = wait_refused(carol, "SUBSCRIBE", {"destination": "/queue/scratch"})
    assert probe["message"] == "user carol may not consume from /queue/scratch"
    alice.request("SEND", {"destination": "/queue/scratch"}, b"after the change")
    (message,) = bob.receive(1, timeout=10)
    assert message.body == b"after the change"
    bob.ack(message)
    refused = bob.request("SUBSCRIBE", {"destination": "/queue/scratch", "id": "after"})
    assert (refused.headers["status"], refused.headers["message"]) == (
        "403",
        "user bob may not consume from /queue/scratch",
    )


def test_a_connect_right_removed_closes_every_connection_of_that_user(secured: Secured) -> None:
    first, second = client(secured, "bob"), client(secured, "bob")
    alice = client(secured, "alice")
    rules = without_line(RULES, "connection.NORMAL.deny.user=eve")
    replace_file(secured.access_file, rules + "connection.NORMAL.deny.user=eve,bob\n")
    for connection in (first, second):
        assert closed_with(connection)[:2] == ("403", "user bob may not connect")
    assert alice.request("SEND", {"destination": "/queue/scratch"}).command == "RECEIPT"


# -- destroy cxn ------------------------------------------------------------------------------


def test_destroy_cxn_without_a_reason_and_the_audit_line(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.admin.http")
    alice = client(secured, "alice")
    number = connection_id(secured, "alice")
    result = cmd_as(secured, "root", "destroy", "cxn", "-n", str(number), "-f", "--json")
    assert result.status == 0, result.err
    answer = result.json()
    assert (answer["id"], answer["user"], answer["reason"]) == (number, "alice", "")
    status, message, body, _ = closed_with(alice)
    assert (status, message) == ("410", "connection closed by an administrator")
    assert body.strip() == "connection closed by an administrator (no reason given)"
    assert f"admin root: destroy cxn {number} ({answer['peer']}, user alice)" in caplog.text


def test_destroy_cxn_refuses_what_it_cannot_do(secured: Secured) -> None:
    alice = client(secured, "alice")
    number = connection_id(secured, "alice")
    unknown = cmd_as(secured, "root", "destroy", "cxn", "-n", "999999", "-f")
    assert unknown.status == 1
    assert unknown.error_line == (
        "sluiceway cmd: no such connection: connection 999999 is not open; GET "
        "/api/v1/connections (sluiceway cmd list cxn) lists the open connections"
    )
    bad = cmd_as(secured, "root", "destroy", "cxn", "-n", "alice", "-f")
    assert bad.status == 2
    assert "-n 'alice': a connection ID is a positive whole number" in bad.error_line
    unconfirmed = cmd_as(secured, "root", "destroy", "cxn", "-n", str(number))
    assert unconfirmed.status == 2
    assert "add -f" in unconfirmed.error_line
    long = cmd_as(secured, "root", "destroy", "cxn", "-n", str(number), "-f", "-reason", "x" * 201)
    assert long.status == 1
    assert "bad reason: the reason must be at most 200 characters" in long.error_line
    forbidden = cmd_as(secured, "bob", "destroy", "cxn", "-n", str(number), "-f")
    assert forbidden.status == 1
    assert "not an administrator" in forbidden.error_line
    # None of that touched alice's connection.
    assert alice.request("SEND", {"destination": "/queue/scratch"}).command == "RECEIPT"


def test_destroy_cxn_asks_on_a_terminal(secured: Secured) -> None:
    alice = client(secured, "alice")
    number = connection_id(secured, "alice")
    status, out, err = cmd_on_terminal(secured, "n", "destroy", "cxn", "-n", str(number))
    assert status == 0, err
    assert f"Destroy connection {number} (user alice, stomp from 127.0.0.1:" in err
    assert err.rstrip().endswith("? [y/N]")
    assert out == f"Not destroyed: connection {number}.\n"
    assert alice.request("SEND", {"destination": "/queue/scratch"}).command == "RECEIPT"
    status, out, err = cmd_on_terminal(secured, "y", "destroy", "cxn", "-n", "31337")
    assert status == 1
    assert err.splitlines()[-1].endswith(
        "sluiceway cmd: no such connection: connection 31337 is not open; `sluiceway cmd list "
        "cxn` lists the open connections"
    )
    status, out, err = cmd_on_terminal(secured, "y", "destroy", "cxn", "-n", str(number))
    assert status == 0, err
    assert out.startswith(f"Destroyed connection {number} of user alice (127.0.0.1:")
    assert closed_with(alice)[0] == "410"


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        ("/connections/abc", {}, 400, "bad connection ID"),
        ("/connections/0", {}, 400, "bad connection ID"),
        ("/connections/1", {"reason": 7}, 400, "bad reason"),
        ("/connections/1", {"reason": "two\nlines"}, 400, "bad reason"),
        ("/connections/424242", {}, 404, "no such connection"),
    ],
)
def test_the_api_refuses_bad_requests(
    secured: Secured, path: str, body: dict[str, Any], status: int, error: str
) -> None:
    api = AdminHttp(secured.broker.admin_port, "root", USERS["root"][0])
    code, answer = api.call("DELETE", path, body)
    assert (code, answer["error"]) == (status, error)


def test_destroy_cxn_without_authentication_returns_unacknowledged_messages(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker()
    first = RawClient(broker.port)
    second: RawClient | None = None
    try:
        first.connect()
        first.subscribe("/queue/handover")
        first.request("SEND", {"destination": "/queue/handover"}, b"unacknowledged")
        (message,) = first.receive(1)
        api = AdminHttp(broker.admin_port)
        (row,) = api.ok("GET", "/connections")
        answer = api.ok("DELETE", f"/connections/{row['id']}", {"reason": "moving it"})
        assert (answer["user"], answer["reason"]) == ("", "moving it")
        assert closed_with(first)[2].strip() == "connection closed by an administrator: moving it"
        second = RawClient(broker.port)
        second.connect()
        second.subscribe("/queue/handover")
        (again,) = second.receive(1)
        assert again.body == message.body
        assert again.headers.get("redelivered") == "true"
    finally:
        first.close()
        if second is not None:
            second.close()


async def test_the_python_client_sees_its_connection_lost_with_gone(
    make_broker: BrokerFactory,
) -> None:
    broker = await asyncio.to_thread(make_broker)
    connection = await ConnectionFactory(f"stomp://127.0.0.1:{broker.port}").connect()
    try:
        api = AdminHttp(broker.admin_port)
        (row,) = await asyncio.to_thread(api.ok, "GET", "/connections")
        await asyncio.to_thread(api.ok, "DELETE", f"/connections/{row['id']}", {})
        await eventually(lambda: connection.closed, timeout=10)
        with pytest.raises(ConnectionClosedError) as caught:
            await connection.session().producer("/queue/after").send(b"x")
        assert isinstance(caught.value.__cause__, Gone)
        assert caught.value.__cause__.summary == "connection closed by an administrator"
    finally:
        await connection.close()


def test_a_stomppy_connection_destroyed_sees_410(secured: Secured) -> None:
    connection = stomp.Connection12([("127.0.0.1", secured.port)], auto_content_length=True)
    recorder = Recorder()
    connection.set_listener("recorder", recorder)
    connection.connect("alice", USERS["alice"][0], wait=True)
    try:
        with_receipt(
            recorder, lambda r: connection.send("/queue/scratch", "x", headers={"receipt": r})
        )
        number = connection_id(secured, "alice")
        args = ("destroy", "cxn", "-n", str(number), "-f", "-reason", "rebalancing")
        assert cmd_as(secured, "root", *args).status == 0
        recorder.wait_for(lambda: recorder.disconnected, timeout=10)
        (error,) = recorder.errors
        assert (error.headers["status"], error.body.strip()) == (
            "410",
            "connection closed by an administrator: rebalancing",
        )
    finally:
        connection.disconnect()
