"""The asyncio client (and the synchronous one on top of it) over TLS, against a broker serving
STOMP over TLS with a certificate of a CA made for the test: what it trusts, the host name check,
a plain port mistaken for the TLS one, and how the settings say TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from sluiceway.client import AckMode, ConnectionFactory
from sluiceway.client import sync as blocking
from sluiceway.client.tls import TlsError, TlsSettings
from sluiceway.errors import ConfigError, ConnectFailedError
from sluiceway.testing import BrokerThread
from tests.client.test_pipeline_tls import serving, tls_port
from tests.server import conftest as server

WAIT: Final = 5.0  # seconds: the client's timeout for any one answer
QUEUE: Final = "/queue/tls"

tls_files = server.tls_files  # the test CA, and the broker's certificate for 127.0.0.1


@pytest.fixture
def broker(tls_files: server.TlsFiles) -> Iterator[BrokerThread]:
    with serving(tls_files) as running:
        yield running


def trusting(files: server.TlsFiles, *, check_hostname: bool = True) -> TlsSettings:
    return TlsSettings(ca_file=str(files.ca_file), check_hostname=check_hostname)


async def test_a_connection_trusting_the_brokers_ca_sends_and_receives_over_tls(
    broker: BrokerThread, tls_files: server.TlsFiles
) -> None:
    address = f"ssl://127.0.0.1:{tls_port(broker)}"
    factory = ConnectionFactory(address, tls=trusting(tls_files), ack_timeout=WAIT)
    async with await factory.connect() as connection:
        session = connection.session(AckMode.AUTO)
        await session.producer(QUEUE).send(b"over tls")
        consumer = await session.consumer(QUEUE)
        message = await consumer.receive(timeout=WAIT)
        assert message is not None
        assert message.body == b"over tls"
    # The port speaks TLS only: the same client over plain TCP is turned away.
    plain = ConnectionFactory(f"127.0.0.1:{tls_port(broker)}", ack_timeout=WAIT)
    with pytest.raises(ConnectFailedError):
        await plain.connect()


def test_the_synchronous_client_takes_the_same_tls_settings(
    broker: BrokerThread, tls_files: server.TlsFiles
) -> None:
    # A bare HOST:PORT speaks TLS when `tls` is given.
    factory = blocking.ConnectionFactory(
        f"127.0.0.1:{tls_port(broker)}", tls=trusting(tls_files), ack_timeout=WAIT
    )
    with factory.connect() as connection:
        session = connection.session(AckMode.AUTO)
        session.producer(QUEUE).send(b"blocking")
        message = session.consumer(QUEUE).receive(timeout=WAIT)
        assert message is not None
        assert message.body == b"blocking"


async def test_a_certificate_of_a_ca_not_trusted_is_refused_at_once_saying_what_to_trust(
    broker: BrokerThread,
) -> None:
    # ssl:// alone trusts the system's CAs, which do not know the test's. Two passes over the
    # list would be tried for a broker that did not answer: none is, since none could help.
    factory = ConnectionFactory(
        f"ssl://127.0.0.1:{tls_port(broker)}", address_list_iterations=2, ack_timeout=WAIT
    )
    assert factory.settings.tls == TlsSettings()
    with pytest.raises(TlsError) as refused:
        await factory.connect()
    message = str(refused.value)
    assert f"127.0.0.1:{tls_port(broker)}" in message
    assert "unable to get local issuer certificate" in message
    assert "ca_file" in message


async def test_the_host_name_is_checked_unless_turned_off(
    tls_files: server.TlsFiles, tmp_path: Path
) -> None:
    # A certificate for another name, from the same CA.
    other = tls_files.ca.issue_cert("broker.example")
    certfile, keyfile = tmp_path / "other.pem", tmp_path / "other.key"
    certfile.write_bytes(b"".join(blob.bytes() for blob in other.cert_chain_pems))
    other.private_key_pem.write_to_path(str(keyfile))
    files = server.TlsFiles(tls_files.ca, tls_files.ca_file, certfile, keyfile)
    with serving(files) as broker:
        address = f"ssl://127.0.0.1:{tls_port(broker)}"
        checked = ConnectionFactory(address, tls=trusting(files), ack_timeout=WAIT)
        with pytest.raises(TlsError, match=r"not valid for '127\.0\.0\.1'") as refused:
            await checked.connect()
        assert "connect to a name the certificate holds" in str(refused.value)
        unchecked = trusting(files, check_hostname=False)
        factory = ConnectionFactory(address, tls=unchecked, ack_timeout=WAIT)
        async with await factory.connect() as connection:
            assert connection.connected


async def test_tls_to_the_plain_port_is_refused_naming_the_tls_port(
    broker: BrokerThread, tls_files: server.TlsFiles
) -> None:
    factory = ConnectionFactory(
        f"ssl://127.0.0.1:{broker.port}", tls=trusting(tls_files), ack_timeout=WAIT
    )
    with pytest.raises(TlsError, match=r"imq\.stomp\.tls\.port") as refused:
        await factory.connect()
    assert "does not answer as a TLS service" in str(refused.value)


async def test_a_ca_file_that_cannot_be_read_is_a_config_error_naming_it(tmp_path: Path) -> None:
    factory = ConnectionFactory("ssl://127.0.0.1:1", tls=TlsSettings(str(tmp_path / "none.pem")))
    with pytest.raises(ConfigError, match="cannot read ca_file") as unreadable:
        await factory.connect()
    assert unreadable.value.name == "ca_file"


def test_the_scheme_and_the_tls_keyword_agree_or_raise_naming_what_to_give() -> None:
    trusted = TlsSettings(ca_file="ca.pem")
    assert ConnectionFactory("ssl://h:1", tls=trusted).settings.tls == trusted
    assert ConnectionFactory("stomp+ssl://h:1").settings.tls == TlsSettings()
    assert ConnectionFactory("h:1").settings.tls is None
    from_file = ConnectionFactory(properties={"imqAddressList": "ssl://h:1,ssl://g:2"}).settings
    assert (from_file.addresses, from_file.tls) == ((("h", 1), ("g", 2)), TlsSettings())
    with pytest.raises(ConfigError, match="with stomp:// addresses") as plain:
        ConnectionFactory("stomp://h:1", tls=trusted)
    assert plain.value.name == "tls"
    with pytest.raises(ConfigError, match="no default port") as unaddressed:
        ConnectionFactory(tls=trusted)
    assert unaddressed.value.name == "addresses"
    with pytest.raises(ConfigError, match="accepted: a TlsSettings") as wrong:
        ConnectionFactory("ssl://h:1", tls="ca.pem")
    assert wrong.value.name == "tls"
