"""TLS for the clients: what to trust, kept as a plain value, and the SSL context made from it.

The broker serves STOMP over TLS on `imq.stomp.tls.port` (docs/transports.md), TLS 1.2 or later,
and does not ask clients for a certificate: a client proves who it is with its user name and
password. A client therefore needs only to decide whom it trusts:

- `ca_file`: a PEM file of the CA certificates that may sign the broker's certificate; none: the
  system's CAs. For a self-signed broker certificate, the certificate itself.
- `check_hostname`: the certificate must name the host connected to (on by default). Off, the
  certificate must still be signed by a trusted CA, but may be issued for another name: for test
  set-ups whose certificate names no address the clients use. Nothing turns the certificate's
  check off altogether (as Open MQ's `imqSSLIsHostTrusted` does): a certificate not checked at
  all lets anyone on the path read the passcode.

`TlsSettings` holds file names only, so settings that carry it can be pickled (to Spark's
executors); `client_context` makes the `ssl.SSLContext` where the socket is made.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import Final

from sluiceway.errors import ClientError, ConfigError

# The broker accepts nothing older (server/tls.py): asking for less would only fail later.
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
# What OpenSSL says when the answer to its hello is not TLS (a plain STOMP port answers an ERROR
# frame in clear).
_NOT_TLS: Final = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"}
)
# X509_V_ERR_HOSTNAME_MISMATCH, _EMAIL_MISMATCH, _IP_ADDRESS_MISMATCH (OpenSSL's x509_vfy.h):
# the certificate is for other names or addresses than the one connected to.
_NAME_MISMATCH: Final = frozenset({62, 63, 64})


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Whom a TLS connection trusts. A plain value, safe to pickle."""

    ca_file: str | None = None  # PEM CA certificates to trust; None: the system's
    check_hostname: bool = True  # the certificate must name the host connected to


class TlsError(ClientError):
    """A TLS connection could not be set up, for a reason that trying again cannot fix: the
    broker's certificate was not accepted (not signed by a CA the client trusts, not issued for
    the host connected to, or out of its validity period), or the address does not speak TLS.
    The client's settings, or the broker's certificate, must change."""


def client_context(settings: TlsSettings, ca_name: str = "ca_file") -> ssl.SSLContext:
    """A client-side SSL context for `settings`; ConfigError naming `ca_name` (what the caller
    calls the CA file's setting) when the file cannot be read or holds no certificate."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = MINIMUM_VERSION
    context.check_hostname = settings.check_hostname
    if settings.ca_file is None:
        return context
    name, path = ca_name, settings.ca_file
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:  # (an OSError too, so caught first)
        raise ConfigError(
            name,
            f"{name} {path!r} holds no CA certificate OpenSSL can read ({exc.reason or exc}): "
            "give the PEM file of the CA that signed the broker's certificate (for a "
            "self-signed one, the certificate itself)",
        ) from None
    except OSError as exc:
        raise ConfigError(
            name,
            f"cannot read {name} {path!r}: {exc.strerror or exc}; the file must exist and be "
            "readable wherever a connection is made (for Spark: on the driver and every "
            "executor)",
        ) from None
    return context


def handshake_failed(error: ssl.SSLError, address: str) -> TlsError | None:
    """The TlsError for a failed handshake with `address` that trying again cannot fix; None
    for one that may be passing (a connection reset, say), to be treated as any failed
    connect."""
    if isinstance(error, ssl.SSLCertVerificationError):
        if error.verify_code in _NAME_MISMATCH:
            advice = (
                "connect to a name the certificate holds, or have one issued for this one "
                "(turning the host name check off is for test set-ups only)"
            )
        else:
            advice = (
                "trust the CA that signed it: name its PEM file as the CA file (ca_file; the "
                "Spark option tlsCaFile), for a self-signed certificate the certificate itself"
            )
        reason = (error.verify_message or error.reason or str(error)).rstrip(".")
        return TlsError(
            f"the broker at {address} presented a TLS certificate that was not accepted "
            f"({reason}): {advice}"
        )
    if error.reason in _NOT_TLS:
        return TlsError(
            f"{address} does not answer as a TLS service ({error.reason}): give the port of the "
            "broker's STOMP over TLS (imq.stomp.tls.port), not its plain STOMP port"
        )
    return None


def handshake(context: ssl.SSLContext, sock: socket.socket, host: str, port: int) -> ssl.SSLSocket:
    """`sock`, connected to `host`:`port`, wrapped in TLS: the handshake done within the
    socket's timeout. TlsError when trying again cannot help (`handshake_failed`), else the
    handshake's own error (an OSError); `sock` is closed when the handshake fails."""
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLError as exc:  # (an OSError too, so caught first)
        sock.close()
        refused = handshake_failed(exc, f"{host}:{port}")
        if refused is not None:
            raise refused from None
        raise
    except BaseException:
        sock.close()
        raise
