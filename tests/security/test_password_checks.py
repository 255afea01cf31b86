"""Password checks off the event loop, as a STOMP session and the admin endpoint use them, over
real sockets (the rows of PASSWORD_CASES in test_hardening.py cover the headline cases)."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from sluiceway.security.logins import LoginCounts
from tests.admin.adminhttp import AdminHttp
from tests.e2e.rawclient import RawClient
from tests.e2e.support import connection_infos, wait_connection_count, wait_until
from tests.security.conftest import PASSWORDS, USERS, SecuredFactory
from tests.security.logins_support import PATIENT_S, counts, pending, timed_refusal
from tests.server.wsclient import WsStomp

NOTHING_PENDING = (0, 0, 0)
# Failures from 127.0.0.1 held back a minute: long enough to look at a connection meanwhile.
HELD = {"imq.authentication.delay.base": "60000", "imq.authentication.delay.max": "60000"}
# Held back long enough to look at, short enough to wait for.
SHORTLY_HELD = {"imq.authentication.delay.base": "1000", "imq.authentication.delay.max": "1000"}


def test_frames_behind_a_connect_wait_for_its_check_then_run_in_order(
    secured_factory: SecuredFactory,
) -> None:
    secured = secured_factory()
    client = secured.raw(connect=False)
    frames = [
        b"CONNECT\naccept-version:1.2\nlogin:alice\npasscode:%s\n\n\0" % USERS["alice"][0].encode(),
        b"SUBSCRIBE\ndestination:/topic/news\nid:s1\nreceipt:r1\n\n\0",
        b"SEND\ndestination:/topic/news\nreceipt:r2\n\nbehind the CONNECT\0",
    ]
    client.send_bytes(b"".join(frames))  # one write: they arrive together
    assert client.expect("CONNECTED").headers["version"] == "1.2"
    assert client.expect("RECEIPT").headers["receipt-id"] == "r1"
    assert client.expect("RECEIPT").headers["receipt-id"] == "r2"
    assert client.receive()[0].body == b"behind the CONNECT"


def test_frames_behind_a_refused_connect_are_never_run(secured_factory: SecuredFactory) -> None:
    secured = secured_factory()
    listener = secured.raw("carol")
    listener.subscribe("/topic/news")
    client = secured.raw(connect=False)
    client.send_bytes(
        b"CONNECT\naccept-version:1.2\nlogin:alice\npasscode:wrong\n\n\0"
        b"SEND\ndestination:/topic/news\n\nmust not arrive\0"
    )
    assert client.expect("ERROR").headers["status"] == "401"
    client.expect_closed()
    listener.sync()
    assert listener.drain() == []


def test_a_connection_reads_nothing_while_its_answer_is_held(
    secured_factory: SecuredFactory,
) -> None:
    """Its reading paused, the broker does not see the client go: it lets the connection go
    once the answer is written, and nothing of it is left."""
    secured = secured_factory(**SHORTLY_HELD)
    broker = secured.broker
    client = secured.raw(connect=False)
    client.send("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "wrong"})
    wait_until(lambda: pending(broker) == (0, 0, 1), PATIENT_S)
    (info,) = connection_infos(broker)
    assert (info.state, info.reading_paused) == ("authenticating", True)
    client.close()
    wait_connection_count(broker, 0, PATIENT_S)
    assert pending(broker) == NOTHING_PENDING


def test_connections_closed_during_their_checks_leave_nothing(
    secured_factory: SecuredFactory,
) -> None:
    secured = secured_factory(
        **{"imq.authentication.workers": "1", "imq.authentication.delay.base": "0"}
    )
    broker = secured.broker
    clients: list[RawClient] = []
    try:
        for _ in range(12):
            clients.append(RawClient(secured.port))
            clients[-1].send("CONNECT", {"accept-version": "1.2", "login": "bob", "passcode": "x"})
    finally:
        for client in clients:
            client.close()
    wait_connection_count(broker, 0, PATIENT_S)
    wait_until(lambda: pending(broker) == NOTHING_PENDING, PATIENT_S)
    # A right password still gets in, and no answer was left for anyone.
    secured.raw("alice").sync()
    assert pending(broker) == NOTHING_PENDING


def test_stopping_the_broker_while_an_answer_is_held(secured_factory: SecuredFactory) -> None:
    secured = secured_factory(**HELD)
    client = secured.raw(connect=False)
    client.send("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "wrong"})
    wait_until(lambda: pending(secured.broker) == (0, 0, 1), PATIENT_S)
    secured.broker.stop()
    assert client.expect("ERROR").headers["message"] == "broker shutting down"
    client.expect_closed()


def test_a_success_after_failures_is_held_and_resets_the_address(
    secured_factory: SecuredFactory,
) -> None:
    secured = secured_factory(
        **{"imq.authentication.delay.base": "300", "imq.authentication.delay.max": "300"}
    )
    assert timed_refusal(secured.port, "alice", "wrong")[0] == "401"
    assert counts(secured.broker).addresses == 1
    secured.raw("alice").sync()  # held 300 ms, then CONNECTED
    assert counts(secured.broker).addresses == 0


def test_admin_and_stomp_share_the_cache_and_the_delays(
    secured_factory: SecuredFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sluiceway")
    secured = secured_factory(**{"imq.authentication.delay.base": "1"})
    broker, port = secured.broker, secured.broker.admin_port
    assert timed_refusal(secured.port, "root", "typo-Qa71")[0] == "401"
    assert AdminHttp(port, "root", "typo-Qa71").raw("GET", "/api/v1/broker")[0] == 401
    assert "bad credentials for 'root' (failure 2 in a row from this address" in caplog.text
    assert AdminHttp(port, "root", USERS["root"][0]).raw("GET", "/api/v1/broker")[0] == 200
    assert counts(broker) == LoginCounts(0, 0, 0, cached=1, addresses=0)
    # The web console polls: the same credentials again are answered from the cache.
    for _ in range(3):
        assert AdminHttp(port, "root", USERS["root"][0]).raw("GET", "/api/v1/broker")[0] == 200
    secured.raw("root").sync()  # STOMP too
    assert counts(broker).cached == 1
    for secret in (*PASSWORDS, "typo-Qa71"):
        assert secret not in caplog.text


def test_refusals_say_how_long_they_were_held(
    secured_factory: SecuredFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sluiceway")
    secured = secured_factory(**{"imq.authentication.delay.base": "200"})
    for _ in range(2):
        timed_refusal(secured.port, "nobody", "typo-Rt55")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "wrong user name or password for user 'nobody' (failure 1 in a row from" in text
    assert "(failure 2 in a row from this address, answered after 0.4 s)" in text
    assert "typo-Rt55" not in caplog.text


async def test_a_websocket_connect_is_checked_the_same_way(
    secured_factory: SecuredFactory,
) -> None:
    secured = secured_factory(**{"imq.stomp.ws.port": "0", "imq.authentication.delay.base": "200"})
    services = secured.broker.services
    assert services is not None
    host, port = services.addresses()["ws"]
    url = f"http://{host}:{port}/stomp"
    async with aiohttp.ClientSession() as session:
        refused = await WsStomp.open(session, url, connect=False)
        await refused.send("CONNECT", {"accept-version": "1.2", "login": "bob", "passcode": "no"})
        error = await refused.expect("ERROR", timeout=PATIENT_S)
        assert (error.headers["status"], error.headers["message"]) == (
            "401",
            "wrong user name or password",
        )
        await refused.close()
        client = await WsStomp.open(session, url, connect=False)
        login = {"login": "alice", "passcode": USERS["alice"][0]}
        await client.send("CONNECT", {"accept-version": "1.2", "heart-beat": "0,0", **login})
        await client.send("SUBSCRIBE", {"destination": "/topic/news", "id": "s1", "receipt": "r1"})
        # Answered after the delay its address earned (200 ms): the SUBSCRIBE waits behind it.
        assert (await client.expect("CONNECTED", timeout=PATIENT_S)).command == "CONNECTED"
        assert (await client.expect("RECEIPT")).headers["receipt-id"] == "r1"
        await client.close()
