"""Reading certificates' validity dates (server.certificates), and the date checks of
server.tls.server_context: certificates made by `cryptography` with chosen dates."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from sluiceway.config import build_config
from sluiceway.errors import ConfigError
from sluiceway.server import tls
from sluiceway.server.certificates import format_utc, pem_certificates, validity
from sluiceway.server.tls import server_context

KEY = ec.generate_private_key(ec.SECP256R1())  # one key signs every certificate made here
NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sluiceway test")])


def der_certificate(not_before: datetime, not_after: datetime, *, serial: int = 1) -> bytes:
    certificate = (
        x509.CertificateBuilder()
        .subject_name(NAME)
        .issuer_name(NAME)
        .public_key(KEY.public_key())
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(KEY, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.DER)


moments = st.datetimes(
    min_value=datetime(1950, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)
).map(lambda moment: moment.replace(microsecond=0, tzinfo=UTC))


@given(moments, moments, st.integers(min_value=1, max_value=2**159 - 1))
def test_the_dates_read_are_the_dates_written(
    not_before: datetime, not_after: datetime, serial: int
) -> None:
    # Before 2050 the dates are UTCTime (two-digit years), from 2050 GeneralizedTime.
    not_before, not_after = sorted((not_before, not_after))
    found = validity(der_certificate(not_before, not_after, serial=serial))
    assert (found.not_before, found.not_after) == (not_before, not_after)


def test_a_two_digit_year_of_50_or_more_is_in_the_1900s() -> None:
    found = validity(
        der_certificate(datetime(1950, 1, 1, tzinfo=UTC), datetime(2049, 12, 31, tzinfo=UTC))
    )
    assert found.not_before.year == 1950
    assert found.not_after.year == 2049


def test_every_truncation_is_a_value_error() -> None:
    der = der_certificate(datetime(2020, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC))
    for cut in range(len(der)):
        with pytest.raises(ValueError, match=r"ends early|runs past the end|a length"):
            validity(der[:cut])


@given(st.binary(max_size=400))
def test_garbage_is_a_value_error(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        validity(data)


@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=255))
def test_a_changed_byte_is_read_or_refused_never_a_crash(position: int, value: int) -> None:
    der = bytearray(
        der_certificate(datetime(2020, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC))
    )
    der[position % len(der)] = value
    with contextlib.suppress(ValueError):
        found = validity(bytes(der))
        assert found.not_before.tzinfo is UTC


def test_pem_files_give_every_certificate_in_order() -> None:
    ca = trustme.CA()
    child = ca.create_child_ca()
    issued = child.issue_cert("127.0.0.1", not_after=datetime(2040, 5, 6, 7, 8, 9, tzinfo=UTC))
    text = b"junk before\n" + b"".join(blob.bytes() for blob in issued.cert_chain_pems)
    found = [validity(der) for der in pem_certificates(text)]
    assert len(found) == 2  # the broker's, then the intermediate's
    assert found[0].not_after == datetime(2040, 5, 6, 7, 8, 9, tzinfo=UTC)
    with pytest.raises(ValueError, match="base64"):
        pem_certificates(b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n")


# -- server_context -------------------------------------------------------------------------------

NOW = datetime(2030, 6, 1, 12, 0, 0, tzinfo=UTC)


def files(
    tmp_path: Path, not_before: datetime, not_after: datetime, *, child: bool = False
) -> dict[str, str]:
    ca = trustme.CA()
    issuer = ca.create_child_ca() if child else ca
    issued = issuer.issue_cert("127.0.0.1", not_before=not_before, not_after=not_after)
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    certfile.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(keyfile))
    return {"imq.tls.certfile": str(certfile), "imq.tls.keyfile": str(keyfile)}


@pytest.mark.parametrize(
    ("not_before", "not_after", "says"),
    [
        (
            NOW - timedelta(days=400),
            NOW - timedelta(seconds=1),
            "expired on 2030-06-01 11:59:59 UTC",
        ),
        (
            NOW + timedelta(seconds=1),
            NOW + timedelta(days=400),
            "is not valid before 2030-06-01 12:00:01 UTC",
        ),
    ],
)
def test_a_certificate_outside_its_dates_is_refused(
    tmp_path: Path, not_before: datetime, not_after: datetime, says: str
) -> None:
    properties = files(tmp_path, not_before, not_after)
    with pytest.raises(ConfigError) as refused:
        server_context(build_config(properties), now=NOW)
    message = str(refused.value)
    assert refused.value.name == "imq.tls.certfile"
    assert properties["imq.tls.certfile"] in message
    assert says in message
    assert f"notBefore {format_utc(not_before)}, notAfter {format_utc(not_after)}" in message
    assert "now 2030-06-01 12:00:00 UTC" in message


def test_the_edges_of_the_period_are_valid(tmp_path: Path) -> None:
    properties = files(tmp_path, NOW - timedelta(days=400), NOW + timedelta(days=400))
    config = build_config(properties)
    server_context(config, now=NOW - timedelta(days=400))
    server_context(config, now=NOW + timedelta(days=400))


def test_an_expired_intermediate_is_refused(tmp_path: Path) -> None:
    # trustme's CAs are valid until 3000-01-01; the broker's certificate here lasts longer.
    properties = files(tmp_path, NOW, datetime(3001, 1, 1, tzinfo=UTC), child=True)
    server_context(build_config(properties), now=NOW)
    with pytest.raises(ConfigError) as refused:
        server_context(build_config(properties), now=datetime(3000, 6, 1, tzinfo=UTC))
    assert "certificate 2 (of the chain)" in str(refused.value)
    assert "expired on 3000-01-01 00:00:00 UTC" in str(refused.value)


@pytest.mark.parametrize(("days_left", "warned"), [(29, True), (1, True), (31, False)])
def test_a_certificate_that_expires_soon_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, days_left: int, warned: bool
) -> None:
    not_after = NOW + timedelta(days=days_left)
    properties = files(tmp_path, NOW - timedelta(days=300), not_after)
    with caplog.at_level(logging.WARNING, logger="sluiceway.server.tls"):
        server_context(build_config(properties), now=NOW)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not warned:
        assert warnings == []
        return
    (warning,) = warnings
    assert properties["imq.tls.certfile"] in warning
    assert f"expires on {format_utc(not_after)}, in {days_left} days" in warning


def test_dates_that_cannot_be_read_are_logged_and_not_checked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(der: bytes) -> None:
        raise ValueError("a validity time of an unknown form ('x')")

    monkeypatch.setattr(tls, "validity", unreadable)
    properties = files(tmp_path, NOW - timedelta(days=10), NOW + timedelta(days=400))
    with caplog.at_level(logging.WARNING, logger="sluiceway.server.tls"):
        server_context(build_config(properties), now=NOW)
    assert "cannot read the validity dates" in caplog.text
    assert properties["imq.tls.certfile"] in caplog.text


def test_a_key_of_another_certificate_names_both_files(tmp_path: Path) -> None:
    properties = files(tmp_path, NOW - timedelta(days=1), NOW + timedelta(days=400))
    other = tmp_path / "other.key"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other))
    with pytest.raises(ConfigError) as refused:
        server_context(build_config({**properties, "imq.tls.keyfile": str(other)}), now=NOW)
    assert refused.value.name == "imq.tls.keyfile"
    assert str(other) in str(refused.value)
    assert properties["imq.tls.certfile"] in str(refused.value)
