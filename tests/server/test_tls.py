"""STOMP over TLS and the admin endpoint over HTTPS, with a certificate made by the test.

The broker serves a certificate for 127.0.0.1 issued by a throwaway CA (trustme); clients that
trust that CA get through, clients that do not fail the handshake, and a broker whose certificate
is missing or broken refuses to start with an error naming the property to fix.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
import trustme
from cryptography.hazmat.primitives import serialization

from sluiceway.app.services import Services
from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.errors import ConfigError
from sluiceway.server.tls import server_context
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import ConnectionClosed, RawClient
from tests.e2e.stomppy import Recorder, connect, subscribe, sync, with_receipt
from tests.server.conftest import TlsFiles

TIMEOUT = 5.0


@pytest.fixture
def tls_broker(make_broker: BrokerFactory, tls_files: TlsFiles) -> BrokerThread:
    return make_broker(tls_files.properties({"imq.stomp.tls.port": "0", "imq.admin.tls": "true"}))


def tls_port(broker: BrokerThread) -> int:
    assert broker.services is not None
    return broker.services.addresses()["stomp-tls"][1]


def tls_raw_client(port: int, context: ssl.SSLContext) -> RawClient:
    """A RawClient whose socket is wrapped in TLS (the handshake happens here)."""
    client = RawClient(port)
    try:
        client.sock = context.wrap_socket(client.sock, server_hostname="127.0.0.1")
    except BaseException:
        client.close()
        raise
    return client


@pytest.fixture
def stomp_tls(tls_broker: BrokerThread, tls_files: TlsFiles) -> Iterator[tuple[Any, Recorder]]:
    """stomp.py over TLS, trusting the test CA."""
    port = tls_port(tls_broker)
    connection = stomp.Connection12([("127.0.0.1", port)], auto_content_length=True)
    connection.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(tls_files.ca_file))
    recorder = Recorder()
    connection.set_listener("recorder", recorder)
    connection.connect(wait=True)
    yield connection, recorder
    if connection.is_connected():
        connection.disconnect()


def test_stomp_py_over_tls_exchanges_messages_with_a_plain_client(
    tls_broker: BrokerThread, stomp_tls: tuple[Any, Recorder]
) -> None:
    secure, secure_recorder = stomp_tls
    plain, plain_recorder = connect(tls_broker.port)
    try:
        subscribe(secure, secure_recorder, "/queue/to-tls", "s1", ack="auto")
        subscribe(plain, plain_recorder, "/topic/to-tcp", "s2", ack="auto")
        sync(plain, plain_recorder)  # the topic subscription is in place before anyone sends
        with_receipt(plain_recorder, lambda r: plain.send("/queue/to-tls", "over tcp", receipt=r))
        with_receipt(secure_recorder, lambda r: secure.send("/topic/to-tcp", "über tls", receipt=r))
        (into_tls,) = secure_recorder.wait_messages(1, TIMEOUT)
        (into_tcp,) = plain_recorder.wait_messages(1, TIMEOUT)
        assert into_tls.body == "over tcp"
        assert into_tcp.body == "über tls"
        services = tls_broker.services
        assert services is not None
        carried = tls_broker.call(lambda: sorted(i.service for i in services.connections()))
        assert carried == ["stomp", "stomp-tls"]
    finally:
        plain.disconnect()


def test_raw_tls_socket_round_trip_with_receipts_and_acks(
    tls_broker: BrokerThread, tls_files: TlsFiles
) -> None:
    client = tls_raw_client(tls_port(tls_broker), tls_files.client_context())
    try:
        assert isinstance(client.sock, ssl.SSLSocket)
        assert client.sock.version() in {"TLSv1.2", "TLSv1.3"}
        client.connect()
        client.subscribe("/queue/raw-tls")  # client-individual
        body = bytes(range(256)) * 64  # binary, NULs included: content-length over TLS
        client.request("SEND", {"destination": "/queue/raw-tls"}, body)
        (message,) = client.receive(1)
        assert message.body == body
        client.ack(message)
        client.request("DISCONNECT")
        client.expect_closed()
    finally:
        client.close()
    # Acknowledged over TLS: nothing is left on the queue for the next consumer.
    after = RawClient(tls_broker.port)
    try:
        after.connect()
        after.subscribe("/queue/raw-tls")
        after.sync()
        assert after.drain() == []
    finally:
        after.close()


def test_https_admin_endpoint_with_the_ca(tls_broker: BrokerThread, tls_files: TlsFiles) -> None:
    url = f"https://127.0.0.1:{tls_broker.admin_port}/api/v1/broker"
    with urllib.request.urlopen(url, context=tls_files.client_context(), timeout=TIMEOUT) as r:
        assert r.status == 200
        body = json.loads(r.read())
    assert set(body["services"]) >= {"stomp", "stomp-tls", "admin"}


def test_clients_that_do_not_trust_the_ca_fail_the_handshake(tls_broker: BrokerThread) -> None:
    other = ssl.create_default_context()
    trustme.CA().configure_trust(other)  # trusts some CA, not the broker's
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_raw_client(tls_port(tls_broker), other)
    url = f"https://127.0.0.1:{tls_broker.admin_port}/api/v1/broker"
    with pytest.raises(urllib.error.URLError) as failure:
        urllib.request.urlopen(url, context=other, timeout=TIMEOUT)
    assert isinstance(failure.value.reason, ssl.SSLCertVerificationError)


def test_plain_stomp_on_the_tls_port_is_refused(tls_broker: BrokerThread) -> None:
    client = RawClient(tls_port(tls_broker))
    try:
        client.send("CONNECT", {"accept-version": "1.2", "host": "localhost"})
        with pytest.raises((ConnectionClosed, ConnectionResetError)):
            client.expect("CONNECTED")
    finally:
        client.close()


# -- refusing to start ----------------------------------------------------------------------------


def encrypted_key(tls_files: TlsFiles, path: Path) -> Path:
    key = serialization.load_pem_private_key(tls_files.keyfile.read_bytes(), password=None)
    encryption = serialization.BestAvailableEncryption(b"secret")
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return path


def broken_files(case: str, tls_files: TlsFiles, tmp: Path) -> tuple[dict[str, str], str, str]:
    """(TLS properties, the property the error must name, a phrase it must contain)."""
    cert, key = str(tls_files.certfile), str(tls_files.keyfile)
    garbage = tmp / "garbage.pem"
    garbage.write_text("not a certificate\n")
    corrupt = tmp / "corrupt.pem"
    corrupt.write_text(
        tls_files.certfile.read_text().replace("\n", "\n!!", 2)  # inside the base64
    )
    other_key = tmp / "other.key"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    cases = {
        "no certfile": ({}, "imq.tls.certfile", "is not set"),
        "missing certfile": (
            {"imq.tls.certfile": str(tmp / "missing.pem"), "imq.tls.keyfile": key},
            "imq.tls.certfile",
            "No such file",
        ),
        "certfile is a directory": (
            {"imq.tls.certfile": str(tmp), "imq.tls.keyfile": key},
            "imq.tls.certfile",
            "cannot read",
        ),
        "certfile not PEM": (
            {"imq.tls.certfile": str(garbage), "imq.tls.keyfile": key},
            "imq.tls.certfile",
            "no PEM certificate",
        ),
        "certfile corrupt": (
            {"imq.tls.certfile": str(corrupt), "imq.tls.keyfile": key},
            "imq.tls.certfile",
            "cannot read",
        ),
        "no key anywhere": ({"imq.tls.certfile": cert}, "imq.tls.certfile", "imq.tls.keyfile"),
        "missing keyfile": (
            {"imq.tls.certfile": cert, "imq.tls.keyfile": str(tmp / "missing.key")},
            "imq.tls.keyfile",
            "No such file",
        ),
        "keyfile not PEM": (
            {"imq.tls.certfile": cert, "imq.tls.keyfile": str(garbage)},
            "imq.tls.keyfile",
            "no PEM private key",
        ),
        "key of another certificate": (
            {"imq.tls.certfile": cert, "imq.tls.keyfile": str(other_key)},
            "imq.tls.keyfile",
            "does not belong",
        ),
        "encrypted key": (
            {
                "imq.tls.certfile": cert,
                "imq.tls.keyfile": str(encrypted_key(tls_files, tmp / "encrypted.key")),
            },
            "imq.tls.keyfile",
            "encrypted",
        ),
    }
    return cases[case]


BROKEN_CASES = [
    "no certfile",
    "missing certfile",
    "certfile is a directory",
    "certfile not PEM",
    "certfile corrupt",
    "no key anywhere",
    "missing keyfile",
    "keyfile not PEM",
    "key of another certificate",
    "encrypted key",
]


@pytest.mark.parametrize("case", BROKEN_CASES)
def test_broken_certificate_files_name_the_property(
    case: str, tls_files: TlsFiles, tmp_path: Path
) -> None:
    properties, name, phrase = broken_files(case, tls_files, tmp_path)
    config = build_config({"imq.stomp.tls.port": "0", **properties})
    with pytest.raises(ConfigError) as refused:
        server_context(config)
    assert refused.value.name == name
    assert phrase in str(refused.value)
    assert name in str(refused.value)


def test_the_good_files_load(tls_files: TlsFiles) -> None:
    config = build_config(tls_files.properties({"imq.stomp.tls.port": "0"}))
    assert server_context(config).minimum_version is ssl.TLSVersion.TLSv1_2


def test_key_in_the_certfile_is_enough(tls_files: TlsFiles, tmp_path: Path) -> None:
    both = tmp_path / "both.pem"
    both.write_bytes(tls_files.keyfile.read_bytes() + tls_files.certfile.read_bytes())
    server_context(build_config({"imq.tls.certfile": str(both)}))


@pytest.mark.parametrize(
    "service",
    [
        {"imq.stomp.tls.port": "0"},
        {"imq.stomp.ws.port": "0", "imq.stomp.ws.tls": "true"},
        {"imq.admin.http.port": "0", "imq.admin.tls": "true"},
    ],
)
async def test_a_tls_service_without_certificate_stops_the_start(service: dict[str, str]) -> None:
    values = {"imq.stomp.tcp.port": "0", "imq.admin.http.port": "-1", **service}
    services = Services(Broker(build_config(values)))
    with pytest.raises(ConfigError) as refused:
        await services.start()
    assert refused.value.name == "imq.tls.certfile"
    # Refused before anything was bound: no listener but the unstarted plain one, no admin.
    assert services.listeners == [services.stomp]
    assert services.admin is None


def test_the_broker_command_refuses_to_start_without_a_certificate() -> None:
    with pytest.raises(RuntimeError, match=r"imq\.tls\.certfile is not set"):
        BrokerProcess("-D", "imq.stomp.tls.port=0")


def test_a_socket_closed_during_the_handshake_leaves_the_broker_serving(
    tls_broker: BrokerThread, tls_files: TlsFiles
) -> None:
    with socket.create_connection(("127.0.0.1", tls_port(tls_broker)), timeout=TIMEOUT) as sock:
        sock.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
    client = tls_raw_client(tls_port(tls_broker), tls_files.client_context())
    try:
        client.connect()
    finally:
        client.close()
