"""Authentication and access rules through stomp.py and through the project's own client."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import stomp
import stomp.exception

from sluiceway.client import (
    BrokerError,
    Connection,
    ConnectionFactory,
    Forbidden,
    Unauthorized,
)
from sluiceway.client import sync as sync_client
from sluiceway.client.settings import build_settings
from sluiceway.errors import ConfigError
from tests.e2e.stomppy import Recorder, with_receipt
from tests.security.conftest import PASSWORDS, USERS, Secured

Connect = Callable[..., Coroutine[Any, Any, Connection]]
TYPO = "typo-J4v7"  # a wrong password, distinctive enough to look for in logs


# -- stomp.py ---------------------------------------------------------------------------------


def stomppy(secured: Secured, user: str, password: str) -> tuple[Any, Recorder]:
    connection = stomp.Connection12([("127.0.0.1", secured.port)], auto_content_length=True)
    recorder = Recorder()
    connection.set_listener("recorder", recorder)
    connection.connect(user, password, wait=True, headers={"failed-receipts": "true"})
    return connection, recorder


def test_stomppy_with_a_wrong_password_gets_401(secured: Secured) -> None:
    connection = stomp.Connection12([("127.0.0.1", secured.port)], auto_content_length=True)
    recorder = Recorder()
    connection.set_listener("recorder", recorder)
    with pytest.raises(stomp.exception.ConnectFailedException):
        connection.connect("bob", TYPO, wait=True)
    recorder.wait_for(lambda: bool(recorder.errors))
    error = recorder.errors[0]
    assert (error.headers["status"], error.headers["message"]) == (
        "401",
        "wrong user name or password",
    )


def test_stomppy_allowed_and_forbidden(secured: Secured) -> None:
    alice, alice_seen = stomppy(secured, "alice", USERS["alice"][0])
    carol, carol_seen = stomppy(secured, "carol", USERS["carol"][0])
    try:
        ok = with_receipt(
            alice_seen,
            lambda r: alice.send("/queue/orders", "from alice", headers={"receipt": r}),
        )
        assert "status" not in ok
        refusal = with_receipt(
            carol_seen,
            lambda r: carol.send("/queue/orders", "from carol", headers={"receipt": r}),
        )
        assert (refusal["status"], refusal["message"]) == (
            "403",
            "user carol may not produce to /queue/orders",
        )
        # carol is in readers: she may consume what alice sent.
        with_receipt(
            carol_seen,
            lambda r: carol.subscribe("/queue/orders", id="s1", headers={"receipt": r}),
        )
        assert carol_seen.wait_messages(1)[0].body == "from alice"
    finally:
        alice.disconnect()
        carol.disconnect()


# -- the project's client ---------------------------------------------------------------------


@pytest.fixture
async def connect(secured: Secured) -> AsyncIterator[Connect]:
    opened: list[Connection] = []

    async def open_connection(**keywords: Any) -> Connection:
        factory = ConnectionFactory(f"stomp://127.0.0.1:{secured.port}", **keywords)
        connection = await factory.connect()
        opened.append(connection)
        return connection

    yield open_connection
    for connection in opened:
        await connection.close()


async def test_client_wrong_password_raises_unauthorized(
    secured: Secured, connect: Connect
) -> None:
    with pytest.raises(Unauthorized) as caught:
        await connect(username="bob", password=TYPO)
    error = caught.value
    assert error.summary == "wrong user name or password"
    assert str(error).startswith(f"the broker at 127.0.0.1:{secured.port} refused user 'bob': ")
    assert TYPO not in str(error)
    with pytest.raises(Unauthorized, match="without a user name: no credentials"):
        await connect()


async def test_client_user_the_rules_refuse_raises_forbidden(connect: Connect) -> None:
    with pytest.raises(Forbidden, match="user eve may not connect"):
        await connect(username="eve", password=USERS["eve"][0])


async def test_client_credentials_from_open_mq_attributes(connect: Connect) -> None:
    connection = await connect(
        properties={"imqDefaultUsername": "bob", "imqDefaultPassword": USERS["bob"][0]}
    )
    assert connection.connected


async def test_client_forbidden_operations_raise_and_the_connection_stays(
    connect: Connect,
) -> None:
    carol = await connect(username="carol", password=USERS["carol"][0])
    session = carol.session()
    with pytest.raises(Forbidden) as caught:
        await session.producer("/queue/orders").send(b"not allowed")
    assert caught.value.summary == "user carol may not produce to /queue/orders"
    assert caught.value.destination == "/queue/orders"
    with pytest.raises(Forbidden, match="user carol may not create /queue/brand-new"):
        await session.consumer("/queue/brand-new")

    alice = await connect(username="alice", password=USERS["alice"][0])
    await alice.session().producer("/queue/orders").send(b"allowed")
    consumer = await session.consumer("/queue/orders")  # carol is in readers
    message = await consumer.receive(timeout=5.0)
    assert message is not None
    assert message.body == b"allowed"
    with pytest.raises(Forbidden, match="user carol may not browse /queue/orders"):
        await (await session.browser("/queue/orders")).messages()
    assert carol.connected


def test_sync_client_raises_the_same_errors(secured: Secured) -> None:
    address = f"stomp://127.0.0.1:{secured.port}"
    with pytest.raises(Unauthorized):
        sync_client.ConnectionFactory(address, username="bob", password=TYPO).connect()
    factory = sync_client.ConnectionFactory(address, username="bob", password=USERS["bob"][0])
    with factory.connect() as connection:
        assert not connection.closed


def test_the_password_is_never_shown() -> None:
    typed = USERS["bob"][0]
    settings = build_settings(username="bob", password=typed)
    assert typed not in repr(settings)
    assert "username='bob'" in repr(settings)
    factory = ConnectionFactory(username="bob", password=typed)
    assert typed not in repr(factory.settings)
    for bad in ({"password": typed + "\n"}, {"password": typed.encode()}):
        with pytest.raises(ConfigError) as caught:
            build_settings(**bad)
        assert typed not in str(caught.value)
        assert "(hidden)" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        build_settings(properties={"imqDefaultPassword": typed + "\r"})
    assert typed not in str(caught.value)
    assert "line feeds or carriage returns" in str(caught.value)


async def test_client_logs_no_password(
    secured: Secured, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(BrokerError):
        await connect(username="alice", password=TYPO)
    connection = await connect(username="alice", password=USERS["alice"][0])
    await connection.session().producer("/queue/orders").send(b"x")
    await connection.close()
    for typed in (*PASSWORDS, TYPO):
        assert typed not in caplog.text
