"""TLS for the services that ask for it: one server certificate and key, from the properties."""

from __future__ import annotations

import ssl

from sluiceway.config import BrokerConfig
from sluiceway.errors import ConfigError


def server_context(config: BrokerConfig) -> ssl.SSLContext:
    """A server-side SSL context with imq.tls.certfile and imq.tls.keyfile (TLS 1.2 or later)."""
    if not config.tls_certfile:
        raise ConfigError(
            "imq.tls.certfile",
            "a TLS service is on (imq.stomp.tls.port, imq.stomp.ws.tls or imq.admin.tls) but "
            "imq.tls.certfile is not set: give the PEM file of the broker's certificate",
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_certfile, config.tls_keyfile or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            "imq.tls.certfile",
            f"cannot load the TLS certificate {config.tls_certfile!r} "
            f"(key {config.tls_keyfile or 'in the same file'!r}): {exc}",
        ) from None
    return context
