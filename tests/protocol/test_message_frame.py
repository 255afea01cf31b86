"""The MESSAGE frame written in parts is, byte for byte, the frame `encode_frame` writes; what one
refuses, the other refuses too."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.errors import LocalProtocolError
from sluiceway.protocol.encoder import encode_frame, escape_value
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.protocol.message_frame import header_tail, message_head, plain_tail

# The characters the frame format escapes, drawn often, and a lone surrogate, which has no UTF-8
# form (a str from a producer's decoded header never holds one, but the encoder must not rely
# on it).
SPECIAL = st.sampled_from(["\\", ":", "\n", "\r", "c", "n", "\ud800"])
TEXT = st.text(alphabet=SPECIAL | st.characters(), max_size=10)
UTF8_TEXT = st.text(
    alphabet=st.sampled_from(["\\", ":", "\n", "\r"]) | st.characters(codec="utf-8")
)
NUMBER = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# The broker's own headers: a producer's header of one of these names is never in the tail.
BROKER_NAMES = frozenset(
    ("subscription", "message-id", "destination", "ack", "redelivered", "delivery-count",
     "priority", "persistent", "expires", "timestamp", "sequence", "content-length")
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Message:
    """What a MESSAGE says: the delivery's headers, the message's own, the producer's, a body."""

    subscription: str
    message_id: str
    ack: str | None
    delivery_count: int
    destination: str
    priority: int
    persistent: bool
    expires: int
    timestamp: int
    sequence: int
    extra: dict[str, str]
    body: bytes

    def own_headers(self) -> dict[str, str]:
        """The headers of the tail, in the order the broker writes them."""
        headers = {
            "destination": self.destination,
            "priority": str(self.priority),
            "persistent": "true" if self.persistent else "false",
            "expires": str(self.expires),
            "timestamp": str(self.timestamp),
            "sequence": str(self.sequence),
            **self.extra,
        }
        headers["content-length"] = str(len(self.body))
        return headers

    def frame(self) -> Frame:
        headers = {"subscription": self.subscription, "message-id": self.message_id}
        if self.ack is not None:
            headers["ack"] = self.ack
        headers["redelivered"] = "true" if self.delivery_count > 1 else "false"
        headers["delivery-count"] = str(self.delivery_count)
        return Frame("MESSAGE", headers | self.own_headers(), self.body)

    def tail(self) -> bytes | None:
        if self.extra:
            return header_tail(self.own_headers())
        return plain_tail(
            self.destination,
            self.priority,
            self.persistent,
            self.expires,
            self.timestamp,
            self.sequence,
            len(self.body),
        )

    def fast(self) -> bytes | None:
        """The frame in parts, as the session writes it; None where it refuses."""
        tail = self.tail()
        if tail is None:
            return None
        message_id = escape_value(self.message_id)
        ack = "" if self.ack is None else escape_value(self.ack)
        head = message_head(self.subscription, message_id, ack, self.delivery_count)
        return None if head is None else b"".join((head, tail, self.body, b"\0"))


@st.composite
def messages(draw: st.DrawFn) -> Message:
    extra = draw(
        st.dictionaries(TEXT.filter(lambda name: name not in BROKER_NAMES), TEXT, max_size=4)
    )
    return Message(
        subscription=draw(TEXT),
        message_id=draw(TEXT),
        ack=draw(st.none() | TEXT.filter(bool)),
        delivery_count=draw(st.integers(min_value=1, max_value=2**31)),
        # A destination's name is validated before any message reaches it: it is always UTF-8.
        destination=draw(UTF8_TEXT),
        priority=draw(st.integers(min_value=0, max_value=9)),
        persistent=draw(st.booleans()),
        expires=draw(NUMBER),
        timestamp=draw(NUMBER),
        sequence=draw(NUMBER),
        extra=extra,
        body=draw(st.binary(max_size=40)),
    )


@settings(max_examples=300, deadline=None)
@given(messages())
def test_the_frame_in_parts_is_the_frame_encode_frame_writes(message: Message) -> None:
    fast = message.fast()
    if fast is None:
        with pytest.raises(LocalProtocolError):
            encode_frame(message.frame(), StompVersion.V1_2)
    else:
        assert fast == encode_frame(message.frame(), StompVersion.V1_2)


def test_a_plain_message_in_parts() -> None:
    message = Message(
        subscription="s:1",
        message_id="m\n1",
        ack="3/m\\n1",
        delivery_count=2,
        destination="/queue/a",
        priority=4,
        persistent=True,
        expires=0,
        timestamp=17,
        sequence=5,
        extra={},
        body=b"hi",
    )
    assert message.fast() == (
        b"MESSAGE\nsubscription:s\\c1\nmessage-id:m\\n1\nack:3/m\\\\n1\nredelivered:true\n"
        b"delivery-count:2\ndestination:/queue/a\npriority:4\npersistent:true\nexpires:0\n"
        b"timestamp:17\nsequence:5\ncontent-length:2\n\nhi\0"
    )


def test_a_header_without_a_utf8_form_is_refused_by_both() -> None:
    assert header_tail({"x": "\ud800", "content-length": "0"}) is None
    assert message_head("\udfff", "m", "", 1) is None
