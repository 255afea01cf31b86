"""Authentication and access rules over real sockets, with raw STOMP frames."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sluiceway.naming import DestinationKind, DestinationName
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.support import wait_until
from tests.security.conftest import PASSWORDS, USERS, Secured, SecuredFactory

WRONG = "wrong user name or password"


def attempt(
    client: RawClient, command: str, headers: dict[str, str], body: bytes = b""
) -> dict[str, str]:
    """Send `command` with a receipt: the RECEIPT's headers (with `status` if refused)."""
    return client.request(command, headers, body).headers


def accepted(client: RawClient, command: str, headers: dict[str, str], body: bytes = b"") -> None:
    receipt = attempt(client, command, headers, body)
    assert "status" not in receipt, f"{command} was refused: {receipt}"


def refused(client: RawClient, command: str, headers: dict[str, str]) -> dict[str, str]:
    """Send `command` with a receipt; it must come back as a failed RECEIPT (its headers)."""
    receipt = attempt(client, command, headers)
    assert "status" in receipt, f"{command} was accepted"
    return receipt


# -- authentication ---------------------------------------------------------------------------


def test_wrong_password_is_refused_with_401_and_the_connection_closed(secured: Secured) -> None:
    error = secured.refused_connect(login="alice", passcode="not-her-password")
    assert (error["status"], error["message"]) == ("401", WRONG)
    assert error["body"].startswith(f"{WRONG}: check the login and passcode")


def test_unknown_user_gets_the_same_answer_as_a_wrong_password(secured: Secured) -> None:
    wrong_password = secured.refused_connect(login="alice", passcode="guess")
    unknown_user = secured.refused_connect(login="alicia", passcode="guess")
    assert unknown_user == wrong_password
    missing_passcode = secured.refused_connect(login="alice")
    assert missing_passcode == wrong_password


def test_no_credentials_is_its_own_401(secured: Secured) -> None:
    error = secured.refused_connect()
    assert (error["status"], error["message"]) == ("401", "no credentials")
    assert "login and passcode" in error["body"]
    assert secured.refused_connect(login="", passcode="x")["message"] == "no credentials"


def test_refused_even_with_failed_receipts_and_a_receipt(secured: Secured) -> None:
    """A refused CONNECT always closes: there is no session to keep."""
    error = secured.refused_connect(
        login="bob", passcode="nope", **{"failed-receipts": "true", "receipt": "c1"}
    )
    assert error["status"] == "401"


def test_the_stomp_command_authenticates_too(secured: Secured) -> None:
    client = secured.raw(connect=False)
    client.send(
        "STOMP",
        {"accept-version": "1.2", "host": "x", "login": "bob", "passcode": USERS["bob"][0]},
    )
    client.expect("CONNECTED")
    client.send("STOMP", {"accept-version": "1.1", "host": "x", "login": "bob"})
    assert client.expect("ERROR").headers["status"] == "400"  # already connected


def test_right_credentials_connect_and_set_the_user(secured: Secured) -> None:
    secured.raw("bob")
    core = secured.broker.broker
    assert core is not None
    assert secured.broker.call(lambda: [c.user for c in core.connections.values()]) == ["bob"]


