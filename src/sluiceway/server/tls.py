"""TLS for the services that ask for it: one server certificate and key, from the properties.

STOMP over TLS (`imq.stomp.tls.port`), STOMP over secure WebSocket (`imq.stomp.ws.tls`) and the
admin endpoint over HTTPS (`imq.admin.tls`) all serve `imq.tls.certfile` with the private key in
`imq.tls.keyfile` (or in the certfile when that is empty). Every way the files can be wrong is a
ConfigError naming the property to fix, raised before the broker binds anything: among them a
certificate of the file (the broker's own or an intermediate) that has expired or is not valid
yet, since clients would refuse every handshake. One that expires within `EXPIRY_WARNING` is
logged as a warning: the broker reads the files at start only, so it must be renewed and the
broker restarted before then.
"""

from __future__ import annotations

import logging
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.errors import ConfigError
from sluiceway.server.certificates import format_utc, pem_certificates, validity

log = logging.getLogger(__name__)

CERTFILE: Final = "imq.tls.certfile"
KEYFILE: Final = "imq.tls.keyfile"
EXPIRY_WARNING: Final = timedelta(days=30)
_PEM_CERTIFICATE: Final = "-----BEGIN CERTIFICATE-----"
_PEM_PRIVATE_KEY: Final = b"PRIVATE KEY-----"  # BEGIN PRIVATE KEY, RSA PRIVATE KEY, EC ...


def needs_tls(config: BrokerConfig) -> bool:
    """Whether a service that is on serves TLS."""
    return (
        config.stomp_tls_port >= 0
        or (config.ws_port >= 0 and config.ws_tls)
        or (config.admin_port >= 0 and config.admin_tls)
    )


def server_context(config: BrokerConfig, now: datetime | None = None) -> ssl.SSLContext:
    """A server-side SSL context with imq.tls.certfile and imq.tls.keyfile (TLS 1.2 or later).

    `now` (default: the current time) is when the certificates must be valid.
    """
    certfile, keyfile = config.tls_certfile, config.tls_keyfile
    if not certfile:
        raise ConfigError(
            CERTFILE,
            "a TLS service is on (imq.stomp.tls.port, imq.stomp.ws.tls or imq.admin.tls) but "
            "imq.tls.certfile is not set: give the PEM file of the broker's certificate",
        )
    cert_text = _read(CERTFILE, certfile, "certificate")
    _check_certificates(certfile, cert_text)
    _check_dates(certfile, cert_text, datetime.now(UTC) if now is None else now)
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
            problem = (
                f"does not belong to the certificate in imq.tls.certfile {certfile!r}: the two "
                "files do not match"
            )
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


def _check_dates(certfile: str, text: bytes, now: datetime) -> None:
    """Refuse a certificate outside its validity period; warn of one that ends soon."""
    try:
        periods = [validity(der) for der in pem_certificates(text)]
    except ValueError as exc:  # OpenSSL read it: a form this reader does not know
        log.warning(
            "cannot read the validity dates in %s %r (%s); not checked", CERTFILE, certfile, exc
        )
        return
    for index, period in enumerate(periods):
        which = "the certificate" if index == 0 else f"certificate {index + 1} (of the chain)"
        if period.not_before <= now <= period.not_after:
            if period.not_after - now < EXPIRY_WARNING:
                log.warning(
                    "%s in %s %r expires on %s, in %d days: renew it and restart the broker "
                    "before then (clients refuse an expired certificate)",
                    which,
                    CERTFILE,
                    certfile,
                    format_utc(period.not_after),
                    (period.not_after - now).days,
                )
            continue
        if now > period.not_after:
            problem, hint = f"expired on {format_utc(period.not_after)}", "renew it"
        else:
            problem = f"is not valid before {format_utc(period.not_before)}"
            hint = "is the machine's clock right?"
        raise ConfigError(
            CERTFILE,
            f"{which} in imq.tls.certfile {certfile!r} {problem} (notBefore "
            f"{format_utc(period.not_before)}, notAfter {format_utc(period.not_after)}; now "
            f"{format_utc(now)}): clients would refuse it; give a certificate valid now ({hint})",
        )
