"""Fixtures for the server tests: a certificate authority and a broker certificate made per test."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme


@dataclass(frozen=True)
class TlsFiles:
    """A test CA, and the broker's certificate for 127.0.0.1 and localhost, in PEM files."""

    ca: trustme.CA
    ca_file: Path  # the CA certificate, for clients that take a file (stomp.py)
    certfile: Path  # imq.tls.certfile: the broker's certificate and its chain
    keyfile: Path  # imq.tls.keyfile

    def properties(self, extra: Mapping[str, str]) -> dict[str, str]:
        """Broker properties serving this certificate, and `extra`."""
        return {
            "imq.tls.certfile": str(self.certfile),
            "imq.tls.keyfile": str(self.keyfile),
            **extra,
        }

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts the test CA (and checks the host name)."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(
        ca=ca,
        ca_file=tmp_path / "ca.pem",
        certfile=tmp_path / "broker.pem",
        keyfile=tmp_path / "broker.key",
    )
    ca.cert_pem.write_to_path(str(files.ca_file))
    files.certfile.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(files.keyfile))
    return files
