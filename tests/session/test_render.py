"""The frames the broker writes, against the general encoder they must agree with."""

from __future__ import annotations

import pytest

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.model.subscription import AckMode
from sluiceway.errors import LocalProtocolError
from sluiceway.naming import parse_destination
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.session.render import _message_frame, message_parts, receipt_frame
from sluiceway.testing import FakeClock
from tests.core.helpers import Client


@pytest.mark.parametrize("version", [None, *StompVersion])
@pytest.mark.parametrize("receipt", ["7", "a:b", "back\\slash", "line\nfeed", "é"])
def test_a_receipt_is_encoded_as_the_general_encoder_would(
    version: StompVersion | None, receipt: str
) -> None:
    frame = Frame("RECEIPT", {"receipt-id": receipt})
    try:
        expected = encode_frame(frame, version)
    except LocalProtocolError:
        with pytest.raises(LocalProtocolError):
            receipt_frame(receipt, version)
        return
    assert receipt_frame(receipt, version) == expected


def test_a_receipt_id_with_no_utf_8_form_is_refused_by_name() -> None:
    with pytest.raises(LocalProtocolError, match="receipt-id"):
        receipt_frame("\udc80", StompVersion.V1_2)


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/queue/plain", ()),
        ("/queue/with:colon", ()),
        ("/topic/t", ()),
        ("/queue/q", (("content-type", "text/plain"), ("x", "a:b\\c"), ("priority", "9"))),
    ],
)
def test_a_message_reads_as_the_general_encoding_would(
    path: str, headers: tuple[tuple[str, str], ...]
) -> None:
    broker = Broker(BrokerConfig(), clock=FakeClock())
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe(path, ack=AckMode.CLIENT)
    producer.connection.send(
        parse_destination(path), b"\0body", headers, priority=7, expires=0, persistent=True
    )
    (delivery,) = consumer.take()
    parts: list[bytes] = []
    size = message_parts(delivery, StompVersion.V1_2, parts)
    assert size == sum(map(len, parts))
    fast = decode(b"".join(parts))
    general = decode(_message_frame(delivery, StompVersion.V1_2))
    assert fast.command == general.command == "MESSAGE"
    assert fast.headers == general.headers
    assert fast.body == general.body == b"\0body"
    assert fast.headers["destination"] == path


def decode(data: bytes) -> Frame:
    decoder = FrameDecoder(version=StompVersion.V1_2)
    decoder.receive_data(data)
    event = decoder.next_event()
    assert isinstance(event, Frame)
    return event
