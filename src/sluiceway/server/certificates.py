"""The validity dates of X.509 certificates, read from their DER encoding.

The standard library's `ssl` loads certificates but tells their dates only for a peer's
certificate or through a private helper, and `cryptography` would be a large compiled dependency
for two fields; so this walks the DER structure of RFC 5280 down to them:

    Certificate  ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signatureValue }
    TBSCertificate ::= SEQUENCE {
        version         [0] EXPLICIT Version DEFAULT v1,
        serialNumber    INTEGER,
        signature       AlgorithmIdentifier (a SEQUENCE),
        issuer          Name (a SEQUENCE),
        validity        SEQUENCE { notBefore Time, notAfter Time },
        ... }
    Time ::= CHOICE { utcTime UTCTime, generalTime GeneralizedTime }

RFC 5280 (4.1.2.5) fixes both time forms to UTC with seconds: `YYMMDDHHMMSSZ` (a year of 50 or
more is 19YY, below 50 is 20YY) and `YYYYMMDDHHMMSSZ`. Anything else raises ValueError.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

_SEQUENCE: Final = 0x30
_INTEGER: Final = 0x02
_VERSION: Final = 0xA0  # [0] EXPLICIT, constructed
_UTC_TIME: Final = 0x17
_GENERALIZED_TIME: Final = 0x18
_PEM_BLOCK: Final = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*(.*?)\s*-----END CERTIFICATE-----", re.DOTALL
)


@dataclass(frozen=True, slots=True)
class Validity:
    """When a certificate may be used: from `not_before` to `not_after`, both in UTC."""

    not_before: datetime
    not_after: datetime


def pem_certificates(text: bytes) -> list[bytes]:
    """The DER bytes of every certificate in a PEM file, in the file's order."""
    found = []
    for match in _PEM_BLOCK.finditer(text):
        try:
            found.append(base64.b64decode(b"".join(match.group(1).split()), validate=True))
        except binascii.Error as exc:
            raise ValueError(f"a PEM certificate is not valid base64 ({exc})") from None
    return found


def validity(der: bytes) -> Validity:
    """The validity period of the DER-encoded certificate `der`."""
    _, start, end = _element(der, 0, _SEQUENCE)
    _, offset, _ = _element(der, start, _SEQUENCE, end)  # tbsCertificate
    tag, _, after = _element(der, offset, None, end)
    if tag == _VERSION:
        offset = after
        tag, _, after = _element(der, offset, None, end)
    if tag != _INTEGER:
        raise ValueError("no serial number where the certificate should have one")
    offset = after
    _, _, offset = _element(der, offset, _SEQUENCE, end)  # signature (AlgorithmIdentifier)
    _, _, offset = _element(der, offset, _SEQUENCE, end)  # issuer
    _, start, validity_end = _element(der, offset, _SEQUENCE, end)
    not_before, start = _time(der, start, validity_end)
    not_after, _ = _time(der, start, validity_end)
    return Validity(not_before, not_after)


def _element(
    der: bytes, offset: int, expected: int | None, limit: int | None = None
) -> tuple[int, int, int]:
    """The DER element at `offset`: (tag, where its content starts, where it ends)."""
    limit = len(der) if limit is None else limit
    if offset + 2 > limit:
        raise ValueError("the certificate ends early")
    tag, length = der[offset], der[offset + 1]
    if expected is not None and tag != expected:
        raise ValueError(f"tag 0x{tag:02x} where 0x{expected:02x} was expected")
    start = offset + 2
    if length & 0x80:  # long form: the next (length & 0x7f) bytes hold the length
        count = length & 0x7F
        if not 1 <= count <= 4 or start + count > limit:
            raise ValueError("a length the certificate cannot have")
        length = int.from_bytes(der[start : start + count], "big")
        start += count
    end = start + length
    if end > limit:
        raise ValueError("an element runs past the end of the certificate")
    return tag, start, end


def _time(der: bytes, offset: int, limit: int) -> tuple[datetime, int]:
    """The Time at `offset` and where the next element starts."""
    tag, start, end = _element(der, offset, None, limit)
    text = der[start:end].decode("ascii", "replace")
    form_ok = (tag == _UTC_TIME and len(text) == 13) or (
        tag == _GENERALIZED_TIME and len(text) == 15
    )
    if not form_ok or not text.endswith("Z") or not text[:-1].isdigit():
        raise ValueError(f"a validity time of an unknown form ({text!r})")
    if tag == _UTC_TIME:
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    moment = datetime.strptime(text[:-1], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    return moment, end


def format_utc(moment: datetime) -> str:
    """`2025-03-01 12:00:00 UTC`: how dates appear in the broker's messages."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
