"""Probes of the hardening table (tests/security/test_hardening.py): listeners and TLS: the plain
port off, certificates checked at start.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sluiceway.errors import ConfigError
from tests.security import webprobe
from tests.security.conftest import USERS
from tests.security.hardening import Trial

# The imports of the listener, browser and admin-connection rows.


def _dates(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _refused_start(trial: Trial, **properties: str) -> ConfigError:
    try:
        trial.start(**properties)
    except ConfigError as exc:
        return exc
    raise AssertionError("the broker started")


def probe_tls_only(trial: Trial) -> object:
    """Plain port off, TLS on: the ready line lists what listens, and only that listens."""
    certificate = webprobe.make_certificate(trial.directory)
    secured = trial.start(**{"imq.stomp.tls.port": "0", **certificate.properties()})
    services = secured.broker.services
    assert services is not None
    ready = secured.broker.call(services.ready_line)
    listed = {int(part.rsplit(":", 1)[1]) for part in ready.split(", ")}
    client = webprobe.tls_client(services.addresses()["stomp-tls"][1], certificate.client_context())
    try:
        alice = USERS["alice"][0]
        connected = client.connect(login="alice", passcode=alice).command
    finally:
        client.close()
    labels = tuple(part.split(" on ")[0] for part in ready.split(", "))
    return labels, listed == webprobe.listening_ports(), connected


def probe_no_listener(trial: Trial) -> object:
    refused = _refused_start(trial)
    named = all(n in str(refused) for n in ("tcp.port", "tls.port", "ws.port"))
    return refused.name, named


def _certificate_refused(trial: Trial, not_before: datetime, not_after: datetime) -> object:
    certificate = webprobe.make_certificate(
        trial.directory, not_before=not_before, not_after=not_after
    )
    refused = _refused_start(trial, **{"imq.stomp.tls.port": "0", **certificate.properties()})
    message = str(refused)
    return (
        refused.name,
        str(certificate.certfile) in message,
        f"notBefore {_dates(not_before)}" in message,
        f"notAfter {_dates(not_after)}" in message,
    )


def probe_expired_certificate(trial: Trial) -> object:
    return _certificate_refused(
        trial, datetime(2020, 1, 1, tzinfo=UTC), datetime(2021, 1, 1, tzinfo=UTC)
    )


def probe_future_certificate(trial: Trial) -> object:
    now = datetime.now(UTC).replace(microsecond=0)
    return _certificate_refused(trial, now + timedelta(days=10), now + timedelta(days=400))


def probe_mismatched_key(trial: Trial) -> object:
    certificate = webprobe.make_certificate(trial.directory)
    other = webprobe.make_certificate(trial.directory, "other")
    properties = {**certificate.properties(), "imq.tls.keyfile": str(other.keyfile)}
    refused = _refused_start(trial, **{"imq.stomp.tls.port": "0", **properties})
    message = str(refused)
    return refused.name, str(certificate.certfile) in message, str(other.keyfile) in message


def probe_certificate_expiring_soon(trial: Trial) -> object:
    now = datetime.now(UTC).replace(microsecond=0)
    certificate = webprobe.make_certificate(trial.directory, not_after=now + timedelta(days=10))
    with webprobe.capture("sluiceway.server.tls") as records:
        secured = trial.start(**{"imq.stomp.tls.port": "0", **certificate.properties()})
    warning = records.text()
    return (
        secured.broker.services is not None,
        str(certificate.certfile) in warning,
        _dates(certificate.not_after) in warning,
    )
