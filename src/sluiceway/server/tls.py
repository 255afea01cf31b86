"""TLS for the services that ask for it: one server certificate and key, from the properties.

STOMP over TLS (`imq.stomp.tls.port`), STOMP over secure WebSocket (`imq.stomp.ws.tls`) and the
admin endpoint over HTTPS (`imq.admin.tls`) all serve `imq.tls.certfile` with the private key in
`imq.tls.keyfile` (or in the certfile when that is empty). Every way the files can be wrong is a
ConfigError naming the property to fix, raised before the broker binds anything.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.errors import ConfigError

CERTFILE: Final = "imq.tls.certfile"
KEYFILE: Final = "imq.tls.keyfile"
_PEM_CERTIFICATE: Final = "-----BEGIN CERTIFICATE-----"
_PEM_PRIVATE_KEY: Final = b"PRIVATE KEY-----"  # BEGIN PRIVATE KEY, RSA PRIVATE KEY, EC ...


def server_context(config: BrokerConfig) -> ssl.SSLContext:
    """A server-side SSL context with imq.tls.certfile and imq.tls.keyfile (TLS 1.2 or later)."""
    certfile, keyfile = config.tls_certfile, config.tls_keyfile
    if not certfile:
        raise ConfigError(
            CERTFILE,
            "a TLS service is on (imq.stomp.tls.port, imq.stomp.ws.tls or imq.admin.tls) but "
            "imq.tls.certfile is not set: give the PEM file of the broker's certificate",
        )
    cert_text = _read(CERTFILE, certfile, "certificate")
    _check_certificates(certfile, cert_text)
    key_property, key_path = (KEYFILE, keyfile) if keyfile else (CERTFILE, certfile)
    _check_key(key_property, key_path, _read(KEYFILE, keyfile, "key") if keyfile else cert_text)

    def no_passphrase() -> bytes:
        # Without this OpenSSL would prompt on the terminal, and a broker run as a service
        # would hang there.
        raise ConfigError(
            key_property,
            f"the private key in {key_property} {key_path!r} is encrypted, and the broker "
            "cannot ask for its passphrase: give it the key unencrypted (`openssl pkey -in "
            "encrypted.pem -out key.pem`), in a file only the broker's user can read",
        )

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile or None, password=no_passphrase)
    except ssl.SSLError as exc:  # (an OSError too, so caught first)
        if exc.reason == "KEY_VALUES_MISMATCH":
            problem = f"does not belong to the certificate in imq.tls.certfile {certfile!r}"
        else:
            problem = "is not a PEM private key OpenSSL can read"
        raise ConfigError(
            key_property,
            f"the private key in {key_property} {key_path!r} {problem} ({exc.reason or exc}): "
            "give the key the certificate was issued for, in PEM form",
        ) from None
    except OSError as exc:  # removed or made unreadable since it was read above
        raise ConfigError(key_property, f"cannot read the TLS files: {exc}") from None
    return context


def _read(name: str, path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            name,
            f"cannot read the TLS {what} {name}={path!r}: {exc.strerror or exc}; the file must "
            "exist and be readable by the broker's user",
        ) from None


def _check_certificates(certfile: str, text: bytes) -> None:
    """Parse the certificates alone, so a broken one is told apart from a broken key."""
    problem = ""
    if _PEM_CERTIFICATE.encode() not in text:
        problem = f"holds no PEM certificate (no {_PEM_CERTIFICATE} line)"
    else:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(
                cadata=text.decode("ascii", "replace")
            )
        except ssl.SSLError as exc:
            problem = f"holds a certificate OpenSSL cannot read ({exc.reason or exc})"
    if problem:
        raise ConfigError(
            CERTFILE,
            f"imq.tls.certfile {certfile!r} {problem}: give the broker's certificate in PEM "
            "form, followed by its intermediate certificates",
        )


def _check_key(key_property: str, key_path: str, text: bytes) -> None:
    if _PEM_PRIVATE_KEY not in text:
        raise ConfigError(
            key_property,
            f"{key_property} {key_path!r} holds no PEM private key: "
            + (
                "give the key the certificate was issued for, in PEM form"
                if key_property == KEYFILE
                else "name the file of the certificate's private key in imq.tls.keyfile"
            ),
        )
