"""Reading the cursor and lease headers of SUBSCRIBE, ACK and NACK frames."""

from __future__ import annotations

import pytest

from sluiceway.core.features.cursors import CursorRead, CursorStart
from sluiceway.core.features.leases import LeaseRead
from sluiceway.errors import BadRequest
from sluiceway.protocol.frames import Frame
from sluiceway.session.readers import is_position_ack, lease_name, read_request


def subscribe(**headers: str) -> Frame:
    fields = {"destination": "/topic/t", "id": "s"}
    fields.update({k.replace("_", "-"): v for k, v in headers.items()})
    return Frame("SUBSCRIBE", fields)


def test_a_cursor_read_with_its_defaults_and_with_everything() -> None:
    assert read_request(subscribe(browser="true", cursor="g")) == (CursorRead("g"), None)
    frame = subscribe(
        browser="true", cursor="g", cursor_start="earliest", from_sequence="0", to_sequence="9"
    )
    assert read_request(frame) == (CursorRead("g", CursorStart.EARLIEST, 0, 9), None)
    frame = subscribe(browser="TRUE", cursor="g.1", cursor_start="9223372036854775807")
    assert read_request(frame) == (CursorRead("g.1", 2**63 - 1), None)


def test_a_lease_read_with_its_sizes() -> None:
    frame = subscribe(lease="spark-1/0", lease_max_messages="10", lease_ttl="500")
    assert read_request(frame) == (None, LeaseRead("spark-1", 0, 10, None, 500))
    assert read_request(subscribe()) == (None, None)


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"cursor": "g"}, "browser:true"),
        ({"browser": "true", "cursor": ""}, "cursor"),
        ({"browser": "true", "cursor": "g", "cursor-start": "first"}, "cursor-start"),
        ({"browser": "true", "cursor": "g", "cursor-start": "-1"}, "cursor-start"),
        ({"browser": "true", "cursor": "g", "from-sequence": "9223372036854775808"}, "from"),
        ({"browser": "true", "cursor": "g", "lease": "g/1"}, "cursor and lease"),
        ({"lease": "g/"}, "lease"),
        ({"lease": "/1"}, "lease"),
        ({"lease": "g/\u0661"}, "lease"),  # ARABIC-INDIC DIGIT ONE: a digit, not a number
        ({"lease": "g/1", "lease-max-bytes": "0"}, "lease-max-bytes"),
        ({"lease": "g/1", "durable-subscription-name": "d"}, "durable-subscription-name"),
    ],
)
def test_malformed_headers_are_refused_naming_them(headers: dict[str, str], named: str) -> None:
    with pytest.raises(BadRequest) as refused:
        read_request(Frame("SUBSCRIBE", {"destination": "/topic/t", **headers}))
    assert refused.value.status == 400
    assert named in refused.value.summary


def test_acks_of_cursors_and_leases_are_told_from_message_acks() -> None:
    assert is_position_ack(Frame("ACK", {"id": "lease", "lease": "g/1"}))
    assert is_position_ack(Frame("ACK", {"id": "cursor", "cursor": "g"}))
    assert not is_position_ack(Frame("ACK", {"id": "1/sw-1"}))
    assert lease_name(Frame("NACK", {"lease": "a:b$c/42"})) == ("a:b$c", 42)
