"""Access changes reaching open connections, beyond the hardening table: a third-party client,
changed groups and passwords, subscriptions already made, every connection of a user."""

from __future__ import annotations

import stomp

from tests.e2e.stomppy import Recorder
from tests.security.access_support import (
    client,
    closed_with,
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