def test_failures_are_logged_with_peer_and_user_never_the_password(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sluiceway")
    secured.refused_connect(login="alice", passcode="typo-Zq81")
    secured.refused_connect(login="nobody", passcode="typo-Zq82")
    secured.refused_connect(passcode="typo-Zq83")
    # Invalid UTF-8 in the passcode line: the decoder quotes the line to the client only.
    client = secured.raw(connect=False)
    client.send_bytes(b"CONNECT\naccept-version:1.2\nlogin:bob\npasscode:typo-Zq84\xff\n\n\0")
    assert client.expect("ERROR").headers["status"] == "400"
    secured.raw("carol").sync()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = "\n".join(r.getMessage() for r in warnings)
    assert f"{WRONG} for user 'alice'" in text
    assert f"{WRONG} for user 'nobody'" in text
    assert "no credentials" in text
    assert "127.0.0.1:" in text  # the peer
    assert "malformed CONNECT" in text
    everything = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    for secret in (*PASSWORDS, "typo-Zq8"):
        assert secret not in everything


def test_without_authentication_login_and_passcode_are_ignored(broker: BrokerThread) -> None:
    client = RawClient(broker.port)
    client.connect(login="anyone", passcode="anything")
    client.subscribe("/queue/open")
    accepted(client, "SEND", {"destination": "/queue/open"}, b"hi")
    assert client.receive()[0].body == b"hi"
    client.close()


# -- access rules -----------------------------------------------------------------------------


def test_a_user_the_rules_refuse_cannot_connect(secured: Secured) -> None:
    error = secured.refused_connect(login="eve", passcode=USERS["eve"][0])
    assert (error["status"], error["message"]) == ("403", "user eve may not connect")


def test_produce_allowed_and_forbidden(secured: Secured) -> None:
    alice = secured.raw("alice")
    accepted(alice, "SEND", {"destination": "/queue/orders"}, b"from alice")  # allowed user
    carol = secured.raw("carol")
    headers = refused(carol, "SEND", {"destination": "/queue/orders"})
    assert headers["status"] == "403"
    assert headers["message"] == "user carol may not produce to /queue/orders"
    assert headers["destination"] == "/queue/orders"
    assert "queue.orders.produce.allow.user=carol" in headers["detail"]
    accepted(carol, "SEND", {"destination": "/topic/news"}, b"ok")  # the connection stayed


def test_consume_allowed_by_group_and_forbidden_otherwise(secured: Secured) -> None:
    accepted(secured.raw("alice"), "SEND", {"destination": "/queue/orders"}, b"for readers")
    bob = secured.raw("bob")  # in readers (who may not create queues: alice made this one)
    accepted(bob, "SUBSCRIBE", {"destination": "/queue/orders", "id": "s1", "ack": "auto"})
    assert bob.receive()[0].body == b"for readers"
    alice = secured.raw("alice")  # not in readers
    headers = refused(alice, "SUBSCRIBE", {"destination": "/queue/orders", "id": "s1"})
    assert headers["message"] == "user alice may not consume from /queue/orders"
    # A durable subscription consumes too.
    accepted(secured.raw("alice"), "SEND", {"destination": "/topic/audit"}, b"creates it")
    durable = {"destination": "/topic/audit", "id": "d1", "durable-subscription-name": "d"}
    bob_app = secured.raw("bob", client_id="bob-app")
    assert refused(bob_app, "SUBSCRIBE", durable)["message"] == (
        "user bob may not consume from /topic/audit"
    )
    accepted(secured.raw("carol", client_id="carol-app"), "SUBSCRIBE", durable)


def test_browse_is_its_own_right(secured: Secured) -> None:
    accepted(secured.raw("alice"), "SEND", {"destination": "/queue/orders"}, b"m")
    browse = {"destination": "/queue/orders", "id": "b1", "browser": "true"}
    alice = secured.raw("alice")
    accepted(alice, "SUBSCRIBE", browse)
    assert alice.receive()[0].body == b"m"
    bob = secured.raw("bob")  # may consume, may not browse
    assert refused(bob, "SUBSCRIBE", browse)["message"] == "user bob may not browse /queue/orders"


def test_auto_creating_needs_the_create_right(secured: Secured) -> None:
    bob = secured.raw("bob")  # may produce to /queue/scratch, may not create queues
    headers = refused(bob, "SEND", {"destination": "/queue/scratch"})
    assert headers["message"] == "user bob may not create /queue/scratch"
    assert "queue.create.allow.user=bob" in headers["detail"]
    core = secured.broker.broker
    assert core is not None
    scratch = DestinationName(DestinationKind.QUEUE, "scratch")
    assert secured.broker.call(lambda: core.registry.get(scratch)) is None
    accepted(secured.raw("alice"), "SEND", {"destination": "/queue/scratch"}, b"made")
    accepted(bob, "SEND", {"destination": "/queue/scratch"}, b"exists now")
    # Subscribing to a new destination creates it too.
    carol = secured.raw("carol")  # in readers: may consume any queue, may not create one
    sub = {"destination": "/queue/fresh", "id": "s1"}
    assert refused(carol, "SUBSCRIBE", sub)["message"] == "user carol may not create /queue/fresh"
    accepted(carol, "SUBSCRIBE", {"destination": "/topic/fresh", "id": "s2"})  # writers: topics


def test_a_user_deny_beats_a_group_allow(secured: Secured) -> None:
    mallory = secured.raw("mallory")  # in writers, who may produce to every topic
    accepted(mallory, "SEND", {"destination": "/topic/news"}, b"fine")
    headers = refused(mallory, "SEND", {"destination": "/topic/prices"})
    assert headers["message"] == "user mallory may not produce to /topic/prices"
    accepted(secured.raw("alice"), "SEND", {"destination": "/topic/prices"}, b"alice may")


def test_the_dead_message_queue_follows_the_rules(secured: Secured) -> None:
    dmq = {"destination": "/queue/mq.sys.dmq", "id": "dmq"}
    accepted(secured.raw("carol"), "SUBSCRIBE", dmq)
    bob = secured.raw("bob")  # in readers, but denied the DMQ by name
    assert refused(bob, "SUBSCRIBE", dmq)["message"] == (
        "user bob may not consume from /queue/mq.sys.dmq"
    )


def test_without_failed_receipts_a_refusal_is_an_error_that_closes(secured: Secured) -> None:
    client = RawClient(secured.port)
    client.connect(login="carol", passcode=USERS["carol"][0])
    client.send("SEND", {"destination": "/queue/orders", "receipt": "r1"}, b"x")
    error = client.expect("ERROR")
    assert (error.headers["status"], error.headers["receipt-id"]) == ("403", "r1")
    assert error.headers["message"] == "user carol may not produce to /queue/orders"
    client.expect_closed()
    client.close()


def test_refusals_are_logged_at_warning(secured: Secured, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway")
    refused(secured.raw("mallory"), "SEND", {"destination": "/topic/prices"})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "user mallory may not produce to /topic/prices: "
        "topic.prices.produce.deny.user=mallory (line 11 of " in message
        for message in warnings
    ), warnings


def test_a_changed_file_takes_effect_without_a_restart(secured: Secured) -> None:
    alice = secured.raw("alice")
    accepted(alice, "SEND", {"destination": "/queue/orders"}, b"before")
    secured.access_file.write_text(
        secured.access_file.read_text() + "queue.orders.produce.deny.user=alice\n"
    )

    def alice_refused() -> bool:
        return "status" in attempt(alice, "SEND", {"destination": "/queue/orders"}, b"after")

    wait_until(alice_refused)  # the file is looked at about once a second
    topic = {"destination": "/topic/t"}  # writers may produce to topics
    # An invalid file refuses everything (and the log says why) until it is fixed.
    secured.access_file.write_text("queue.orders.produce.allow.user=alice\nqueue.x.eat.y=z\n")
    wait_until(lambda: "cannot be read" in attempt(alice, "SEND", topic).get("detail", ""))
    secured.access_file.write_text("queue.orders.produce.allow.user=alice\n")
    wait_until(lambda: not alice_refused())


def test_with_access_control_off_every_user_may_do_everything(
    secured_factory: SecuredFactory,
) -> None:
    secured = secured_factory(**{"imq.accesscontrol.enabled": "false"})
    eve = secured.raw("eve")  # the rules file would refuse eve everything
    accepted(eve, "SUBSCRIBE", {"destination": "/queue/anything", "id": "s"})
    accepted(eve, "SEND", {"destination": "/queue/anything"}, b"x")
    assert eve.receive()[0].body == b"x"
    assert secured.refused_connect(login="eve", passcode="wrong")["status"] == "401"


def test_without_a_rules_file_the_default_rules_apply(secured_factory: SecuredFactory) -> None:
    secured = secured_factory(rules=None)
    eve = secured.raw("eve")
    accepted(eve, "SUBSCRIBE", {"destination": "/queue/any", "id": "s", "ack": "auto"})
    accepted(eve, "SEND", {"destination": "/queue/any"}, b"x")
    accepted(eve, "SUBSCRIBE", {"destination": "/queue/any", "id": "b", "browser": "true"})
    accepted(eve, "SEND", {"destination": "/topic/any"}, b"y")
    assert len(eve.receive(2)) == 2


def test_an_empty_users_file_refuses_everyone(
    make_broker: BrokerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = make_broker(
        {
            "imq.authentication.enabled": "true",
            "imq.user_repository.file.filename": str(tmp_path / "none"),
        }
    )
    client = RawClient(broker.port)
    client.send("CONNECT", {"accept-version": "1.2", "login": "root", "passcode": "x"})
    assert client.expect("ERROR").headers["message"] == WRONG
    client.close()
    assert "has no users" in caplog.text
