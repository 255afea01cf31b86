"""The pipeline client over TLS, against a broker serving STOMP over TLS with a certificate of a
CA made for the test: what it trusts, the host name check, a plain port mistaken for the TLS
one, and failover across a restart of the broker on its TLS port."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.client.tls import TlsError, TlsSettings
from sluiceway.errors import ConfigError, ConnectionClosedError
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.cli.support import free_port
from tests.e2e.support import wait_until
from tests.server import conftest as server

WAIT: Final = 5.0  # seconds: the client's timeout for any one answer
START: Final = 20.0  # seconds for a broker process to start
FAILOVER: Final = 30.0  # seconds the client keeps trying across a restart
QUEUE: Final = "/queue/tls"

tls_files = server.tls_files  # the test CA, and the broker's certificate for 127.0.0.1


def tls_port(broker: BrokerThread) -> int:
    assert broker.services is not None
    return broker.services.addresses()["stomp-tls"][1]


def serving(files: server.TlsFiles) -> BrokerThread:
    return BrokerThread(files.properties({"imq.stomp.tls.port": "0"}))


@pytest.fixture
def broker(tls_files: server.TlsFiles) -> Iterator[BrokerThread]:
    with serving(tls_files) as running:
        yield running


def settings(port: int, tls: TlsSettings | None, failover: float = 0.0) -> PipelineSettings:
    return PipelineSettings(port=port, timeout=WAIT, tls=tls, failover=failover)


def test_a_connection_trusting_the_brokers_ca_sends_and_reads_over_tls(
    broker: BrokerThread, tls_files: server.TlsFiles
) -> None:
    trusted = TlsSettings(ca_file=str(tls_files.ca_file))
    with PipelineConnection(settings(tls_port(broker), trusted)) as connection:
        assert connection.send_many(OutgoingMessage(QUEUE, b"m%d" % i) for i in range(3)) == 3
        assert [m.body for m in connection.read_range(QUEUE, 0, None)] == [b"m0", b"m1", b"m2"]
    # The port speaks TLS only: the same client without TLS is turned away.
    with (
        PipelineConnection(settings(tls_port(broker), None)) as plain,
        pytest.raises(ConnectionClosedError),
    ):
        plain.head(QUEUE)


def test_a_certificate_of_a_ca_not_trusted_is_refused_at_once_saying_what_to_trust(
    broker: BrokerThread,
) -> None:
    # The system's CAs do not know the test's: failing over could not help, so none is tried.
    connection = PipelineConnection(settings(tls_port(broker), TlsSettings(), failover=FAILOVER))
    started = time.monotonic()
    with pytest.raises(TlsError) as refused:
        connection.head(QUEUE)
    assert time.monotonic() - started < FAILOVER / 2
    message = str(refused.value)
    assert f"127.0.0.1:{tls_port(broker)}" in message
    assert "unable to get local issuer certificate" in message
    assert "tlsCaFile" in message


def test_the_host_name_is_checked_unless_turned_off(
    tls_files: server.TlsFiles, tmp_path: Path
) -> None:
    # A certificate for another name, from the same CA.
    other = tls_files.ca.issue_cert("broker.example")
    certfile, keyfile = tmp_path / "other.pem", tmp_path / "other.key"
    certfile.write_bytes(b"".join(blob.bytes() for blob in other.cert_chain_pems))
    other.private_key_pem.write_to_path(str(keyfile))
    files = server.TlsFiles(tls_files.ca, tls_files.ca_file, certfile, keyfile)
    ca_file = str(tls_files.ca_file)
    with serving(files) as broker:
        checked = PipelineConnection(settings(tls_port(broker), TlsSettings(ca_file=ca_file)))
        with pytest.raises(TlsError, match=r"not valid for '127\.0\.0\.1'") as refused:
            checked.head(QUEUE)
        assert "connect to a name the certificate holds" in str(refused.value)
        unchecked = TlsSettings(ca_file=ca_file, check_hostname=False)
        with PipelineConnection(settings(tls_port(broker), unchecked)) as connection:
            assert connection.head(QUEUE).message_count == 0


def test_tls_to_the_plain_port_is_refused_naming_the_tls_port(
    broker: BrokerThread, tls_files: server.TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    trusted = TlsSettings(ca_file=str(tls_files.ca_file))
    connection = PipelineConnection(settings(broker.port, trusted, failover=FAILOVER))
    with pytest.raises(TlsError, match=r"imq\.stomp\.tls\.port") as refused:
        connection.head(QUEUE)
    assert "does not answer as a TLS service" in str(refused.value)
    # The broker ends that connection quietly: the peer is gone before it can say why.
    services = broker.services
    assert services is not None
    wait_until(lambda: broker.call(lambda: services.connection_count) == 0, WAIT)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_ca_file_that_cannot_be_read_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = PipelineConnection(settings(1, TlsSettings(ca_file=str(tmp_path / "none.pem"))))
    with pytest.raises(ConfigError, match="cannot read ca_file") as unreadable:
        missing.connect()
    assert unreadable.value.name == "ca_file"
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="holds no CA certificate"):
        PipelineConnection(settings(1, TlsSettings(ca_file=str(junk)))).connect()


@pytest.mark.timeout(120)
def test_operations_fail_over_across_a_restart_on_the_tls_port(
    tls_files: server.TlsFiles, tmp_path: Path
) -> None:
    port = free_port()
    arguments = [
        "-D",
        f"imq.stomp.tls.port={port}",
        "-D",
        f"imq.tls.certfile={tls_files.certfile}",
        "-D",
        f"imq.tls.keyfile={tls_files.keyfile}",
    ]
    data = str(tmp_path / "data")
    trusted = TlsSettings(ca_file=str(tls_files.ca_file))
    with BrokerProcess(*arguments, data_dir=data, timeout=START) as first:
        connection = PipelineConnection(settings(port, trusted, failover=FAILOVER))
        with connection:
            connection.send_many(OutgoingMessage(QUEUE, b"m%d" % i) for i in range(5))
            first.kill()
            with BrokerProcess(*arguments, port=first.port, data_dir=data, timeout=START):
                # The connection of the killed broker is gone: the read connects anew, over TLS.
                assert [m.body for m in connection.read_lease(QUEUE, "g/1")] == [
                    b"m%d" % i for i in range(5)
                ]
